"""Records as numbered versions, each created once with the store's put-if-absent
(common/storage/versions.py over common/storage/conditional.py), store by store: a local disk, an
S3 bucket (moto) and a GCS bucket (fake-gcs-server), both on loopback, and HDFS (a MiniDFSCluster
over WebHDFS); HDFS's rename also through libhdfs's interface, on a local stand-in that renames the
way HDFS does (never over an existing name)."""
import os
import signal
import subprocess
import sys
import threading

import pyarrow.fs as pafs
import pytest

from common import storage
from common.storage import conditional, versions
from tests.crash_points import _until_stopped
from tests.hdfs_cluster import hdfs_store  # noqa: F401: fixture
from tests.object_stores import gcs_store, s3_store  # noqa: F401: fixtures

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def test_versions_are_created_once_over_the_version_read(where):
    path = storage.join(where, "_manifest.json")
    assert storage.read_versioned(path) == (None, storage.ABSENT)
    first = storage.write_if(path, b'{"run_id": "a"}', storage.ABSENT)
    assert first.number == 1 and storage.read_versioned(path)[1].mtime is not None     # the store's time
    assert storage.read_bytes(path) == b'{"run_id": "a"}'                              # the copy readers open
    with pytest.raises(storage.Conflict):
        storage.write_if(path, b'{"run_id": "b"}', storage.ABSENT)      # version 1 is taken
    second = storage.write_if(path, b'{"run_id": "b"}', first)
    assert second.number == 2 and storage.read_versioned(path) == (b'{"run_id": "b"}', second)
    with pytest.raises(storage.Conflict):
        storage.write_if(path, b'{"run_id": "c"}', first)               # a stale writer: its number is taken
    assert storage.read_bytes(path) == b'{"run_id": "b"}'
    assert not storage.delete_if(path, first) and storage.read_bytes(path) == b'{"run_id": "b"}'
    assert storage.delete_if(path, second) and not storage.exists(path)             # a tombstone, the copy gone
    data, third = storage.read_versioned(path)
    assert data is None and third.number == 3
    assert not storage.delete_if(path, second)                          # its number is taken
    assert [n for n in storage.listdir(where) if n not in ("_log",)] == []
    assert versions.numbers(path) == [1, 2, 3]


def test_writers_racing_from_one_version_leave_one_winner(where):
    """Eight threads create the version after the same one at once: exactly one wins, on every
    store, and the copy holds its bytes."""
    path = storage.join(where, "latest.json")
    base = storage.write_if(path, b"base", storage.ABSENT)
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
    assert storage.read_versioned(path)[1].number == 2
    assert [n for n in storage.listdir(where) if n not in ("latest.json", "_log")] == []     # no staged file left


def test_old_versions_are_removed_and_a_writer_that_read_one_is_still_refused(tmp_path):
    """Versions more than KEEP_VERSIONS behind the newest go; a writer paused since one of them
    creates that number again (it is free now), sees a newer one and takes its version back."""
    path = str(tmp_path / "_owner.json")
    version = first = storage.write_if(path, b"0", storage.ABSENT, copy=False)
    for i in range(1, 12):
        version = storage.write_if(path, str(i).encode(), version, copy=False)
    found = versions.numbers(path)
    assert found == list(range(12 - versions.KEEP_VERSIONS + 1, 13)) and 2 not in found
    with pytest.raises(storage.Conflict, match="not the newest"):
        storage.write_if(path, b"stale", first, copy=False)              # creates version 2 again, then sees 12
    assert versions.numbers(path) == found and storage.read_versioned(path) == (b"11", version)


def test_a_writer_paused_between_its_read_and_its_create_is_refused(tmp_path):
    """Two writers read version 1. One (a process) is stopped by SIGSTOP just before it creates
    version 2; the other writes version 2 and 3 meanwhile. Resumed, the paused one finds its
    number taken (Conflict), however long it was paused: no lock to take from it, no clock."""
    path = str(tmp_path / "record.json")
    storage.write_if(path, b"one", storage.ABSENT)
    script = ("from common import storage\n"
              f"data, v = storage.read_versioned({path!r})\n"
              f"try:\n    storage.write_if({path!r}, b'paused', v)\n    print('wrote')\n"
              "except storage.Conflict as e:\n    print('refused:', e)\n")
    paused = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": ROOT,
                                   "PARAGEN_CRASH_AT": "~-record.json:STOP"})      # before its version's create
    try:
        assert _until_stopped(paused), paused.communicate()
        _, version = storage.read_versioned(path)
        assert version.number == 1
        version = storage.write_if(path, b"other", version)
        storage.write_if(path, b"third", version)
    finally:
        paused.send_signal(signal.SIGCONT)
    out, _ = paused.communicate(timeout=120)
    assert out.startswith("refused:"), out
    assert storage.read_bytes(path) == b"third" and storage.read_versioned(path)[1].number == 3
    assert sorted(os.listdir(tmp_path)) == ["_log", "record.json"]
    assert not [n for n in os.listdir(tmp_path / "_log") if n.startswith(".")]      # no staged file left


