"""The commit protocol of the generation job: a killed run leaves nothing readers can see and
resumes to the rows of an uninterrupted run; a failed rerun leaves the previous run whole; a
second writer is refused; one failing pair is a reject, not a failed unit."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from beam_pipelines.generate import run
from common import storage
from common.cli import OutputBusy, UsageError
from paracorpus.commit import committed_files
from paracorpus.runs import open_input
from tests.jobs import committed_rows, quick_args, units_committed
from tests.claims import claim_record, run_files
from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def bitext(tmp_path_factory):
    from tests.toydata import toy_bitext

    path = tmp_path_factory.mktemp("in") / "toy.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in toy_bitext(400, seed=21)[:48]))
    return str(path)


_args, _rows = quick_args, committed_rows


def _start(args, env=None):
    return warm_python.popen([sys.executable, "-m", "beam_pipelines.generate", *args], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                             env={**os.environ, **(env or {})})


def _wait_for(predicate, proc, timeout=300):
    deadline = time.time() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"the job ended before the point the test waits for:\n{proc.stderr.read().decode()[-3000:]}")
        if time.time() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.2)


# Completion records only: a record staged under a hidden name (``.u000004.json.<hex>.tmp``) when
# the kill came is not one, and counting it made this test fail by chance (4 counted, 3 reused).
_finished_units = units_committed


def _kill(proc):
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture(scope="module")
def uninterrupted(bitext, tiny_nmt_models, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    manifest = run(_args(bitext, out, tiny_nmt_models))
    assert manifest["units"]["planned"] == 12 and manifest["counts"]["reconciled"]
    return out, manifest


def _resumes_to_the_uninterrupted_run(bitext, models, out, uninterrupted) -> None:
    """After a kill: nothing a reader would take for a corpus; the same command (with --resume)
    reuses exactly the completion records that are whole on disk and gives the uninterrupted
    run's rows, with nothing left over."""
    assert _finished_units(out) < 12
    assert not (out / "_manifest.json").exists()
    with pytest.raises(UsageError, match="without its manifest"):
        open_input(str(out))
    with pytest.raises(FileNotFoundError):
        committed_files(str(out), "paraphrases")
    done_before = _finished_units(out)
    manifest = run(_args(bitext, out, models, "--resume"))
    assert manifest["resumed"] and manifest["units"]["reused_from_earlier_attempt"] == done_before
    assert manifest["counts"] == uninterrupted[1]["counts"]
    assert _rows(out) == _rows(uninterrupted[0])
    assert _rows(out, "rejects") == _rows(uninterrupted[0], "rejects")
    on_disk = run_files(out)
    listed = sorted(e["path"] for t in manifest["files"].values() for e in t)
    assert on_disk == sorted(listed + ["_manifest.json"])        # the killed attempt's leftovers are gone


@pytest.mark.slow
def test_kill_mid_run_then_resume_gives_the_uninterrupted_rows(bitext, tiny_nmt_models, tmp_path, uninterrupted):
    """SIGKILL of the whole process group at an instant the test does not choose."""
    out = tmp_path / "out"
    proc = _start(_args(bitext, out, tiny_nmt_models))
    _wait_for(lambda: _finished_units(out) >= 4, proc)
    _kill(proc)
    _resumes_to_the_uninterrupted_run(bitext, tiny_nmt_models, out, uninterrupted)


# Kill instants inside one unit's commit (common/crash_points.py; the in-memory runner does every
# storage operation in the job's own process): its first Parquet file about to be written; its files
# written and its completion record about to be; the record written and synced under its hidden
# name, not yet renamed into place (the instant the old count took for a finished unit).
KILL_INSTANTS = {"before its files": "*part-u000005-:KILL", "before its record": "~units/u000005.json@1:KILL",
                 "record staged, not renamed": "~units/u000005.json@2:KILL"}


@pytest.mark.slow
@pytest.mark.parametrize("instant", sorted(KILL_INSTANTS))
def test_a_kill_at_each_instant_of_a_units_commit_resumes_reusing_the_whole_records(
        instant, bitext, tiny_nmt_models, tmp_path, uninterrupted):
    out = tmp_path / "out"
    proc = _start(_args(bitext, out, tiny_nmt_models), env={"PARAGEN_CRASH_AT": KILL_INSTANTS[instant]})
    proc.wait(timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-3000:]
    names = [n for _, _, ns in os.walk(out / "_work") for n in ns]
    assert "u000005.json" not in names                            # killed before its record was in place
    assert any(n.startswith(".u000005.json.") for n in names) == (instant == "record staged, not renamed")
    _resumes_to_the_uninterrupted_run(bitext, tiny_nmt_models, out, uninterrupted)


