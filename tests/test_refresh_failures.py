"""How a refresh fails: with the cause in its one line, a status that tells a mistake (2) and an
empty run (3) from other failures (1), never a silent success when its job wrote nothing, and a
filter mistake found before the generation run, not after it."""
import json
import os
import shlex
import sys

import pytest

from beam_pipelines.refresh import run as refresh
from paracorpus.latest import LATEST
from common.cli import JobFailed, OutputBusy, UsageError, cli_main
from tests.claims import claim_record


def _script(tmp_path, body: str) -> str:
    """A --job_cmd value running BODY (a Python snippet) with the job's arguments in sys.argv."""
    path = tmp_path / "job.py"
    path.write_text("import json, os, sys\n" + body)
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(path))}"


def _refresh(tmp_path, job_cmd, *extra):
    return refresh(["--root", str(tmp_path / "root"), "--job_cmd", job_cmd, *extra, "--", "--input", "x"])


def test_a_job_that_exits_0_without_a_run_is_a_failure_not_a_noop(tmp_path):
    with pytest.raises(JobFailed, match="exited 0 but published no run") as info:
        _refresh(tmp_path, _script(tmp_path, "sys.exit(0)\n"))
    assert info.value.code == 1
    assert not (tmp_path / "root" / LATEST).exists()


def test_a_job_that_says_nothing_changed_is_a_noop(tmp_path):
    job = _script(tmp_path, "json.dump({'noop': True}, open(os.environ['PARAGEN_NOOP_MARKER'], 'w'))\n")
    result = _refresh(tmp_path, job)
    assert result["noop"] is True
    assert os.listdir(tmp_path / "root" / "logs") == [f"{result['run_id']}.log"]     # the marker is gone


@pytest.mark.parametrize("status, code", [(2, 2), (3, 3), (1, 1), (9, 1)])
def test_a_failed_job_gives_its_cause_and_a_status_a_scheduler_can_read(tmp_path, capsys, status, code):
    job = _script(tmp_path, f"print('working...')\nprint('error: shard x.tsv is not bitext', file=sys.stderr)\n"
                            f"sys.exit({status})\n")
    rc = cli_main(refresh, ["--root", str(tmp_path / "root"), "--job_cmd", job, "--", "--input", "x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == code and len(err) == 1, err
    assert f"generation job failed (exit {status}): shard x.tsv is not bitext; latest unchanged" in err[0]
    assert str(tmp_path / "root" / "logs") in err[0]


def test_a_filter_mistake_is_found_before_the_generation_run(tmp_path):
    marker = tmp_path / "generation-ran"
    job = _script(tmp_path, f"open({str(marker)!r}, 'w').close()\n")
    for filter_args, message in ((f"--config {tmp_path / 'missing.yaml'}", "no config file or preset"),
                                 ("--confg paranmt", "unknown option"),
                                 ("--input elsewhere", "--input is set by the refresh")):
        with pytest.raises(UsageError, match=message):
            _refresh(tmp_path, job, f"--filter_args={filter_args}")
        assert not marker.exists()


def test_referenced_runs_follow_relative_paths(tmp_path):
    from paracorpus.latest import referenced_runs

    run_dir = tmp_path / "runs" / "r3"
    run_dir.mkdir(parents=True)
    files = {"paraphrases": [{"path": "paraphrases/cs-en/00000/part-u0-a.parquet"},
                             {"path": "../r1/paraphrases/cs-en/00001/part-u1-b.parquet"}],
             "dedup": [{"path": "../r2/dedup/cs-en/00001/part-u1-c.parquet"}],
             "rejects": [{"path": "/elsewhere/rejects/cs-en/00000/part-u0-d.parquet"}]}
    (run_dir / "_manifest.json").write_text(json.dumps({"files": files}))
    assert referenced_runs(str(run_dir)) == {"r1", "r2"}
    # a contract-2 manifest names them by root
    (run_dir / "_manifest.json").write_text(json.dumps({"files": {"paraphrases": [
        {"path": "paraphrases/cs-en/00001/part-u1-b.parquet", "root": "r1"}]}}))
    assert referenced_runs(str(run_dir)) == {"r1"}


def test_a_run_whose_holder_is_alive_is_neither_continued_nor_removed(tmp_path):
    """A run newer than latest whose claim is alive (a --job_cmd job of an earlier refresh still
    writing it; here this process holds it): the refresh exits 75 without running its job, and
    the run stays. (Before: a new run, then retention deleted the live job's folder.)"""
    from paracorpus.commit import Claim, new_run_id

    marker = tmp_path / "generation-ran"
    run_dir = tmp_path / "root" / "runs" / new_run_id()
    claim = Claim(str(run_dir), run_dir.name).acquire()
    try:
        with pytest.raises(OutputBusy, match=f"run {run_dir.name} of an earlier refresh is still being written") as info:
            _refresh(tmp_path, _script(tmp_path, f"open({str(marker)!r}, 'w').close()\n"))
        assert info.value.code == 75 and not marker.exists()
        assert claim_record(run_dir)
    finally:
        claim.release()
