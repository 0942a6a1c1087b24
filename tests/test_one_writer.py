"""One writer per output, provably (issues 53, 68): the claim is a sequence of numbered versions,
each created once (put-if-absent), with a random token, checked again before the manifest and
before any delete.

- Processes that claim the same output (the same run id: one command started twice) behind a
  barrier, round after round, on a local disk and in an S3 bucket (moto on loopback): exactly one
  holds it each round, the others are told it is busy (exit 75).
- A run whose claim another writer took stops before its manifest, exit 75, in one line,
  writing and removing nothing.
"""
import json
import multiprocessing
import os
import subprocess
import sys
import time

import pytest

from common.cli import OutputBusy
from paracorpus.commit import STAGED_LEFTOVER, Claim
from tests.claims import claim_record, holder_token, take_over
from tests.crash_points import _until_stopped
from tests.jobs import quick_args
from tests.object_stores import s3_store  # noqa: F401: a fixture
from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _contender(output: str, start, tried, results, env: dict) -> None:
    os.environ.update(env)
    start.wait(timeout=300)
    try:
        claim = Claim(output, "the-same-run").acquire()
    except OutputBusy:
        results.put("busy")
        tried.wait(timeout=300)
        return
    results.put("held")
    # held until every contender has tried: a fixed hold (it was 0.5 s) let a contender that a
    # loaded machine started late find the claim released and take it, a second "held"
    tried.wait(timeout=300)
    claim.release()


def _rounds(output_of, env: dict, rounds: int, contenders: int = 3) -> list[list[str]]:
    ctx = multiprocessing.get_context("spawn")
    out = []
    for r in range(rounds):
        start, tried, results = ctx.Barrier(contenders), ctx.Barrier(contenders), ctx.Queue()
        procs = [ctx.Process(target=_contender, args=(output_of(r), start, tried, results, env))
                 for _ in range(contenders)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=600)
        out.append(sorted(results.get(timeout=60) for _ in procs))
    return out


def test_claims_started_together_on_a_local_disk_leave_one_writer(tmp_path):
    results = _rounds(lambda r: str(tmp_path / f"out{r}"), {}, rounds=20)
    assert all(r == ["busy", "busy", "held"] for r in results), results
    assert not any(claim_record(tmp_path / f"out{r}") for r in range(20))      # each released


def test_claims_started_together_in_an_s3_bucket_leave_one_writer(s3_store):
    bucket = s3_store.make_bucket()
    results = _rounds(lambda r: f"s3://{bucket}/out{r}", s3_store.env, rounds=10)
    assert all(r == ["busy", "busy", "held"] for r in results), results


def test_a_claim_another_writer_took_fails_its_check_and_is_not_released(tmp_path):
    out = str(tmp_path / "out")
    mine = Claim(out, "r1").acquire()
    mine.check()
    take_over(out, {"run_id": "r2", "token": "someone-else", "heartbeat": time.time()})   # another writer's version
    with pytest.raises(OutputBusy, match="lost its claim .*run r2 holds it now"):
        mine.check()
    mine.release()
    assert holder_token(out) == "someone-else"                        # its release created nothing over it


def test_a_dead_holders_claim_is_taken_over(tmp_path):
    out = str(tmp_path / "out")
    os.makedirs(out)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    take_over(out, {**json.loads(Claim(out, "old")._record()), "token": "old", "pid": int(dead.stdout)})
    claim = Claim(out, "new").acquire()
    assert holder_token(out) == claim.token
    claim.release()


@pytest.mark.slow
def test_a_run_that_lost_its_claim_stops_before_its_manifest_touching_nothing(tmp_path, tiny_nmt_models):
    from tests.toydata import toy_bitext

    bitext = tmp_path / "in.tsv"
    bitext.write_text("".join(f"{s}\t{t}\n" for s, t in toy_bitext(400, seed=31)[:48]))
    out = tmp_path / "out"
    proc = warm_python.popen([sys.executable, "-m", "beam_pipelines.generate",
                              *quick_args(str(bitext), out, tiny_nmt_models)], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": ROOT})
    deadline = time.time() + 300
    while not claim_record(out) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    # another writer takes OUT over (alive: this test's process)
    take_over(out, {"run_id": "the-other", "token": "theirs", "pid": os.getpid()})
    # What the job had written by then; not its staged temporaries (``.plan.json.<hex>.tmp``), which
    # are still being written while this lists and which its rename turns into the real name.
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*")
                    if p.is_file() and not STAGED_LEFTOVER.match(p.name))
    _, err = proc.communicate(timeout=600)
    err = err.decode(errors="replace")
    assert proc.returncode == 75, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "lost its claim" in errors[0], err[-3000:]
    assert not (out / "_manifest.json").exists()
    after = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert set(before) <= after                                   # nothing removed
    assert holder_token(out) == "theirs"                          # their claim left alone