@pytest.mark.slow
def test_a_failed_overwrite_leaves_the_previous_run_whole(bitext, tiny_nmt_models, tmp_path, uninterrupted):
    import shutil

    out = tmp_path / "out"
    shutil.copytree(uninterrupted[0], out)
    before = (_rows(out), json.load(open(out / "_manifest.json")))
    proc = _start(_args(bitext, out, tiny_nmt_models, "--overwrite", "--seed", "5"))
    _wait_for(lambda: _finished_units(out) >= 3, proc)
    _kill(proc)                                      # the rerun fails half way
    assert (_rows(out), json.load(open(out / "_manifest.json"))) == before
    assert [f for f in committed_files(str(out), "paraphrases") if not os.path.exists(f)] == []
    # the next run commits over both and cleans up after the dead attempt
    manifest = run(_args(bitext, out, tiny_nmt_models, "--overwrite", "--seed", "5"))
    assert manifest["run_id"] != before[1]["run_id"] and _rows(out) != before[0]
    assert not (out / "_work").exists() and not claim_record(out)


@pytest.mark.slow
def test_a_second_writer_is_refused_while_the_first_runs(bitext, tiny_nmt_models, tmp_path):
    out = tmp_path / "out"
    proc = _start(_args(bitext, out, tiny_nmt_models))
    _wait_for(lambda: claim_record(out) is not None, proc)
    owner = claim_record(out)
    with pytest.raises(OutputBusy, match=f"is being written by run {owner['run_id']}") as busy:
        run(_args(bitext, out, tiny_nmt_models, "--overwrite"))
    assert busy.value.code == 75                     # EX_TEMPFAIL: a scheduler tries again later
    assert proc.wait(timeout=600) == 0, proc.stderr.read().decode()[-3000:]
    manifest = json.load(open(out / "_manifest.json"))
    assert manifest["run_id"] == owner["run_id"] and manifest["counts"]["reconciled"]
    assert not claim_record(out)


@pytest.mark.slow
def test_a_failing_pair_is_a_reject_and_its_units_other_pairs_are_written(fwd, bwd):
    """One pair whose decoding raises (as an out-of-memory error would) is retried alone and
    rejected with the error; the other pairs of its batch and unit get their paraphrases."""
    import dataclasses

    from paracorpus.config import PRESETS
    from paracorpus.paraphrasing import piece_limits
    from paracorpus.steps import decoding_steps
    from paracorpus.units import PAIR, REJECT, generate_unit
    from tests.toydata import toy_bitext

    class FailsOn:
        """The forward translator, except that sampling raises for one source."""

        def __init__(self, inner, bad):
            self.inner, self.bad = inner, bad

        def sample(self, requests, **kw):
            if any(r.source == self.bad for r in requests):
                raise MemoryError("out of memory while sampling")
            return self.inner.sample(requests, **kw)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    pairs = toy_bitext(400, seed=22)[:6]
    elements = [(PAIR, {"pair_id": f"{i:016x}", "input_shard": "t.tsv", "input_index": i, "source": s,
                        "reference": t}) for i, (s, t) in enumerate(pairs)]
    elements.append((REJECT, {"pair_id": "f" * 16, "input_shard": "t.tsv", "input_index": 9, "stage": "clean",
                              "reason": "empty_src", "detail": None, "source": "", "reference": "x",
                              "config_hash": "h", "lang_pair": None, "shard": None}))
    cfg = dataclasses.replace(PRESETS["parabank2-cpu"], num_sets=1, num_samples=3, score_threshold=None,
                              dual_xent_threshold=None, batch_pairs=6)
    forward = FailsOn(fwd, pairs[2][0])
    steps = decoding_steps(forward, bwd, cfg, "h", piece_limits(fwd, bwd, 250))
    result = generate_unit(elements, steps, cfg.batch_pairs, "h")
    rejected = {r["input_index"]: r for r in result.rejects}
    assert rejected[2]["reason"] == "decode_error" and "MemoryError: out of memory" in rejected[2]["detail"]
    assert rejected[9]["reason"] == "empty_src"
    with_rows = {r["input_index"] for r in result.rows}
    assert with_rows | set(rejected) == {0, 1, 2, 3, 4, 5, 9} and 2 not in with_rows
    assert result.counters["batches_retried_pair_by_pair"] == 1
