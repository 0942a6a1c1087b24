"""common/storage.py against a local directory and real S3 (moto) and GCS (fake-gcs-server)
servers on loopback: the same calls, the same answers."""
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common import storage
from tests.object_stores import gcs_store, s3_store  # noqa: F401  (fixtures)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.slow), pytest.param("gcs", marks=pytest.mark.slow)])
def root(request, tmp_path, monkeypatch):
    """A fresh directory or bucket, with the environment a worker would have to reach it."""
    monkeypatch.setenv("PARAGEN_CACHE", str(tmp_path / "cache"))
    if request.param == "local":
        return str(tmp_path / "root")
    store = request.getfixturevalue(f"{request.param}_store")
    for k, v in store.env.items():
        monkeypatch.setenv(k, v)
    return f"{'s3' if request.param == 's3' else 'gs'}://{store.make_bucket()}/run"


def test_write_read_list_delete(root):
    storage.write_bytes(storage.join(root, "a", "x.txt"), b"one")
    storage.write_json(storage.join(root, "a", "b", "y.json"), {"k": 1})
    storage.write_bytes(storage.join(root, "_z.txt"), b"zz")
    assert storage.read_bytes(storage.join(root, "a", "x.txt")) == b"one"
    assert storage.read_json(storage.join(root, "a", "b", "y.json")) == {"k": 1}
    assert storage.isdir(storage.join(root, "a")) and storage.isfile(storage.join(root, "a", "x.txt"))
    assert not storage.exists(storage.join(root, "nope"))
    assert storage.listdir(root) == ["_z.txt", "a"]                 # prefixes count as directories
    assert storage.listdir(storage.join(root, "a")) == ["b", "x.txt"]
    assert sorted(storage.basename(p) for p in storage.list_files(root)) == ["_z.txt", "x.txt", "y.json"]
    assert storage.glob(storage.join(root, "a", "*.txt")) == [storage.join(root, "a", "x.txt")]
    assert storage.size(storage.join(root, "_z.txt")) == 2
    storage.write_bytes(storage.join(root, "a", "x.txt"), b"two")   # overwrite: whole
    assert storage.read_bytes(storage.join(root, "a", "x.txt")) == b"two"
    storage.delete(storage.join(root, "a", "x.txt"))
    storage.delete(storage.join(root, "a", "x.txt"))                 # already gone: no error
    storage.delete_tree(storage.join(root, "a"))
    storage.delete_tree(storage.join(root, "a"))
    assert [storage.basename(p) for p in storage.list_files(root)] == ["_z.txt"]


def test_a_failed_write_leaves_the_old_file(root):
    path = storage.join(root, "f.bin")
    storage.write_bytes(path, b"old")
    with pytest.raises(RuntimeError):
        with storage.open_output(path) as f:
            f.write(b"half of the new")
            raise RuntimeError("the writer dies")
    assert storage.read_bytes(path) == b"old"
    assert [storage.basename(p) for p in storage.list_files(root)] == ["f.bin"]


def test_parquet_and_local_copies(root):
    paths = []
    for i in range(3):
        path = storage.join(root, "t", f"part-{i}.parquet")
        with storage.open_output(path) as f:
            pq.write_table(pa.table({"x": [i, i + 10]}), f)
        paths.append(path)
    assert sorted(storage.parquet_dataset(paths).to_table().column("x").to_pylist()) == [0, 1, 2, 10, 11, 12]
    assert storage.parquet_file(paths[1]).metadata.num_rows == 2
    copy = storage.local_copy(storage.join(root, "t"))
    names = ["part-0.parquet", "part-1.parquet", "part-2.parquet"]
    if storage.is_url(root):                        # a URL is copied once into the cache
        assert sorted(os.listdir(copy)) == [".complete", *names]
        assert storage.local_copy(storage.join(root, "t")) == copy
        one = storage.local_copy(paths[0])
        assert open(one, "rb").read() == storage.read_bytes(paths[0])
    else:                                           # a local path is used where it is
        assert copy == storage.join(root, "t") and sorted(os.listdir(copy)) == names


