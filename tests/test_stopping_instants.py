"""A stop at the instants the fault table of issue 41 did not cover (issue 53): a second signal,
a signal right after the manifest, a stop whose listing of the committed units would outlast the
grace period. Each ends in one line within the grace period, with nothing left to hold the output
(no claim), and the same command then finishes the run (its clean-up too)."""
import os
import signal
import sys
import time

import pytest

from tests.jobs import committed_rows, quick_args, start_job, units_committed, wait_for
from tests.claims import claim_record
from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MULTI = ("--direct_running_mode", "multi_processing", "--direct_num_workers", "2")
pytestmark = pytest.mark.slow          # whole jobs on the tiny NMT models


@pytest.fixture(scope="module")
def bitext(tmp_path_factory):
    from tests.toydata import toy_bitext

    path = tmp_path_factory.mktemp("in") / "toy.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in toy_bitext(400, seed=31)[:48]))
    return str(path)


_job, _units, _wait_for = start_job, units_committed, wait_for


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def _rerun_finishes(args, out, want_rows):
    done = warm_python.run([sys.executable, "-m", "beam_pipelines.generate", *args], cwd=ROOT, capture_output=True,
                           text=True, timeout=600, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr[-3000:]
    assert committed_rows(out) == want_rows
    assert not (out / "_work").exists() and not claim_record(out)
    return done


@pytest.fixture(scope="module")
def uninterrupted(bitext, tiny_nmt_models, tmp_path_factory):
    from beam_pipelines.generate import run

    out = tmp_path_factory.mktemp("whole")
    run(quick_args(bitext, out, tiny_nmt_models))
    return committed_rows(out)


def test_a_second_sigterm_ends_the_job_at_once_in_one_line_and_frees_the_output(bitext, tiny_nmt_models, tmp_path,
                                                                                   uninterrupted):
    """Two SIGTERMs 0.3 s apart while two worker processes decode: one line within seconds (it
    used to be none, after the 20-s deadline), exit 143, no owner record left for the next
    start to wait out."""
    out = tmp_path / "out"
    args = quick_args(bitext, out, tiny_nmt_models, *MULTI)
    proc = _job(args)
    _wait_for(lambda: _units(out) >= 2, proc)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    err = err.decode(errors="replace")
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, err[-2000:])
    errors = _errors(err)
    assert len(errors) == 1 and "stopped by SIGTERM" in errors[0], err[-2000:]
    # ended by the second signal (or by a first stop that was already through), not by the 20-s
    # deadline, whose line says "outlasted": the job's clock, not a bound that load could break
    assert "outlasted" not in errors[0], errors[0]
    assert not claim_record(out)
    _rerun_finishes(args, out, uninterrupted)


def test_a_signal_while_the_manifest_is_written_reports_the_run_published_and_the_rerun_cleans_up(
        bitext, tiny_nmt_models, tmp_path, uninterrupted):
    """SIGTERM at the instant the manifest is written (the job sends it to itself just before that
    write: common/crash_points.py): the manifest is finished, the line says the run is published
    and its clean-up left for the next start; the same command then removes the unit files and
    _work and exits 0."""
    out = tmp_path / "out"
    args = quick_args(bitext, out, tiny_nmt_models)
    proc = _job(args, env={"PARAGEN_CRASH_AT": "~_manifest.json:TERM"})
    _, err = proc.communicate(timeout=600)
    err = err.decode(errors="replace")
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    errors = _errors(err)
    assert len(errors) == 1 and "published" in errors[0] and "run the same command again to finish" in errors[0], err
    assert committed_rows(out) == uninterrupted                 # readers see the whole run
    assert (out / "_work").exists() and not claim_record(out)
    done = _rerun_finishes(args, out, uninterrupted)
    assert "clean-up" in done.stdout + done.stderr
