"""The jobs on a real Flink session cluster (tests/flink_cluster.py: a JobManager and two
TaskManagers, each its own JVM, starting their SDK workers through deploy/flink/sdk_worker.sh),
submitted as users submit them: through deploy/run_flink.sh, which starts Beam's Flink job server
from JOB_SERVER_JAR.

- the generation and filter jobs give the DirectRunner's rows, with subtasks on both task managers
  (Flink's REST API);
- a task manager SIGKILLed mid-run: on a cluster with a restart strategy the job restarts on the
  one left and finishes with the rows of an uninterrupted run, nothing doubled or left over; on
  one without (Flink's default) the job said so at its start, fails in one line, and the same
  command continues the run;
- the submitting process SIGTERMed mid-run: the Flink job is cancelled (beam_pipelines/flink.py),
  and the same command continues to the same rows: never two jobs writing one output;
- a scheduled refresh whose jobs run on Flink (paragen-refresh ... -- with the Flink options).

Skipped, with the reason, where scripts/install_flink.sh could not install Flink (no Java or Maven).
"""
import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from beam_pipelines.filter import run as filter_run
from beam_pipelines.generate import run
from tests.crash_points import FILTER, REFRESH, leftovers
from tests.flink_cluster import BOOT, JOB_SERVER_JAR, flink_cluster, missing
from tests.jobs import FILTER_CONFIG, ROOT, committed_rows, quick_args, scored_rows, units_committed
from tests.claims import claim_record

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(missing()), reason=missing() or "")]


