"""A remote store that cannot be reached is one line naming its endpoint, within a bounded time,
for inputs, model directories and outputs alike; hdfs:// without Hadoop is one line too."""
import os
import socket
import sys
import time

import pytest

from common import storage
from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _closed_port() -> int:
    """A loopback port nothing listens on (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def unreachable(monkeypatch):
    port = _closed_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("PARAGEN_STORAGE_TIMEOUT", "2")
    monkeypatch.setenv("PARAGEN_STORAGE_RETRY_SECONDS", "3")     # a store that is down is retried this long
    return f"127.0.0.1:{port}"


@pytest.mark.parametrize("url", ["s3://bucket/corpus/", "gs://bucket/corpus/"])
def test_an_unreachable_store_is_one_line_naming_it_within_the_timeout(unreachable, url):
    from common.shards import discover_shards

    start = time.monotonic()
    with pytest.raises(storage.StorageError) as info:
        discover_shards([url], "cs", "en")
    message = str(info.value)
    assert unreachable in message and "\n" not in message and "PARAGEN_STORAGE_TIMEOUT" in message
    assert "retried for 3s (PARAGEN_STORAGE_RETRY_SECONDS)" in message
    # pyarrow's default for GCS retries for about 15 minutes; two seconds were asked for (a bound
    # a hundred times what it takes, far below what it would take: not one load could break)
    assert time.monotonic() - start < 300


def _one_line_from_the_job(unreachable, tmp_path, where, model):
    inp = tmp_path / "in.tsv"
    inp.write_text("ahoj\thello\n")
    args = {"--input": str(inp), "--output": str(tmp_path / "out"), "--forward_model": model}
    args[where] = "s3://bucket/x"
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = warm_python.run([sys.executable, "-m", "beam_pipelines.generate",
                            *[x for kv in args.items() for x in kv]], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stderr.strip().splitlines() if " WARNING " not in line]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: s3://bucket/x") and unreachable in lines[0]
    assert not (tmp_path / "out").exists()


def test_the_generation_job_says_so_in_one_line_for_a_model(unreachable, tmp_path):
    _one_line_from_the_job(unreachable, tmp_path, "--forward_model", None)


@pytest.mark.slow
def test_the_generation_job_says_so_in_one_line_for_an_input(unreachable, tmp_path, tiny_nmt_models):
    _one_line_from_the_job(unreachable, tmp_path, "--input", os.path.join(tiny_nmt_models, "cs-en"))


def test_hdfs_without_hadoop_is_one_line(monkeypatch):
    for name in ("HADOOP_HOME", "ARROW_LIBHDFS_DIR", "JAVA_HOME"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(storage.StorageError, match="hdfs:// needs Hadoop's libhdfs and Java"):
        storage.isdir("hdfs://namenode:8020/corpus")


def test_the_timeout_must_be_a_number_of_seconds(monkeypatch):
    for bad in ("soon", "0", "-5"):
        monkeypatch.setenv("PARAGEN_STORAGE_TIMEOUT", bad)
        with pytest.raises(storage.StorageError, match="PARAGEN_STORAGE_TIMEOUT"):
            storage.timeout_seconds()
    monkeypatch.setenv("PARAGEN_STORAGE_TIMEOUT", "7.5")
    assert storage.timeout_seconds() == 7.5


def test_a_store_never_reached_is_one_line_within_the_timeout_before_anything_is_written(tmp_path):
    """--output in a bucket whose endpoint nobody listens on (no network, a wrong endpoint): exit 2
    within the timeout, not after the whole retry budget (it used to retry for 300 s)."""
    with socket.socket() as s:                      # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}",
           "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true", "PARAGEN_STORAGE_TIMEOUT": "3", "PARAGEN_STORAGE_RETRY_SECONDS": "3600",
           "PYTHONPATH": ROOT}
    start = time.monotonic()
    bitext = tmp_path / "in.tsv"
    bitext.write_text("ahoj\thello\n")
    done = warm_python.run([sys.executable, "-m", "beam_pipelines.generate", "--input", str(bitext),
                            "--output", "s3://no-such-bucket/corpus", "--forward_model", str(tmp_path / "m")], cwd=ROOT,
                           capture_output=True, text=True, timeout=900, env=env)
    seconds = time.monotonic() - start
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and "never answered" in errors[0], done.stderr[-2000:]
    # given up at first contact, not after the hour's retry budget: far apart, whatever the load
    assert seconds < 600, seconds
