"""A lease that fences (issue 57): the owner record is renewed and taken over only by conditional
writes, its age is the store's, and the publish itself is conditional, so a holder paused past
its lease (SIGSTOP here; a suspended SLURM job, a VM pause) cannot write over the run that took
over from it, whatever it believes.

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
from tests.jobs import ROOT, quick_args
from tests.object_stores import s3_store  # noqa: F401: a fixture

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
    deadline = time.time() + timeout
    while time.time() < deadline:
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("the process did not reach its crash point")


def _stale_record(out: str, env: dict, monkeypatch) -> None:
    """An owner record of a holder gone without a word (another host: no pid to look at), its
    lease run out by the store's clock."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    storage.write_bytes(storage.join(out, "_owner.json"), json.dumps(
        {"run_id": "gone", "token": "gone", "host": "another-host", "pid": 1, "heartbeat": 0}).encode())
    time.sleep(float(LEASE) + 1)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_two_takers_of_one_stale_record_one_wins(tmp_path, s3_store, where, monkeypatch):
    """A taker that judged the record stale and paused before taking it over resumes after another
    taker took it: it must not take it too (the old takeover removed the record unconditionally,
    then created its own: both held OUT)."""
    env = {}
    out = str(tmp_path / "out")
    if where == "s3":
        env = dict(s3_store.env)
        out = f"s3://{s3_store.make_bucket()}/out"
    _stale_record(out, env, monkeypatch)
    # paused before its takeover, the step after its create: on a local disk the create is two
    # steps (a write, then the link the record refuses: a rename, inside the directory's lock)
    takeover = 3 if where == "local" else 2
    first = _taker(out, "first", 4, {**env, "PARAGEN_CRASH_AT": f"~_owner.json@{takeover}:STOP"})
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
    says the record is older than the lease, it is taken over; a holder whose clock runs behind
    stamps the past: a record the store saw renewed just now is not."""
    monkeypatch.setenv("PARAGEN_LEASE_SECONDS", LEASE)
    out = tmp_path / "out"
    out.mkdir()
    owner = out / "_owner.json"
    other = {"run_id": "skewed", "token": "theirs", "host": "another-host", "pid": 1}
    owner.write_text(json.dumps({**other, "heartbeat": time.time() + 10 ** 6}))      # clock far ahead
    past = time.time() - 3600
    os.utime(owner, (past, past))                                                    # the store: an hour old
    claim = Claim(str(out), "mine").acquire()
    assert json.loads(owner.read_text())["token"] == claim.token
    claim.release()
    owner.write_text(json.dumps({**other, "heartbeat": time.time() - 10 ** 6}))      # clock far behind, renewed now
    with pytest.raises(OutputBusy, match="being written by run skewed"):
        Claim(str(out), "mine").acquire()


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
        assert not storage.exists(f"s3://{bucket}/out/_owner.json")
        monkeypatch.setenv("PARAGEN_UNFENCED_STORES", "1")
        claim = Claim(f"s3://{bucket}/out", "r1").acquire()
        claim.check()
        claim.release()
        assert proxy.counts["501"] >= 2


def test_a_store_without_conditional_deletes_is_refused_too(s3_store, monkeypatch):
    """A store that takes If-None-Match and If-Match on a put but answers 501 to a conditional
    delete: a claim's release (a delete only of the record it wrote) is refused like the put, not
    turned into a read and a plain delete that could remove a successor's claim; with
    PARAGEN_UNFENCED_STORES=1 it compares, then deletes, with a warning."""
    from tests.fault_proxy import FaultProxy

    bucket = s3_store.make_bucket()
    with FaultProxy(s3_store.endpoint, no_conditional=b"DELETE") as proxy:
        for name, value in {**s3_store.env, "AWS_ENDPOINT_URL": proxy.url, "AWS_ENDPOINT_URL_S3": proxy.url}.items():
            monkeypatch.setenv(name, value)
        path = f"s3://{bucket}/out/_owner.json"
        version = storage.create_new(path, b'{"token": "mine"}')           # conditional puts work here
        with pytest.raises(storage.StorageError, match="does not support conditional writes.*501.*PARAGEN_UNFENCED"):
            storage.delete_if(path, version)
        assert storage.read_bytes(path) == b'{"token": "mine"}' and proxy.counts["501"] == 1
        monkeypatch.setenv("PARAGEN_UNFENCED_STORES", "1")
        assert storage.delete_if(path, version) and not storage.exists(path)


def test_a_heartbeat_renews_only_the_version_it_wrote(tmp_path, monkeypatch):
    """The heartbeat is a conditional replace of the record this claim last wrote: another
    writer's record (even one that carries this claim's token: a copy restored by hand) is never
    written over, and the claim is told it lost OUT."""
    import threading

    monkeypatch.setenv("PARAGEN_LEASE_SECONDS", "2")                 # a renewal every 0.2 s
    out = tmp_path / "out"
    told = threading.Event()
    claim = Claim(str(out), "r1", on_lost=lambda why: told.set()).acquire()
    mine = json.loads((out / "_owner.json").read_text())
    (out / "_owner.json").write_text(json.dumps({**mine, "heartbeat": 1.0}))      # not the version it wrote
    assert told.wait(10)
    time.sleep(0.5)
    assert json.loads((out / "_owner.json").read_text())["heartbeat"] == 1.0
    claim.release()
    assert (out / "_owner.json").exists()                           # not its version: not removed either


@pytest.mark.slow
def test_a_holder_paused_past_its_lease_cannot_publish_over_the_run_that_took_over(tmp_path, tiny_nmt_models):
    """Run A stops itself just before its manifest (its claim checked, the write next), past its
    lease; run B (other settings, --overwrite) takes the output over and publishes; A resumes:
    its publish is refused by the store (exit 75, one line) and B's run stays whole (the old
    code wrote A's manifest over B's, then A's clean-up removed B's files)."""
    from tests.crash_points import leftovers, rows
    from tests.toydata import toy_bitext

    bitext = tmp_path / "in.tsv"
    bitext.write_text("".join(f"{s}\t{t}\n" for s, t in toy_bitext(400, seed=31)[:12]))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": ROOT, "PARAGEN_LEASE_SECONDS": LEASE}
    job = [sys.executable, "-m", "beam_pipelines.generate", *quick_args(str(bitext), out, tiny_nmt_models)]
    a = subprocess.Popen([*job, "--num_samples", "2"], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env={**env, "PARAGEN_CRASH_AT": "~/_manifest.json:STOP"})
    try:
        _stopped(a, timeout=600)
        time.sleep(float(LEASE) + 1)
        b = subprocess.run([*job, "--overwrite"], cwd=ROOT, text=True, capture_output=True, env=env, timeout=600)
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
