"""A bucket that goes away while a job commits (after hours of decoding, on a cluster) is not a
usage mistake: each job (generation, filter, refresh) ends in one line naming the store with exit
status 1, which a Kubernetes Job retries (2 would fail it at once), and the same command, once the
store is back, publishes. The job is paused (SIGSTOP, by the crash-point hook) just before it
writes its manifest (the refresh: latest.json), the store (moto behind a proxy) is taken away,
and the job is let go."""
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from common import storage
from tests.fault_proxy import FaultProxy
from tests.jobs import refresh_job_args
from tests.object_stores import s3_store  # noqa: F401: a fixture
from tests.toydata import toy_bitext
from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILTER = "filters:\n  - name: ngram_overlap\n    thresholds: {trigram_overlap: {max: 0.9}}\n"
PAUSE_AT = {"generate": "~_manifest.json", "filter": "~_filter_manifest.json", "refresh": "~latest.json"}


def _command(job: str, bucket: str) -> list[str]:
    models = f"{bucket}/models"
    if job == "generate":
        return ["beam_pipelines.generate", "--input", f"{bucket}/in/a.tsv", "--output", f"{bucket}/gen",
                *refresh_job_args(models)]
    if job == "filter":
        return ["beam_pipelines.filter", "--input", f"{bucket}/gen", "--output", f"{bucket}/filtered",
                "--config", f"{bucket}/filter.yaml"]
    return ["beam_pipelines.refresh", "--root", f"{bucket}/corpus", "--", "--input", f"{bucket}/in",
            *refresh_job_args(models)]


def _run(command: list[str], env: dict) -> subprocess.Popen:
    return warm_python.popen([sys.executable, "-m", *command], cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT, **env},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _paused(proc: subprocess.Popen) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"the job ended (exit {proc.returncode}) before its commit: "
                             f"{proc.communicate()[1].decode(errors='replace')[-3000:]}")
    return psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED


@pytest.fixture(scope="module")
def bucket(s3_store, tiny_nmt_models):  # noqa: F811
    """A bucket with the input, the models, the filter's config and a generation run to filter."""
    bucket = f"s3://{s3_store.make_bucket()}"
    saved = dict(os.environ)
    os.environ.update(s3_store.env)
    try:
        for name in ("cs-en", "en-cs"):
            for f in os.listdir(os.path.join(tiny_nmt_models, name)):
                storage.copy_file(os.path.join(tiny_nmt_models, name, f), f"{bucket}/models/{name}/{f}")
        storage.write_bytes(f"{bucket}/in/a.tsv",
                            "".join(f"{s}\t{t}\n" for s, t in toy_bitext(400, seed=51)[:8]).encode())
        storage.write_bytes(f"{bucket}/filter.yaml", FILTER.encode())
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return bucket


@pytest.mark.slow
@pytest.mark.parametrize("job", ["generate", "filter", "refresh"])
def test_a_store_away_at_the_commit_is_exit_1_in_one_line_and_the_same_command_publishes(
        job, bucket, s3_store, tmp_path, monkeypatch):  # noqa: F811
    command = _command(job, bucket)
    with FaultProxy(s3_store.endpoint) as proxy:
        env = {**s3_store.env, "AWS_ENDPOINT_URL": proxy.url, "AWS_ENDPOINT_URL_S3": proxy.url,
               "PARAGEN_CACHE": str(tmp_path / "cache"), "PARAGEN_STORAGE_RETRY_SECONDS": "4",
               "PARAGEN_STORAGE_TIMEOUT": "3"}
        if job == "filter":             # the run it filters, published while the store is there
            assert warm_python.run([sys.executable, "-m", *_command("generate", bucket)], cwd=ROOT,
                                   env={**os.environ, **env}, capture_output=True).returncode == 0
        proc = _run(command, {**env, "PARAGEN_CRASH_AT": f"{PAUSE_AT[job]}:STOP"})
        try:
            deadline = time.monotonic() + 600
            while not _paused(proc):
                assert time.monotonic() < deadline, "the job never reached its commit"
                time.sleep(0.2)
            proxy.down(3600)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        _out, err = proc.communicate(timeout=600)
        err = err.decode(errors="replace")
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert proc.returncode == 1 and len(errors) == 1, err[-3000:]
        assert proxy.url.split("//")[1] in errors[0] and "Traceback" not in err, err[-3000:]

        proxy.down(0)                                       # the store is back: the same command
        again = warm_python.run([sys.executable, "-m", *command], cwd=ROOT, env={**os.environ, **env},
                                capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    for name, value in s3_store.env.items():
        monkeypatch.setenv(name, value)
    manifest = {"generate": "gen/_manifest.json", "filter": "filtered/_filter_manifest.json",
                "refresh": "corpus/latest.json"}[job]
    assert storage.isfile(f"{bucket}/{manifest}")
