"""The path a Flink submission takes on the Python side, without Flink: `LOCAL=1
deploy/run_flink.sh` submits the jobs with --runner PortableRunner to Beam's own Python job
service, artifacts staged (--setup_file), and an EXTERNAL worker pool runs them in SDK harness
processes that share nothing with the submitter. The generation job's rows and the filter job's
scores equal those of a DirectRunner run of the same command."""
import os
import subprocess

import pytest

from beam_pipelines.filter import run as filter_run
from beam_pipelines.generate import run
from tests.jobs import FILTER_CONFIG, committed_rows, quick_args, scored_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
def _portable(job: str, args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "LOCAL": "1", "JOB": job}
    env.pop("PYTHONPATH", None)
    return subprocess.run(["bash", os.path.join(ROOT, "deploy", "run_flink.sh"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_jobs_submitted_through_the_portable_job_api_give_the_direct_runners_rows(tiny_nmt_models, tmp_path):
    from tests.toydata import toy_bitext

    bitext = tmp_path / "toy.tsv"
    bitext.write_text("".join(f"{s}\t{t}\n" for s, t in toy_bitext(60, seed=31)[:24]))
    run(quick_args(str(bitext), tmp_path / "direct", tiny_nmt_models))
    done = _portable("generate", quick_args(str(bitext), tmp_path / "portable", tiny_nmt_models))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Beam job service at localhost:" in done.stderr and "state DONE" in done.stderr
    direct = committed_rows(tmp_path / "direct")
    assert len(direct) > 50 and committed_rows(tmp_path / "portable") == direct

    config = tmp_path / "filter.yaml"
    config.write_text(FILTER_CONFIG)
    args = ["--input", str(tmp_path / "portable"), "--config", str(config)]
    filter_run([*args, "--output", str(tmp_path / "f-direct")])
    done = _portable("filter", [*args, "--output", str(tmp_path / "f-portable")])
    assert done.returncode == 0, done.stderr[-3000:]
    scored = scored_rows(tmp_path / "f-direct")
    assert scored_rows(tmp_path / "f-portable") == scored and any(r[2] for r in scored) and not all(r[2] for r in scored)


def test_the_local_mode_chooses_the_runner_itself(tmp_path):
    done = _portable("generate", ["--runner", "DirectRunner", "--input", "x", "--output", str(tmp_path / "o")])
    assert done.returncode == 2 and "leave --runner out" in done.stderr
    assert not (tmp_path / "o").exists()