def test_a_create_whose_staged_file_another_process_cleaned_up_stages_it_again(tmp_path):
    """A writer (a process) stopped with its next version staged, not yet linked; a clean-up of
    killed writes' leftovers (retention's, in another process) removes the staged file. Resumed,
    the writer stages its version again and creates it: its folder is still there, so it has not
    lost (before: Conflict, read as a lost claim, exit 75 of a refresh that held its lease)."""
    from paracorpus.commit import remove_staged

    path = str(tmp_path / "record.json")
    version = storage.write_if(path, b"one", storage.ABSENT)
    script = ("from common import storage\n"
              f"data, v = storage.read_versioned({path!r})\n"
              f"storage.write_if({path!r}, b'two', v)\nprint('wrote')\n")
    writer = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": ROOT,
                                                           "PARAGEN_CRASH_AT": "~-record.json@2:STOP"})  # staged
    try:
        assert _until_stopped(writer), writer.communicate()
        staged = [n for n in os.listdir(tmp_path / "_log") if n.startswith(".")]
        assert len(staged) == 1, staged
        remove_staged(str(tmp_path / "_log"))
        assert not [n for n in os.listdir(tmp_path / "_log") if n.startswith(".")]
    finally:
        writer.send_signal(signal.SIGCONT)
    out, err = writer.communicate(timeout=120)
    assert writer.returncode == 0 and out == "wrote\n", err[-2000:]
    assert storage.read_versioned(path) == (b"two", versions.Version(version.number + 1))


def test_a_probe_a_clean_up_removed_under_its_prober_probes_again(tmp_path):
    """A process probing the store (storage.store_now: create one name twice, the second must be
    refused) is stopped between its two creates; another process's clean-up removes the probe, a
    killed prober's leftover for all it can tell. Resumed, its second create succeeds: it probes
    again under a new name and answers, instead of refusing a sound store as one that ignores
    put-if-absent (before: StorageError, exit 2 of the job that probed)."""
    from paracorpus.commit import remove_staged

    script = ("import logging\nfrom common import storage\nlogging.basicConfig(level=logging.INFO)\n"
              f"print(storage.store_now({str(tmp_path)!r}))\n")
    prober = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": ROOT,
                                                           "PARAGEN_CRASH_AT": "*/.probe.@3:STOP"})  # 2nd create
    try:
        assert _until_stopped(prober), prober.communicate()
        assert [n for n in os.listdir(tmp_path) if conditional.PROBE_NAME.match(n)]
        remove_staged(str(tmp_path))
        assert os.listdir(tmp_path) == []
    finally:
        prober.send_signal(signal.SIGCONT)
    out, err = prober.communicate(timeout=120)
    assert prober.returncode == 0 and float(out) > 0, err[-2000:]
    assert "created twice; probing again" in err
    assert os.listdir(tmp_path) == []                                   # its own probes removed


def test_a_probe_a_killed_process_left_is_removed_by_the_next_clean_up(where):
    """A probe file a process killed while probing left (on a bucket too: no staged file there but
    this one) goes with the next clean-up of its folder; a probe this process is using stays, and
    so does any other hidden file."""
    from paracorpus.commit import remove_staged

    left = storage.join(where, ".probe." + "a" * 32 + ".tmp")
    mine = storage.join(where, ".probe." + "b" * 32 + ".tmp")
    other = storage.join(where, ".probe.keep")
    for path in (left, mine, other):
        storage.write_bytes(path, b"1")
    conditional._PROBING.add(storage.resolve(mine)[1])
    try:
        remove_staged(where)
    finally:
        conditional._PROBING.discard(storage.resolve(mine)[1])
    assert sorted(storage.listdir(where)) == [".probe." + "b" * 32 + ".tmp", ".probe.keep"]


def test_a_clean_up_in_the_writers_own_process_leaves_its_write_in_flight(tmp_path):
    """Retention's clean-up of staged leftovers and the claim's heartbeat run in one process: the
    file the heartbeat is writing is not a leftover and stays."""
    from paracorpus.commit import remove_staged

    target = str(tmp_path / "_log" / "x.json")
    os.makedirs(tmp_path / "_log")
    with storage.open_output(target) as f:
        f.write(b"{}")
        remove_staged(str(tmp_path / "_log"))          # a thread's clean-up while this write is in flight
    assert storage.read_bytes(target) == b"{}"