def test_a_worker_process_reaches_the_store_through_its_environment(root):
    storage.write_bytes(storage.join(root, "hello.txt"), b"hi")
    code = ("import sys; from common import storage; "
            "storage.write_bytes(sys.argv[1] + '/back.txt', storage.read_bytes(sys.argv[1] + '/hello.txt') * 2)")
    done = subprocess.run([sys.executable, "-c", code, root], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr[-2000:]
    assert storage.read_bytes(storage.join(root, "back.txt")) == b"hihi"


def test_shards_and_compressed_input_from_a_bucket(root):
    import gzip

    import zstandard

    from common.shards import discover_shards, estimate_records, read_shard

    lines = "".join(f"Muž {i} .\tA man {i} .\n" for i in range(50)).encode()
    storage.write_bytes(storage.join(root, "in", "a.tsv.gz"), gzip.compress(lines))
    storage.write_bytes(storage.join(root, "in", "b.tsv.zst"), zstandard.ZstdCompressor().compress(lines))
    storage.write_bytes(storage.join(root, "in", "c.cs"), b"jedna\ndva\n")
    storage.write_bytes(storage.join(root, "in", "c.en"), b"one\ntwo\n")
    shards = discover_shards([storage.join(root, "in")], "cs", "en")
    assert [(s.format, s.name) for s in shards] == [("tsv", "a.tsv.gz"), ("tsv", "b.tsv.zst"), ("moses", "c")]
    assert [sum(1 for _ in read_shard(s)) for s in shards] == [50, 50, 2]
    assert estimate_records(shards) == ({"a.tsv.gz": 50, "b.tsv.zst": 50, "c": 2}, True)
    assert [s.name for s in discover_shards([storage.join(root, "in", "*.tsv.*")], "cs", "en")] == \
        ["a.tsv.gz", "b.tsv.zst"]


@pytest.mark.parametrize("name, value, ok", [
    ("PARAGEN_STORAGE_TIMEOUT", "5", True), ("PARAGEN_STORAGE_TIMEOUT", "0", False),
    ("PARAGEN_STORAGE_RETRY_SECONDS", "0", True), ("PARAGEN_STORAGE_RETRY_SECONDS", "-1", False),
    ("PARAGEN_FIRST_CONTACT_SECONDS", "inf", False), ("PARAGEN_FIRST_CONTACT_SECONDS", "ten", False),
    ("PARAGEN_LEASE_SECONDS", "1", False), ("PARAGEN_LEASE_SECONDS", "30", True),
    ("PARAGEN_SLURM_CHECK_SECONDS", "nan", False), ("PARAGEN_SLURM_CHECK_SECONDS", "60", True),
])
def test_seconds_settings_refuse_bad_values_in_one_line(monkeypatch, name, value, ok):
    from beam_pipelines.slurm import check_seconds
    from common.storage.retries import first_contact_seconds, retry_seconds, timeout_seconds
    from paracorpus.commit import lease_seconds
    read = {"PARAGEN_STORAGE_TIMEOUT": timeout_seconds, "PARAGEN_STORAGE_RETRY_SECONDS": retry_seconds,
            "PARAGEN_FIRST_CONTACT_SECONDS": first_contact_seconds, "PARAGEN_LEASE_SECONDS": lease_seconds,
            "PARAGEN_SLURM_CHECK_SECONDS": check_seconds}[name]
    monkeypatch.setenv(name, value)
    if ok:
        assert read() == float(value)
    else:
        with pytest.raises(ValueError if name in ("PARAGEN_LEASE_SECONDS", "PARAGEN_SLURM_CHECK_SECONDS")
                           else OSError, match=name):
            read()


def test_a_write_whose_claim_is_gone_once_written_is_taken_back(tmp_path):
    """A writer paused between its fence's first look and its rename (another thread's stop
    freezes it there) looks again once the file is in place: its claim gone, it removes the file
    and fails, so nothing of it outlives the run that took over."""
    from common.cli import OutputBusy

    looks = []

    def claim_check():                   # what paracorpus.commit.Claim.check_if_due does
        looks.append(1)
        if len(looks) > 1:
            raise OutputBusy("this run lost its claim")
    storage.fence_writes(str(tmp_path), claim_check)
    try:
        with pytest.raises(OutputBusy):
            storage.write_bytes(str(tmp_path / "_work" / "read" / "a.tsv.json"), b"{}")
        assert looks == [1, 1] and not (tmp_path / "_work" / "read" / "a.tsv.json").exists()
    finally:
        storage.unfence_writes(str(tmp_path))
    storage.write_bytes(str(tmp_path / "b.json"), b"{}")     # unfenced again


def test_a_process_that_ends_itself_leaves_no_temporary_another_thread_was_placing(tmp_path):
    """A job that ends itself from one thread (its claim found lost by the heartbeat) while another
    thread has written a create's hidden temporary and not yet linked it into place: the
    temporary goes with the process (seen under load: a paused run's manifest version, resumed,
    left `_log/.<n>-_manifest.json.<hex>.tmp` when its heartbeat ended it first)."""
    code = f"""
import os, sys, threading, time
from common.stopping import Stopping
from common.storage import writing

placing = threading.Event()

def slow_link(tmp, dst):          # the link a loaded machine has not run yet
    placing.set()
    time.sleep(60)

def create():
    with writing._staged({str(tmp_path / 'v1')!r}, slow_link) as f:
        f.write(b"a version")

with Stopping("the test job") as stopping:
    threading.Thread(target=create, daemon=True).start()
    assert placing.wait(30)
    assert [n.startswith(".") for n in os.listdir({str(tmp_path)!r})] == [True]     # the hidden temporary, written
    stopping.end("lost its claim", 75)
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 75, done.stderr[-2000:]
    assert "error: lost its claim" in done.stderr
    assert os.listdir(tmp_path) == []


def test_a_webhdfs_listing_lists_a_directory_made_while_pyarrow_looked(tmp_path):
    """pyarrow's handler of fsspec filesystems asks isdir, then exists: a directory another
    writer makes between the two was "not a directory" (NotADirectoryError: a claim on HDFS failed
    so under load, 2026-12-04). Here the directory is made at that very instant, by a local fsspec
    filesystem whose isdir makes it after answering, under webhdfs.Handler and pyarrow's own."""
    import fsspec.implementations.local
    import pyarrow.fs as pafs

    from common.storage.webhdfs import Handler

    target = tmp_path / "log"
    selector = pafs.FileSelector(str(target), recursive=True, allow_not_found=True)

    class MadeWhileAsked(fsspec.implementations.local.LocalFileSystem):
        def isdir(self, path):
            answer = super().isdir(path)
            if path.rstrip("/") == str(target) and not target.exists():
                target.mkdir()                                  # the other writer, just then
                (target / "1").write_text("x")
            return answer

    def fs(handler):
        return pafs.PyFileSystem(handler(MadeWhileAsked(skip_instance_cache=True)))

    with pytest.raises(NotADirectoryError):                 # pyarrow's handler: the race
        fs(pafs.FSSpecHandler).get_file_info(selector)
    (target / "1").unlink()
    target.rmdir()
    assert [i.base_name for i in fs(Handler).get_file_info(selector)] == ["1"]
    target.rename(tmp_path / "elsewhere")
    (tmp_path / "log").write_text("a file")                   # a file stays not a directory
    with pytest.raises(NotADirectoryError):
        fs(Handler).get_file_info(selector)
