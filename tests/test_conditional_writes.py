"""Conditional writes, store by store (common/storage/conditional.py): created only if absent,
replaced or removed only if still the version read, on a local disk, in an S3 bucket (moto) and a
GCS bucket (fake-gcs-server), both on loopback, and on HDFS (a MiniDFSCluster over WebHDFS); HDFS's
rename protocol also through libhdfs's interface, on a local stand-in that renames the way HDFS does
(never over an existing name)."""
import os
import threading

import pyarrow.fs as pafs
import pytest

from common import storage
from common.storage import conditional
from tests.hdfs_cluster import hdfs_store  # noqa: F401: fixture
from tests.object_stores import gcs_store, s3_store  # noqa: F401: fixtures


@pytest.fixture(params=["local", "s3", "gcs", "webhdfs"])
def where(request, tmp_path, monkeypatch):
    """A folder (path or URL) in each store, with the store's variables set in this process."""
    if request.param == "local":
        return str(tmp_path)
    store = request.getfixturevalue({"s3": "s3_store", "gcs": "gcs_store", "webhdfs": "hdfs_store"}[request.param])
    for name, value in store.env.items():
        if name != "CLOUD_STORAGE_EMULATOR_ENDPOINT":      # pyarrow's: never in the test process (object_stores.py)
            monkeypatch.setenv(name, value)
    return f"{store.scheme}://{store.make_bucket()}/dir"


def test_create_replace_and_remove_only_over_the_version_read(where):
    path = storage.join(where, "_manifest.json")
    assert storage.read_versioned(path) == (None, storage.ABSENT)
    first = storage.create_new(path, b'{"run_id": "a"}')
    assert not first.absent and storage.read_versioned(path)[1].mtime is not None     # the store's time
    with pytest.raises(storage.Conflict):
        storage.create_new(path, b'{"run_id": "b"}')                 # it exists
    second = storage.write_if(path, b'{"run_id": "b"}', first)
    assert second.tag != first.tag and storage.read_versioned(path) == (b'{"run_id": "b"}', second)
    with pytest.raises(storage.Conflict):
        storage.write_if(path, b'{"run_id": "c"}', first)            # a stale writer: refused
    assert storage.read_bytes(path) == b'{"run_id": "b"}'
    with pytest.raises(storage.Conflict):
        storage.write_if(storage.join(where, "absent.json"), b"x", second)     # expected a file: there is none
    assert not storage.delete_if(path, first) and storage.read_bytes(path) == b'{"run_id": "b"}'
    assert storage.delete_if(path, second) and not storage.exists(path)
    assert not storage.delete_if(path, second)                        # gone already


@pytest.mark.parametrize("store", ["local", "webhdfs"])
def test_writers_racing_from_one_version_leave_one_winner(store, tmp_path, request):
    """Eight threads replace the same version at once (the local locked compare and rename; on
    HDFS the rename aside that one renamer wins): exactly one wins, the file holds its bytes."""
    folder = str(tmp_path) if store == "local" else f"webhdfs://{request.getfixturevalue('hdfs_store').make_bucket()}"
    path = storage.join(folder, "latest.json")
    base = storage.create_new(path, b"base")
    won, barrier = [], threading.Barrier(8)

    def contend(i):
        barrier.wait()
        try:
            storage.write_if(path, f"writer {i}".encode(), base)
            won.append(i)
        except storage.Conflict:
            pass
    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and storage.read_bytes(path) == f"writer {won[0]}".encode()
    assert [n for n in storage.listdir(folder) if n != "latest.json"] == []       # no staged file left


def test_a_conditional_replace_whose_answer_was_lost_is_this_writers(s3_store, monkeypatch):
    """The store replaced the object and the answer did not arrive: the retry answers 412, the
    bytes there are this writer's, so the replace succeeded (not a Conflict)."""
    from tests.fault_proxy import FaultProxy

    bucket = s3_store.make_bucket()
    for name, value in s3_store.env.items():
        monkeypatch.setenv(name, value)
    path = f"s3://{bucket}/latest.json"
    base = storage.create_new(path, b"base")
    with FaultProxy(s3_store.endpoint, rate=1.0, kinds=("lost",), limit=1) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.url)
        monkeypatch.setenv("PARAGEN_STORAGE_RETRY_SECONDS", "20")
        version = storage.write_if(path, b"mine", base)
        assert proxy.counts["lost"] == 1
    for name, value in s3_store.env.items():
        monkeypatch.setenv(name, value)
    assert storage.read_versioned(path) == (b"mine", version)