_ENDING_SCRIPT = """
import linecache, os, sys, threading, time
from common import storage

d = sys.argv[1]
storage.remove_staged_in_flight()       # this (main) thread ends the process, as stopping.end does


def parked(thread):
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
        if frame.f_code.co_name == "_open_staged" and "sleep" in line:
            return True
        frame = frame.f_back
    return False


other = threading.Thread(target=storage.create_new, args=(os.path.join(d, "v.json"), b"x"), daemon=True)
other.start()
while other.is_alive() and not parked(other):
    time.sleep(0.05)
print("other:", "waits" if other.is_alive() else "wrote", sorted(os.listdir(d)), flush=True)
storage.write_bytes(os.path.join(d, "error.log"), b"why")      # the ending thread still writes
parent = threading.get_ident()
helper = threading.Thread(target=lambda: (storage.stage_like(parent), storage.write_bytes(os.path.join(d, "h"), b"")))
helper.start()
helper.join()
print("after:", sorted(os.listdir(d)), flush=True)
os._exit(0)
"""


def test_once_a_process_ends_its_other_threads_stage_no_file(tmp_path):
    """A thread ending the process (a lost claim) removes the files the others are staging; a
    writer whose staged file it removed staged it again (its folder was there), and the exit left
    that one behind (CI: a paused run's `_log/.1-_manifest.json.*.tmp` after it exited 75). From
    then on the other threads wait for the exit: they stage nothing; the ending thread, and the
    helpers it starts for its clean-up, still write."""
    done = subprocess.run([sys.executable, "-c", _ENDING_SCRIPT, str(tmp_path)], cwd=ROOT, text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["other: waits []", "after: ['error.log', 'h']"], done.stdout


def test_a_copy_written_late_is_made_the_newest_again(tmp_path):
    """A writer stopped between its version and its copy: the copy is the older version's until the
    next reader under a claim repairs it (repair_copy), and a writer that finds a newer version
    after its own copy writes the newer one's."""
    path = str(tmp_path / "_manifest.json")
    v1 = storage.write_if(path, b"v1", storage.ABSENT)
    storage.write_if(path, b"v2", v1, copy=False)          # as a writer stopped before its copy
    assert storage.read_bytes(path) == b"v1"
    assert versions.repair_copy(path) and storage.read_bytes(path) == b"v2"
    assert not versions.repair_copy(path)
    versions._copy(path, 1, b"v1")                        # a writer of version 1 resumed late
    assert storage.read_bytes(path) == b"v2"


def test_a_conditional_create_whose_answer_was_lost_is_this_writers(s3_store, monkeypatch):
    """The store created the version and the answer did not arrive: the retry answers 412, the
    bytes there are this writer's, so the create succeeded (not a Conflict)."""
    from tests.fault_proxy import FaultProxy

    bucket = s3_store.make_bucket()
    for name, value in s3_store.env.items():
        monkeypatch.setenv(name, value)
    path = f"s3://{bucket}/latest.json"
    base = storage.write_if(path, b"base", storage.ABSENT)
    with FaultProxy(s3_store.endpoint, rate=1.0, kinds=("lost",), limit=1, only=b"PUT") as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.url)
        monkeypatch.setenv("PARAGEN_STORAGE_RETRY_SECONDS", "20")
        version = storage.write_if(path, b"mine", base)
        assert proxy.counts["lost"] == 1
    for name, value in s3_store.env.items():
        monkeypatch.setenv(name, value)
    assert storage.read_versioned(path) == (b"mine", version) and version.number == 2


def test_a_store_that_ignores_put_if_absent_is_refused_in_one_line(s3_store, monkeypatch):
    """A store that accepts If-None-Match and applies the write anyway would let two writers both
    win: the probe every claim makes (create one name twice) refuses it before anything is written."""
    from tests.fault_proxy import FaultProxy

    from paracorpus.commit import Claim

    bucket = s3_store.make_bucket()
    for name, value in s3_store.env.items():
        monkeypatch.setenv(name, value)
    conditional._HONOURED.clear()
    with FaultProxy(s3_store.endpoint, ignore_conditional=True) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.url)
        with pytest.raises(storage.StorageError, match="ignores If-None-Match"):
            Claim(f"s3://{bucket}/out", "r1").acquire()
    for name, value in s3_store.env.items():
        monkeypatch.setenv(name, value)
    assert storage.listdir(f"s3://{bucket}/out") == []              # nothing written, the probe removed
    Claim(f"s3://{bucket}/out", "r1").acquire().release()            # the store itself honours it


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


def test_hdfs_renames_create_only_if_absent(tmp_path, monkeypatch):
    fs = HdfsLike()
    monkeypatch.setattr(conditional, "resolve", lambda path: (fs, path.split("namenode", 1)[1]))
    path = f"hdfs://namenode{tmp_path}/x.json"
    assert conditional.read_stamped(path) == (None, None)
    conditional.create_new(path, b"a")
    with pytest.raises(storage.Conflict):
        conditional.create_new(path, b"b")
    assert conditional.read_stamped(path)[0] == b"a"
    assert os.listdir(tmp_path) == ["x.json"]                       # the hidden file renamed or removed
