"""What the SLURM tests share: a real SLURM started for a test module (tests/slurm_cluster.py),
the inputs and local runs they compare with, and how they submit and watch jobs."""
import os
import subprocess
import sys
import time

import pytest

from beam_pipelines.generate import run
from tests.jobs import committed_rows, quick_args
from tests.slurm_cluster import missing, slurm_cluster

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Units of four pairs (tests/jobs.py's quick_args): enough that a run outlasts the steps a test
# takes in its middle (a worker job cancelled, seen gone from the queue, replaced; a requeue)
UNITS = 32


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    why = missing()
    if why:
        pytest.skip(f"no SLURM here: {why}")
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def bitext(tmp_path_factory):
    from tests.toydata import toy_bitext

    path = tmp_path_factory.mktemp("in") / "toy.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in toy_bitext(400, seed=31)[:4 * UNITS]))
    return str(path)


@pytest.fixture(scope="module")
def local_run(bitext, tiny_nmt_models, tmp_path_factory):
    """An uninterrupted run on this machine (DirectRunner, in memory): its folder."""
    out = tmp_path_factory.mktemp("local") / "out"
    run(quick_args(bitext, out, tiny_nmt_models))
    return out


@pytest.fixture(scope="module")
def local_rows(local_run):
    rows = committed_rows(local_run)
    assert len(rows) > 100
    return rows


def submit(slurm, script, log, *args, sbatch=()) -> str:
    done = slurm.run("sbatch", "--parsable", f"--output={log}", *sbatch,
                     os.path.join(ROOT, "deploy", "slurm", script), *args)
    return done.stdout.strip().split(";")[0]


def wait_for(what, timeout=300, slurm=None, job=None):
    deadline = time.time() + timeout
    while not what():
        if slurm is not None and job is not None:
            state = slurm.job(job).get("JobState")
            assert state in ("RUNNING", "PENDING", "CONFIGURING", "COMPLETING", "REQUEUED"), \
                (state, open(slurm.job(job)["StdOut"]).read()[-3000:])
        assert time.time() < deadline, "timed out"
        time.sleep(0.3)


def start_now(slurm, job):
    """A requeued job waits two minutes (SLURM's BeginTime after a requeue): an administrator's
    `scontrol update StartTime=now` lets it start sooner. Not in the same second as the requeue:
    slurmd refuses a credential made in the second its predecessor's was revoked ("Job credential
    revoked", and the job fails)."""
    slurm.wait_state(job, {"PENDING"}, timeout=60)
    time.sleep(2)
    slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now")


@pytest.fixture(scope="module")
def small(tiny_nmt_models, tmp_path_factory):
    """A 16-pair input and its uninterrupted local run's rows: for the runs that test the worker
    jobs' failure paths."""
    from tests.toydata import toy_bitext

    folder = tmp_path_factory.mktemp("small")
    path = folder / "toy.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in toy_bitext(100, seed=32)[:16]))
    run(quick_args(str(path), folder / "local", tiny_nmt_models))
    return str(path), committed_rows(folder / "local")


def login_node_job(slurm, args, logs, env=(), **popen):
    """The generation job started from a login node (this process's machine) with its worker jobs
    on partition `nodes`: a Popen."""
    command = [sys.executable, "-m", "beam_pipelines.generate", "--runner", "DaskRunner",
               "--slurm_partition", "nodes", "--slurm_cpus_per_worker", "1", "--slurm_memory", "6GB",
               "--slurm_time", "30", "--slurm_log_dir", str(logs), *args]         # ARGS win
    return subprocess.Popen(command, cwd=ROOT, env={**slurm.env, "PYTHONPATH": ROOT, "PARAGEN_SLURM_CHECK_SECONDS": "1",
                                                      "PARAGEN_SLURM_BACKOFF_SECONDS": "1", **dict(env)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def alive(slurm, name):
    return [j for j in slurm.jobs(name) if j["JobState"] in ("RUNNING", "PENDING", "CONFIGURING")]


def completed(slurm, job, log) -> tuple[dict, str]:
    """(scontrol's fields, the log's text) of batch job JOB once it ended, which must be COMPLETED
    with exit code 0 and no traceback in LOG."""
    info = slurm.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=300)
    text = log.read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", text[-3000:]
    assert "Traceback" not in text and "(resumed)" in text, text[-3000:]
    return info, text