class HdfsLike:
    """A local folder that renames the way HDFS does: ``move`` fails when the target exists (a
    local rename would replace it). Everything else is pyarrow's LocalFileSystem."""

    def __init__(self):
        self.local = pafs.LocalFileSystem()

    def __getattr__(self, name):
        return getattr(self.local, name)

    def move(self, src, dst):
        os.link(src, dst)                 # FileExistsError if DST exists: HDFS's rename returns false
        os.unlink(src)


def test_hdfs_renames_create_and_replace_only_over_the_version_read(tmp_path):
    fs, inner = HdfsLike(), str(tmp_path / "_manifest.json")
    path = f"hdfs://namenode{inner}"
    assert conditional._hdfs_read(path, (fs, inner)) == (None, storage.ABSENT)
    first = conditional._hdfs_write(path, b"a", storage.ABSENT, (fs, inner))
    with pytest.raises(storage.Conflict):
        conditional._hdfs_write(path, b"b", storage.ABSENT, (fs, inner))
    second = conditional._hdfs_write(path, b"b", first, (fs, inner))
    with pytest.raises(storage.Conflict):
        conditional._hdfs_write(path, b"c", first, (fs, inner))      # stale: put back, refused
    assert conditional._hdfs_read(path, (fs, inner)) == (b"b", second)
    assert sorted(os.listdir(tmp_path)) == ["_manifest.json"]
    # a replace stopped between its two renames: the file is aside; the next read puts it back
    os.rename(inner, str(tmp_path / "._manifest.json.0123.replaced"))
    assert conditional._hdfs_read(path, (fs, inner))[0] == b"b"
    assert sorted(os.listdir(tmp_path)) == ["_manifest.json"]
    with pytest.raises(storage.Conflict):
        conditional._hdfs_delete(path, first, (fs, inner))
    conditional._hdfs_delete(path, second, (fs, inner))
    assert os.listdir(tmp_path) == []


def test_a_writer_paused_inside_its_local_write_is_taken_over_and_then_refused(tmp_path):
    """A process stopped (SIGSTOP) inside its compare-and-rename holds the directory's lock: after
    10 s another writer takes the lock and writes; resumed, the paused one is refused (Conflict)
    and the file holds the other's bytes."""
    import signal
    import subprocess
    import sys
    import time

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = str(tmp_path / "record.json")
    conditional.create_new(path, b"one")
    script = ("import sys\nfrom common.storage import conditional as c\n"
              f"data, v = c.read_versioned({path!r})\n"
              f"try:\n    c.write_if({path!r}, b'paused', v)\n    print('wrote')\n"
              "except c.Conflict as e:\n    print('refused:', e)\n")
    # its second operation on the file: the rename, with the lock held
    paused = subprocess.Popen([sys.executable, "-c", script], cwd=root, text=True, stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": root, "PARAGEN_CRASH_AT": "~record.json@2:STOP"})
    try:
        deadline = time.time() + 60
        while open(f"/proc/{paused.pid}/stat").read().split(")")[1].split()[0] != "T":
            assert time.time() < deadline and paused.poll() is None
            time.sleep(0.05)
        assert os.path.exists(tmp_path / conditional.LOCK_NAME)
        started = time.monotonic()
        _, version = conditional.read_versioned(path)
        conditional.write_if(path, b"other", version)           # waits out the stale lock, then takes it
        assert conditional.LOCK_STALE_SECONDS - 1 <= time.monotonic() - started < 30     # it waited first
    finally:
        paused.send_signal(signal.SIGCONT)
    out, _ = paused.communicate(timeout=60)
    assert out.startswith("refused:") and "paused past" in out, out
    assert open(path, "rb").read() == b"other"
    assert sorted(os.listdir(tmp_path)) == ["record.json"]      # no lock, no temporary file left


def test_the_lock_of_a_killed_writer_is_taken_at_once(tmp_path):
    """A writer killed inside its conditional write leaves its lock file; the next writer of this
    machine sees its process is gone and takes the lock without waiting out LOCK_STALE_SECONDS."""
    import json
    import subprocess
    import sys
    import time

    from common import processes

    path = str(tmp_path / "record.json")
    version = conditional.create_new(path, b"one")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / conditional.LOCK_NAME).write_text(json.dumps({**processes.identity(), "pid": dead.pid, "token": "abc"}))
    os.utime(tmp_path / conditional.LOCK_NAME, (time.time() - 1, time.time() - 1))
    started = time.monotonic()
    conditional.write_if(path, b"two", version)
    assert time.monotonic() - started < conditional.LOCK_STALE_SECONDS / 2
    assert open(path, "rb").read() == b"two" and sorted(os.listdir(tmp_path)) == ["record.json"]
