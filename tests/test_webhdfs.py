"""The storage layer on a real HDFS (tests/hdfs_cluster.py: Hadoop's MiniDFSCluster) through
webhdfs:// URLs, as a user writes them in --input and --output: whole files, listings, Parquet,
the claim of an output, and a NameNode that does not answer (an error, never "not found")."""
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common import storage
from paracorpus.commit import Claim, OutputBusy
from tests.hdfs_cluster import hdfs_store  # noqa: F401: fixture


@pytest.fixture
def folder(hdfs_store):  # noqa: F811
    return f"webhdfs://{hdfs_store.make_bucket()}"


def test_files_listings_and_parquet_on_hdfs(folder):
    storage.write_bytes(storage.join(folder, "a", "b.txt"), b"first")
    storage.write_bytes(storage.join(folder, "a", "b.txt"), b"second")          # replaced whole
    assert storage.read_bytes(storage.join(folder, "a", "b.txt")) == b"second"
    assert storage.isdir(storage.join(folder, "a")) and storage.isfile(storage.join(folder, "a", "b.txt"))
    assert storage.listdir(storage.join(folder, "a")) == ["b.txt"]             # no hidden name left beside it
    assert storage.stat(storage.join(folder, "a", "b.txt"))[0] == 6
    table = pa.table({"id": list(range(1000)), "text": [f"row {i}" for i in range(1000)]})
    for n in range(2):
        with storage.open_output(storage.join(folder, "p", f"part-{n}.parquet")) as f:
            pq.write_table(table.slice(n * 500, 500), f)
    parts = storage.list_files(storage.join(folder, "p"))
    assert parts == [storage.join(folder, "p", f"part-{n}.parquet") for n in range(2)]
    assert storage.parquet_dataset(parts).to_table().sort_by("id").equals(table)
    assert storage.parquet_file(parts[1]).metadata.num_rows == 500
    storage.delete_tree(storage.join(folder, "p"))
    assert not storage.exists(storage.join(folder, "p")) and storage.listdir(folder) == ["a"]


def test_a_write_that_fails_leaves_the_old_file_and_no_other(folder):
    path = storage.join(folder, "m.json")
    storage.write_bytes(path, b"old")
    with pytest.raises(RuntimeError, match="half-way"):
        with storage.open_output(path) as f:
            f.write(b"new, but")
            raise RuntimeError("stopped half-way")
    assert storage.read_bytes(path) == b"old" and storage.listdir(folder) == ["m.json"]


def test_one_claim_of_an_output_on_hdfs(folder):
    """Two runs claim one output at once: the store's create-if-absent lets one have it."""
    out = storage.join(folder, "out")
    won, lost, barrier = [], [], threading.Barrier(2)

    def claim(run_id):
        barrier.wait()
        try:
            won.append(Claim(out, run_id).acquire())
        except OutputBusy as exc:
            lost.append(str(exc))
    threads = [threading.Thread(target=claim, args=(f"run-{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(lost) == 1, (won, lost)
    won[0].release()
    again = Claim(out, "run-2").acquire()                  # released: the next run has it
    again.release()


def test_a_namenode_that_does_not_answer_is_an_error_not_a_missing_file(monkeypatch):
    """fsspec's exists() answers False on any error; here a NameNode that is down must not look like
    an empty output (a resume would start over, a pointer would read as absent)."""
    import socket

    with socket.socket() as s:                    # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("PARAGEN_STORAGE_RETRY_SECONDS", "1")
    for call in (storage.exists, storage.isfile, storage.read_bytes, storage.list_files):
        with pytest.raises(storage.StorageError) as caught:
            call(f"webhdfs://127.0.0.1:{port}/corpus/_manifest.json")
        assert caught.value.transient and f"NameNode at http://127.0.0.1:{port}" in str(caught.value)


def test_webhdfs_urls_are_checked():
    with pytest.raises(storage.StorageError, match="expected webhdfs://NAMENODE"):
        storage.exists("webhdfs://namenode:port/x")
