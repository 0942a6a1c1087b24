"""A refresh root on the paths users take (issue 57): retention never removes a file a kept run or
``latest`` reads, whatever the filter settings; the ``latest/`` view never shows two runs at once;
a refresh paused past its lease cannot move ``latest``. Stops are real signals at the refresh's
own storage operations (common/crash_points.py)."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from paracorpus.schema import FILTER_MANIFEST, MANIFEST
from tests.jobs import ROOT

# Publishing run sys.argv[2] in root sys.argv[1], as a refresh does (paracorpus/latest.py), under the
# refresh's lease when sys.argv[3] is "lease".
_PUBLISH = """
import sys
from common.cli import OutputBusy
from paracorpus.commit import Claim
from paracorpus.latest import Latest
root, run_id = sys.argv[1], sys.argv[2]
lease = Claim(root, "refresh-" + run_id, name="_refresh.json").acquire() if sys.argv[3] == "lease" else None
try:
    latest = Latest(root)
    latest.publish(run_id)
except OutputBusy as exc:
    print("error:", exc, file=sys.stderr)
    sys.exit(75)
if lease:
    lease.release()
"""


def _publish(root, run_id, env=None, lease=False, wait=True):
    proc = subprocess.Popen([sys.executable, "-c", _PUBLISH, str(root), run_id, "lease" if lease else "-"], cwd=ROOT,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": ROOT, **(env or {})})
    if wait:
        proc.out, proc.err = proc.communicate(timeout=120)
    return proc


def _root(tmp_path, runs=("r1", "r2"), filtered=True):
    """A refresh root with synthetic committed runs (each a generation run and a filter run)."""
    from paracorpus.commit import attempt_id
    from paracorpus.schema import PARAPHRASES
    from paracorpus.units import _write_table
    from tests.toydata import paraphrase_rows, toy_paraphrases

    root = tmp_path / "root"
    for i, run_id in enumerate(runs):
        run_dir = root / "runs" / run_id
        files = _write_table(str(run_dir), PARAPHRASES, paraphrase_rows(toy_paraphrases(20, seed=i)), "cs-en", 0, 0,
                             attempt_id())
        (run_dir / MANIFEST).write_text(json.dumps({"run_id": run_id, "files": {"paraphrases": files}}))
        if filtered:
            (root / "filtered" / run_id).mkdir(parents=True)
            (root / "filtered" / run_id / FILTER_MANIFEST).write_text(json.dumps(
                {"run_id": f"f-{run_id}", "input_run_id": run_id, "files": {"scored": []}}))
    return root


def _view(root):
    """(the run latest/ shows, the run its filter view filtered) (None where absent)."""
    gen = root / "latest" / MANIFEST
    filt = root / "latest" / "filtered" / FILTER_MANIFEST
    return (json.loads(gen.read_text())["run_id"] if gen.exists() else None,
            json.loads(filt.read_text())["input_run_id"] if filt.exists() else None)


def test_retention_follows_the_references_of_every_kept_run(tmp_path):
    """A refresh that gains --filter_args and finds nothing new: the current run r2 has no filter
    run, so it was not counted as committed and the runs it takes files from were not followed:
    r1, which holds files latest reads, was removed. Every file latest lists stays."""
    from paracorpus.commit import committed_files
    from paracorpus.latest import prune, publish_latest

    root = _root(tmp_path, runs=("r1",), filtered=False)
    r1_files = json.loads((root / "runs" / "r1" / MANIFEST).read_text())["files"]["paraphrases"]
    (root / "runs" / "r2").mkdir()
    (root / "runs" / "r2" / MANIFEST).write_text(json.dumps({"run_id": "r2", "files": {"paraphrases": [
        {**f, "path": "../r1/" + f["path"]} for f in r1_files]}}))
    (root / "runs" / "r0").mkdir()                                     # an old run nothing reads
    (root / "runs" / "r0" / MANIFEST).write_text(json.dumps({"run_id": "r0", "files": {}}))
    publish_latest(str(root), "r2")
    assert prune(str(root), 1, True, "r2") == ["r0"]
    files = committed_files(str(root / "latest"), "paraphrases")
    assert files and all(os.path.isfile(f) for f in files)


def test_retention_never_removes_a_run_whose_claim_is_alive(tmp_path):
    """An unpublished run with a live holder (a --job_cmd job still writing it) stays; one whose
    holder's process has ended goes, as any unpublished run."""
    from paracorpus.commit import Claim
    from paracorpus.latest import prune

    root = _root(tmp_path, runs=("r1", "r2"), filtered=False)
    for name in ("r3", "r4"):
        (root / "runs" / name).mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    from common import processes
    from tests.claims import take_over
    take_over(root / "runs" / "r4", {"run_id": "r4", "token": "t", **processes.identity(), "pid": int(dead.stdout),
                                     "heartbeat": time.time()})
    claim = Claim(str(root / "runs" / "r3"), "r3").acquire()
    try:
        assert prune(str(root), 1, False, "r2") == ["r1", "r4"]
        assert sorted(os.listdir(root / "runs")) == ["r2", "r3"]
    finally:
        claim.release()


