"""A lease that fences (issues 57, 68): the claim is renewed and taken over only by creating its
next numbered version (put-if-absent), its age is the store's time less the store's time, and the
publish is the manifest's next version, so a holder paused past its lease (SIGSTOP here; a
suspended SLURM job, a VM pause) cannot write over the run that took over from it, whatever it
believes or whatever its clock says.

Pauses are real: a process stops itself just before a chosen storage operation
(``PARAGEN_CRASH_AT=~SUFFIX@K:STOP``, common/crash_points.py) and the test sends SIGCONT.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from common import storage
from common.cli import OutputBusy
from paracorpus.commit import Claim
from tests.claims import claim_record, take_over
from tests.crash_points import _until_stopped
from tests.jobs import ROOT, quick_args
from tests.object_stores import s3_store  # noqa: F401: a fixture
from tests import warm_python

LEASE = "3"          # seconds: PARAGEN_LEASE_SECONDS for these tests

_TAKER = """
import sys, time
from common.cli import OutputBusy
from paracorpus.commit import Claim
try:
    claim = Claim(sys.argv[1], sys.argv[2]).acquire()
except OutputBusy as exc:
    print("busy", flush=True)
    sys.exit(75)
print("held", flush=True)
time.sleep(float(sys.argv[3]))
claim.check()                    # still ours at the end, or OutputBusy
print("still held", flush=True)
claim.release()
"""


def _taker(out: str, run_id: str, hold: float, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _TAKER, out, run_id, str(hold)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": ROOT, "PARAGEN_LEASE_SECONDS": LEASE, **env})


def _stopped(proc: subprocess.Popen, timeout: float = 60) -> None:
    """Until PROC has stopped itself (SIGSTOP at its crash point)."""
    assert _until_stopped(proc, timeout), proc.communicate()


def _stale_record(out: str, env: dict, monkeypatch) -> None:
    """An owner record of a holder gone without a word (another host: no pid to look at), its
    lease run out by the store's clock."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    take_over(out, {"run_id": "gone", "token": "gone", "host": "another-host", "pid": 1, "heartbeat": 0})
    time.sleep(float(LEASE) + 1)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_two_takers_of_one_stale_record_one_wins(tmp_path, s3_store, where, monkeypatch):
    """A taker that judged the record stale and paused before taking it over resumes after another
    taker took it: it must not take it too (its number is taken; the lock-file design let both
    think they held it)."""
    env = {}
    out = str(tmp_path / "out")
    if where == "s3":
        env = dict(s3_store.env)
        out = f"s3://{s3_store.make_bucket()}/out"
    _stale_record(out, env, monkeypatch)
    # paused just before its takeover: the create of the claim's next version, the record judged stale
    first = _taker(out, "first", 4, {**env, "PARAGEN_CRASH_AT": "~-_owner.json:STOP"})
    _stopped(first)
    second = _taker(out, "second", 6, env)
    assert second.stdout.readline().strip() == "held"
    first.send_signal(signal.SIGCONT)
    first_out, first_err = first.communicate(timeout=60)
    second_out, second_err = second.communicate(timeout=60)
    assert first_out.split() == ["busy"] and first.returncode == 75, (first_out, first_err[-2000:])
    assert second_out.split() == ["still", "held"] and second.returncode == 0, (second_out, second_err[-2000:])


def test_a_lease_is_judged_by_the_stores_clock_not_the_holders(tmp_path, monkeypatch):
    """A holder whose clock runs ahead stamps a heartbeat in the future: once the store's time
    says its version is older than the lease, it is taken over; a holder whose clock runs behind
    stamps the past: a version the store saw created just now is not."""
    from common.storage import versions

    monkeypatch.setenv("PARAGEN_LEASE_SECONDS", LEASE)
    out = tmp_path / "out"
    other = {"run_id": "skewed", "token": "theirs", "host": "another-host", "pid": 1}
    take_over(out, {**other, "heartbeat": time.time() + 10 ** 6})                   # clock far ahead
    newest = versions.version_path(str(out / "_owner.json"), versions.numbers(str(out / "_owner.json"))[-1])
    past = time.time() - 3600
    os.utime(newest, (past, past))                                                  # the store: an hour old
    claim = Claim(str(out), "mine").acquire()
    assert claim_record(out)["token"] == claim.token
    claim.release()
    take_over(out, {**other, "heartbeat": time.time() - 10 ** 6})                   # clock far behind, renewed now
    with pytest.raises(OutputBusy, match="being written by run skewed"):
        Claim(str(out), "mine").acquire()