def test_a_heartbeat_that_finds_another_writers_token_says_so_and_stops(tmp_path, monkeypatch):
    """The heartbeat creates the version after its own: another writer's version there means
    another writer took OUT over, and ON_LOST is told (the jobs stop there, exit 75); the
    other's version stays the newest."""
    import threading

    monkeypatch.setenv("PARAGEN_LEASE_SECONDS", "2")                 # a renewal every 0.2 s
    out = str(tmp_path / "out")
    told = threading.Event()
    why = []
    claim = Claim(out, "r1", on_lost=lambda w: (why.append(w), told.set())).acquire()
    with claim._lock:                     # between two renewals, as another writer taking over would be
        take_over(out, {"run_id": "r2", "token": "theirs", "heartbeat": time.time()})
    assert told.wait(10) and "lost its claim" in why[0] and "run r2 holds it now" in why[0]
    time.sleep(0.3)
    assert holder_token(out) == "theirs"                                  # not written over
    claim.release()


@pytest.mark.slow
def test_the_same_command_started_twice_at_once_writes_once(tmp_path, tiny_nmt_models):
    """Two starts of one command (a scheduler's retry while the first still runs, a double click):
    one writes the run, the other exits 75 at once having written nothing; the run is whole."""
    from tests.crash_points import leftovers
    from tests.toydata import toy_bitext

    bitext = tmp_path / "in.tsv"
    bitext.write_text("".join(f"{s}\t{t}\n" for s, t in toy_bitext(400, seed=31)[:24]))
    out = tmp_path / "out"
    args = [sys.executable, "-m", "beam_pipelines.generate", *quick_args(str(bitext), out, tiny_nmt_models)]
    env = {**os.environ, "PYTHONPATH": ROOT}
    procs = [warm_python.popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
             for _ in range(2)]
    ends = [p.communicate(timeout=600) for p in procs]
    statuses = [p.returncode for p in procs]
    assert sorted(statuses) == [0, 75], [e[1].decode(errors="replace")[-2000:] for e in ends]
    busy = ends[statuses.index(75)][1].decode(errors="replace")
    errors = [line for line in busy.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in busy, busy[-2000:]
    manifest = json.load(open(out / "_manifest.json"))
    assert manifest["counts"]["records_read"] == 24 and manifest["counts"]["reconciled"]
    assert not leftovers(str(out)) and not claim_record(out)


_RELEASER = """
import sys
sys.path.insert(0, {root!r})
from paracorpus.commit import Claim
Claim({out!r}, "found-nothing-to-do").acquire().release()
"""


def test_a_claim_made_over_a_releasing_runs_tombstone_survives_that_runs_clean_up(tmp_path):
    """A run that made its output and found nothing to do releases its claim (a tombstone) and
    removes its own versions and the empty folder. Paused (SIGSTOP) just before that clean-up,
    another run claims the output over the tombstone; the first resumes: the second's claim must
    still be there and its own (before: the clean-up removed every claim version in the folder,
    so the second run lost its record while it wrote, and a third could start again at 1)."""
    import signal

    out = str(tmp_path / "out")
    code = _RELEASER.format(root=ROOT, out=out)
    trace = tmp_path / "trace"
    env = {**os.environ, "PYTHONPATH": ROOT, "PARAGEN_STORAGE_TRACE": str(trace)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    ops = [line.split(" ", 3) for line in trace.read_text().splitlines()]
    first_forget = next(int(n) for n, kind, _pid, path in ops if kind == "delete" and "/_log/" in path)
    assert not os.path.exists(out)                  # alone, it leaves nothing
    env = {**os.environ, "PYTHONPATH": ROOT, "PARAGEN_CRASH_AT": f"{first_forget}:STOP"}
    paused = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        assert _until_stopped(paused, 60), "the releasing run never reached its clean-up"
        second = Claim(out, "second").acquire()    # over the first's tombstone
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    assert paused.wait(timeout=120) == 0
    try:
        second.check()                              # its record is still the newest, and its own
        assert claim_record(out)["run_id"] == "second"
    finally:
        second.release()


def test_a_refresh_that_lost_its_lease_creates_nothing_under_its_root(tmp_path):
    """A refresh's lease on ROOT fences every write of its process under ROOT, creates included:
    once another refresh took the lease's next number, this one's generation job cannot claim a
    run folder (OutputBusy, exit 75) and leaves none behind (before: the claim's probe and first
    version were created unfenced, so a paused refresh resumed after the other's retention made
    its run folder again: `runs/<id> (no manifest)` in the crash-point sweep)."""
    from common.storage import versions
    from paracorpus.commit import FENCE_SECONDS

    root = tmp_path / "root"
    lease = Claim(str(root), "r1", name="_refresh.json").acquire()
    try:
        take_over(root, {"run_id": "r2", "token": "another refresh"}, name="_refresh.json")
        time.sleep(FENCE_SECONDS + 0.5)          # the fence's next look (a paused process: the first after it)
        with pytest.raises(OutputBusy, match="lost its claim"):
            Claim(str(root / "runs" / "r1"), "r1").acquire()
        assert not (root / "runs").exists()
        with pytest.raises(OutputBusy):
            versions.write_if(str(root / "latest.json"), b"{}", versions.ABSENT)
        assert sorted(os.listdir(root)) == ["_log"]
    finally:
        lease.release()