@pytest.fixture(scope="module")
def flink(tmp_path_factory):
    with flink_cluster(tmp_path_factory.mktemp("flink")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def bitext(tmp_path_factory):
    """Sixty pairs of the quickstart's example bitext (its malformed lines among them)."""
    lines = open(os.path.join(ROOT, "examples", "cs-en.example.tsv"), encoding="utf-8").read().splitlines()[:60]
    path = tmp_path_factory.mktemp("flink-in") / "in.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def direct(bitext, tiny_nmt_models, tmp_path_factory):
    out = tmp_path_factory.mktemp("direct") / "out"
    manifest = run(quick_args(bitext, out, tiny_nmt_models))
    return out, manifest


def _env(cluster, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "FLINK_MASTER": cluster.master, "ENV_TYPE": "PROCESS", "BOOT": BOOT, "JOB_SERVER_JAR": JOB_SERVER_JAR, "PARALLELISM": "2", "PYTHON": sys.executable, **extra}


def submit(cluster, args: list[str], **extra) -> subprocess.Popen:
    """deploy/run_flink.sh ARGS as a user runs it (its own session: a signal to it is for it alone)."""
    return subprocess.Popen(["bash", os.path.join(ROOT, "deploy", "run_flink.sh"), *args], cwd=ROOT,
                            env=_env(cluster, **extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    _out, err = proc.communicate(timeout=900)
    return proc.returncode, err


def _job_of(cluster, name_part: str) -> dict:
    jobs = [j for j in cluster.jobs() if name_part in j["name"]]
    assert jobs, [j["name"] for j in cluster.jobs()]
    return jobs[-1]


def _wait_for(predicate, proc, what: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"the job ended before {what}:\n{proc.stderr.read()[-3000:]}")
        assert time.monotonic() < deadline, f"{what}: not after {timeout:.0f} s"
        time.sleep(0.2)


def _started(cluster, args: list[str], out) -> subprocess.Popen:
    """The generation job with ARGS submitted to CLUSTER, once two of its units are committed in OUT
    (mid-run)."""
    proc = submit(cluster, args)
    _wait_for(lambda: units_committed(out) >= 2, proc, "two units committed")
    return proc


def _two_taskmanagers(cluster) -> None:
    """Back to two task managers after a test killed one (a supervisor restarting a lost machine)."""
    alive = [tm for tm in cluster.taskmanagers if tm.poll() is None]
    cluster.taskmanagers[:] = alive
    while len(cluster.taskmanagers) < 2:
        cluster.start_taskmanager()
    cluster.wait(lambda: cluster.overview().get("taskmanagers") == 2 and cluster.overview().get("slots-available") == 4,
                 "two task managers with free slots", 180)


def test_generation_and_filter_jobs_on_flink_give_the_direct_runners_rows_on_both_task_managers(
        flink, bitext, tiny_nmt_models, direct, tmp_path):
    out = tmp_path / "flink"
    status, err = finish(submit(flink, quick_args(bitext, out, tiny_nmt_models)))
    assert status == 0, err[-3000:]
    manifest = json.load(open(out / "_manifest.json"))
    assert manifest["counts"] == direct[1]["counts"] and manifest["counts"]["reconciled"]
    assert committed_rows(out) == committed_rows(direct[0])
    assert committed_rows(out, "rejects") == committed_rows(direct[0], "rejects")
    assert not leftovers(str(out))
    job = _job_of(flink, f"paragen-generate-{manifest['run_id']}")
    assert job["state"] == "FINISHED"
    assert len(flink.taskmanagers_of(job["jid"])) == 2, "both task managers ran subtasks"

    config = tmp_path / "filter.yaml"
    config.write_text(FILTER_CONFIG)
    args = ["--input", str(out), "--config", str(config)]
    filter_run([*args, "--output", str(tmp_path / "f-direct")])
    status, err = finish(submit(flink, [*args, "--output", str(tmp_path / "f-flink")], JOB="filter"))
    assert status == 0, err[-3000:]
    scored = scored_rows(tmp_path / "f-direct")
    assert scored_rows(tmp_path / "f-flink") == scored and any(r[2] for r in scored)
    assert not leftovers(str(tmp_path / "f-flink"), FILTER)
    assert _job_of(flink, "paragen-filter-")["state"] == "FINISHED"


def test_a_task_manager_lost_mid_run_is_restarted_around_and_the_rows_are_whole(
        bitext, tiny_nmt_models, direct, tmp_path):
    out = tmp_path / "out"
    # a cluster of its own whose configuration restarts a failed job (15 s apart: after the lost
    # task manager's heartbeat timed out, 12 s). Five attempts: on a loaded machine a restart can
    # come before the job manager has given up on the lost task manager, and fail again there
    # (seen: two restarts under a load of 6 on 2 cores)
    with flink_cluster(tmp_path / "flink", restarts=(5, 15000)) as flink:
        proc = _started(flink, quick_args(bitext, out, tiny_nmt_models), out)
        flink.kill_taskmanager(flink.taskmanagers[0])
        status, err = finish(proc)
        assert status == 0, err[-3000:]
        assert "has no restart strategy" not in err
        manifest = json.load(open(out / "_manifest.json"))
        job = _job_of(flink, f"paragen-generate-{manifest['run_id']}")
        assert job["state"] == "FINISHED" and flink.restarted(job["jid"])
    assert manifest["counts"] == direct[1]["counts"]
    assert committed_rows(out) == committed_rows(direct[0])                       # nothing doubled, nothing lost
    assert not leftovers(str(out)) and not (out / "_work").exists()


def test_without_restarts_a_lost_task_manager_fails_the_job_in_one_line_and_the_same_command_continues(
        flink, bitext, tiny_nmt_models, direct, tmp_path):
    _two_taskmanagers(flink)
    out = tmp_path / "out"
    args = quick_args(bitext, out, tiny_nmt_models)
    proc = _started(flink, args, out)
    flink.kill_taskmanager(flink.taskmanagers[0])
    status, err = finish(proc)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert status == 1 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
    assert "run the same command again to continue" in errors[0], errors
    assert "has no restart strategy (restart-strategy.type)" in err           # said at the start
    done = units_committed(out)
    assert not (out / "_manifest.json").exists()
    _two_taskmanagers(flink)
    status, err = finish(submit(flink, args))
    assert status == 0, err[-3000:]
    manifest = json.load(open(out / "_manifest.json"))
    assert manifest["resumed"] and manifest["units"]["reused_from_earlier_attempt"] == done
    assert committed_rows(out) == committed_rows(direct[0])
    assert not leftovers(str(out))


def test_a_stopped_submission_cancels_its_flink_job_and_the_same_command_continues(
        flink, bitext, tiny_nmt_models, direct, tmp_path):
    _two_taskmanagers(flink)
    out = tmp_path / "out"
    args = quick_args(bitext, out, tiny_nmt_models)
    proc = _started(flink, args, out)
    run_id = os.listdir(out / "_work")[0]
    os.killpg(proc.pid, signal.SIGTERM)
    status, err = finish(proc)
    assert status == 128 + signal.SIGTERM, err[-3000:]
    job = _job_of(flink, f"paragen-generate-{run_id}")
    flink.wait(lambda: _job_of(flink, run_id)["state"] == "CANCELED", "the Flink job cancelled", 120)
    assert not claim_record(out)
    status, err = finish(submit(flink, args))
    assert status == 0, err[-3000:]
    manifest = json.load(open(out / "_manifest.json"))
    assert manifest["run_id"] == run_id and manifest["resumed"]
    assert committed_rows(out) == committed_rows(direct[0])
    assert not leftovers(str(out))
    assert [j["state"] for j in flink.jobs() if run_id in j["name"]] == ["CANCELED", "FINISHED"], job


def test_a_refresh_runs_its_jobs_on_flink(flink, tiny_nmt_models, tmp_path):
    from tests.jobs import refresh_job_args
    from tests.toydata import toy_bitext

    _two_taskmanagers(flink)
    bitext, root = tmp_path / "bitext", tmp_path / "root"
    bitext.mkdir()
    (bitext / "a.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in toy_bitext(60, seed=41)[:10]))
    config = tmp_path / "filter.yaml"
    config.write_text(FILTER_CONFIG)
    flink_args = ["--runner", "FlinkRunner", "--flink_master", flink.master, "--flink_version", "1.19",
                  "--flink_job_server_jar", JOB_SERVER_JAR, "--environment_type", "PROCESS",
                  "--environment_config", json.dumps({"command": BOOT}), "--parallelism", "2"]
    # the generation job's options after --, the filter job's in --filter_args: both on Flink
    done = subprocess.run([sys.executable, "-m", "beam_pipelines.refresh", "--root", str(root),
                           "--filter_args=" + shlex.join(["--config", str(config), *flink_args]), "--", "--input", str(bitext),
                           *refresh_job_args(tiny_nmt_models), *flink_args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr[-3000:]
    latest = json.load(open(root / "latest.json"))
    names = [j["name"] for j in flink.jobs() if j["state"] == "FINISHED"]
    assert any(latest["run_id"] in n and n.startswith("paragen-generate-") for n in names), names
    assert any(n.startswith("paragen-filter-") for n in names), names
    assert leftovers(str(root), REFRESH) == []