def test_the_latest_view_never_shows_two_runs(tmp_path):
    """latest/ moved from r1 to r2, killed before each of its storage operations in turn: the
    view shows r1 whole, r2 whole, or a run whose filter view is not there yet, never one run's
    manifest beside another's filter run (the old order wrote r2's filter view first)."""
    import shutil

    from paracorpus.latest import publish_latest

    base = _root(tmp_path)
    publish_latest(str(base), "r1")
    trace = tmp_path / "trace.txt"
    traced = tmp_path / "traced"
    shutil.copytree(base, traced)
    _publish(traced, "r2", {"PARAGEN_STORAGE_TRACE": str(trace)})
    assert _view(traced) == ("r2", "r2")
    ops = len(trace.read_text().splitlines())
    seen = set()
    for n in range(1, ops + 1):
        root = tmp_path / f"p{n}"
        shutil.copytree(base, root)
        proc = _publish(root, "r2", {"PARAGEN_CRASH_AT": f"{n}:KILL"})
        assert proc.returncode == -9
        view = _view(root)
        assert view in {("r1", "r1"), ("r2", "r2"), ("r1", None), ("r2", None)}, (n, view)
        seen.add(view)
        again = _publish(root, "r2")                                   # the next refresh's repair
        assert again.returncode == 0 and _view(root) == ("r2", "r2")
    assert ("r1", "r1") in seen and ops >= 3


@pytest.mark.parametrize("store", ["local"])
def test_a_refresh_paused_past_its_lease_cannot_move_latest(tmp_path, store):
    """Refresh A holds the lease and stops just before it creates latest's next version; refresh B
    takes the lease over once it is stale and publishes r3; A resumes: that number is taken (exit
    75), latest stays r3 (the first code moved latest back to A's run)."""
    from tests.test_fencing import LEASE, _stopped

    root = _root(tmp_path, runs=("r1", "r2", "r3"))
    env = {"PARAGEN_LEASE_SECONDS": LEASE}
    a = _publish(root, "r2", {**env, "PARAGEN_CRASH_AT": "~-latest.json:STOP"}, lease=True, wait=False)
    try:
        _stopped(a)
        time.sleep(float(LEASE) + 1)
        b = _publish(root, "r3", env, lease=True)
        assert b.returncode == 0, b.err[-2000:]
    finally:
        a.send_signal(signal.SIGCONT)
    _out, err = a.communicate(timeout=60)
    assert a.returncode == 75 and "moved by another refresh" in err, err[-2000:]
    assert json.loads((root / "latest.json").read_text())["run_id"] == "r3" and _view(root) == ("r3", "r3")


_TINY_RUN_JOB = """
import json, os, sys
import pyarrow as pa
import pyarrow.parquet as pq
from common import storage
out = sys.argv[sys.argv.index("--output") + 1]
os.makedirs(os.path.join(out, "paraphrases"), exist_ok=True)
pq.write_table(pa.table({"row": [os.path.basename(out)]}), os.path.join(out, "paraphrases", "part-0.parquet"))
manifest = {"run_id": os.path.basename(out), "files": {"paraphrases": [{"path": "paraphrases/part-0.parquet"}]}}
storage.write_if(os.path.join(out, "_manifest.json"), json.dumps(manifest).encode(), storage.ABSENT)
"""


@pytest.mark.parametrize("retain, kept", [(None, True), ("0", False)])
def test_a_reader_holding_an_old_manifest_outlasts_three_refreshes(tmp_path, monkeypatch, retain, kept):
    """A reader opens the run latest names and reads its files slowly; three refreshes with
    --keep 1 pass meanwhile. Retention keeps every run a version of latest written in the last
    --retain hours named (default 24), so the reader's files are all there; with --retain 0
    (retention by --keep alone, as before) the run the reader holds is gone."""
    import pyarrow.parquet as pq

    from beam_pipelines.refresh import run as refresh
    from paracorpus.commit import committed_files
    from paracorpus.latest import latest_run

    monkeypatch.setenv("PYTHONPATH", ROOT)
    job = tmp_path / "job.py"
    job.write_text(_TINY_RUN_JOB)
    root = str(tmp_path / "root")
    args = ["--root", root, "--keep", "1", *(["--retain", retain] if retain else []),
            "--job_cmd", f"{sys.executable} {job}", "--", "--input", "x"]
    refresh(args)
    reading = committed_files(latest_run(root), "paraphrases")          # the reader opened its manifest
    for _ in range(3):
        time.sleep(1.1)             # run ids sort by the second they start in (then by a random part)
        refresh(args)
    assert all(os.path.exists(f) for f in reading) == kept
    if kept:
        assert [pq.read_table(f).num_rows for f in reading] == [1]
    assert len(os.listdir(os.path.join(root, "runs"))) == (4 if kept else 1)