_SHIFTED_TAKER = """
import sys, time
real = time.time
time.time = lambda: real() + float(sys.argv[2])      # this machine's clock, SHIFT seconds ahead
from common.cli import OutputBusy
from paracorpus.commit import Claim
try:
    Claim(sys.argv[1], "ahead").acquire().release()
    print("took it")
except OutputBusy as exc:
    print("busy:", exc)
"""


def test_a_taker_whose_clock_runs_ahead_does_not_take_a_live_claim(tmp_path):
    """A live holder renews its claim; a taker on a machine whose clock is 400 s ahead (more than
    the lease) reads the holder's version: its age is the store's time less the store's time, so
    the taker's clock counts for nothing and it is told the output is busy (the old rule, the
    taker's clock less the store's stamp, took the live claim over)."""
    out = tmp_path / "out"
    holder = Claim(str(out), "live").acquire()
    try:
        done = subprocess.run([sys.executable, "-c", _SHIFTED_TAKER, str(out), "400"], cwd=ROOT, text=True,
                              capture_output=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": ROOT, "PARAGEN_LEASE_SECONDS": "60"})
        assert done.stdout.startswith("busy:") and "being written by run live" in done.stdout, done
        holder.check()                                    # still the holder's
    finally:
        holder.release()


def test_a_store_without_conditional_writes_is_refused_in_one_line(s3_store, monkeypatch):
    """An S3-compatible store that answers 501 to If-None-Match: the claim (the first write of
    every job) is refused with one line saying why, instead of falling back to a plain put that
    fences nothing; PARAGEN_UNFENCED_STORES=1 accepts it, with a warning."""
    from tests.fault_proxy import FaultProxy

    bucket = s3_store.make_bucket()
    with FaultProxy(s3_store.endpoint, no_conditional=True) as proxy:
        for name, value in {**s3_store.env, "AWS_ENDPOINT_URL": proxy.url, "AWS_ENDPOINT_URL_S3": proxy.url}.items():
            monkeypatch.setenv(name, value)
        with pytest.raises(storage.StorageError, match="does not support conditional writes.*501.*PARAGEN_UNFENCED"):
            Claim(f"s3://{bucket}/out", "r1").acquire()
        assert storage.listdir(f"s3://{bucket}/out") == []          # nothing written, not even the probe
        monkeypatch.setenv("PARAGEN_UNFENCED_STORES", "1")
        claim = Claim(f"s3://{bucket}/out", "r1").acquire()
        claim.check()
        claim.release()
        assert proxy.counts["501"] >= 2


def test_a_store_without_conditional_deletes_needs_none(s3_store, monkeypatch):
    """A store that takes If-None-Match on a put but answers 501 to a conditional delete: nothing
    here deletes conditionally any more (a release is a tombstone version, created like any
    other), so a claim is taken and released there without one 501."""
    from tests.fault_proxy import FaultProxy

    bucket = s3_store.make_bucket()
    with FaultProxy(s3_store.endpoint, no_conditional=b"DELETE") as proxy:
        for name, value in {**s3_store.env, "AWS_ENDPOINT_URL": proxy.url, "AWS_ENDPOINT_URL_S3": proxy.url}.items():
            monkeypatch.setenv(name, value)
        claim = Claim(f"s3://{bucket}/out", "r1").acquire()
        claim.check()
        claim.release()
        assert claim_record(f"s3://{bucket}/out") is None and proxy.counts["501"] == 0


def test_a_heartbeat_renews_only_the_version_it_wrote(tmp_path, monkeypatch):
    """The heartbeat creates the version after the one this claim last wrote: another writer's
    version there (even one that carries this claim's token: a copy restored by hand) is never
    written over, and the claim is told it lost OUT."""
    import threading

    monkeypatch.setenv("PARAGEN_LEASE_SECONDS", "2")                 # a renewal every 0.2 s
    out = tmp_path / "out"
    told = threading.Event()
    claim = Claim(str(out), "r1", on_lost=lambda why: told.set()).acquire()
    with claim._lock:                                                # between two renewals
        take_over(out, {"heartbeat": 1.0})                           # its token, not the version it wrote
    assert told.wait(10)
    time.sleep(0.5)
    assert claim_record(out)["heartbeat"] == 1.0
    claim.release()
    assert claim_record(out)["heartbeat"] == 1.0                     # not its version: no tombstone over it


@pytest.mark.slow
def test_a_holder_paused_past_its_lease_cannot_publish_over_the_run_that_took_over(tmp_path, tiny_nmt_models):
    """Run A stops itself just before its manifest (its claim checked, the write next), past its
    lease; run B (other settings, --overwrite) takes the output over and publishes; A resumes:
    its publish finds the manifest's next number taken (exit 75, one line) and B's run stays
    whole (the first code wrote A's manifest over B's, then A's clean-up removed B's files)."""
    from tests.crash_points import leftovers, rows
    from tests.toydata import toy_bitext

    bitext = tmp_path / "in.tsv"
    bitext.write_text("".join(f"{s}\t{t}\n" for s, t in toy_bitext(400, seed=31)[:12]))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": ROOT, "PARAGEN_LEASE_SECONDS": LEASE}
    job = [sys.executable, "-m", "beam_pipelines.generate", *quick_args(str(bitext), out, tiny_nmt_models)]
    a = warm_python.popen([*job, "--num_samples", "2"], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env={**env, "PARAGEN_CRASH_AT": "~-_manifest.json:STOP"})
    try:
        _stopped(a, timeout=600)
        time.sleep(float(LEASE) + 1)
        b = warm_python.run([*job, "--overwrite"], cwd=ROOT, text=True, capture_output=True, env=env, timeout=600)
        assert b.returncode == 0, b.stderr[-3000:]
        published = rows(str(out))
        assert published
    finally:
        a.send_signal(signal.SIGCONT)
    _out, err = a.communicate(timeout=120)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert a.returncode == 75 and len(errors) == 1, err[-3000:]
    assert "another run" in errors[0] or "lost its claim" in errors[0], errors
    assert rows(str(out)) == published and not leftovers(str(out))


_FENCED_WRITER = """
import sys
from common import storage
from paracorpus.commit import Fence
out, watched = sys.argv[1], sys.argv[2]
fence = Fence(out, "held")
if watched != "-":
    fence = fence.watching(watched, storage.Version(1), "the watched record")
storage.fence_writes(out, fence)
storage.write_bytes(storage.join(out, "runs", "r1", "part.bin"), b"rows")
print("wrote", flush=True)
"""


def _paused_fenced_writer(tmp_path, crash_at: str, watched: bool) -> tuple[str, str, int]:
    """A writer fenced by a claim on OUT (token "held") stops itself at CRASH_AT; the claim is
    taken over and the fence's throttle outlasted while it is stopped; resumed: its output,
    stderr and exit status."""
    from paracorpus.commit import FENCE_SECONDS

    out, record = tmp_path / "out", tmp_path / "w" / "latest.json"
    storage.write_if(str(out / "_owner.json"), json.dumps({"token": "held", "run_id": "a"}).encode(),
                     storage.ABSENT, copy=False)
    storage.write_if(str(record), b"{}", storage.ABSENT, copy=False)
    writer = subprocess.Popen([sys.executable, "-c", _FENCED_WRITER, str(out), str(record) if watched else "-"],
                              cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": ROOT, "PARAGEN_CRASH_AT": crash_at})
    try:
        _stopped(writer)
        take_over(out, {"token": "taker", "run_id": "b"})
        time.sleep(FENCE_SECONDS + 0.5)          # a pause longer than the throttle, as any takeover's is
    finally:
        writer.send_signal(signal.SIGCONT)
    stdout, stderr = writer.communicate(timeout=120)
    return stdout, stderr, writer.returncode


def test_a_fence_that_looked_before_a_pause_looks_again(tmp_path):
    """The fence reads the claim, then the watched record; the writer is paused between the two
    reads, and the claim taken over meanwhile. The look it finishes after the pause is stale: it
    looks again (before: it passed and the write went on over the taker's claim)."""
    stdout, stderr, code = _paused_fenced_writer(tmp_path, "~w/_log:STOP", watched=True)
    assert code != 0 and "lost its claim (run b holds it now)" in stderr, (stdout, stderr[-2000:])
    assert not (tmp_path / "out" / "runs").exists()


def test_a_write_paused_after_its_fence_takes_back_the_folders_it_made(tmp_path):
    """The writer passes its fence and is paused just before its write, whose folder (runs/r1) is
    not there yet; the claim is taken over meanwhile. Resumed, the write makes its folders and its
    file, looks again and takes back both (before: the file went, runs/r1 stayed: a run folder
    without a manifest, as the keep2 SIGSTOP sweep left)."""
    stdout, stderr, code = _paused_fenced_writer(tmp_path, "~part.bin:STOP", watched=False)
    assert code != 0 and "lost its claim (run b holds it now)" in stderr, (stdout, stderr[-2000:])
    assert sorted(os.listdir(tmp_path / "out")) == ["_log"]
