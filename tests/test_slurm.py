"""The jobs under a real SLURM (tests/slurm_cluster.py: munged, slurmctld and slurmd started here),
submitted as a user would, with `sbatch`:

- deploy/slurm/generate.sbatch (one node), requeued mid-run by `scontrol requeue` and then given
  the time limit's warning (SIGUSR1, what --signal=B:USR1@120 sends), continues to the rows of an
  uninterrupted local run;
- deploy/slurm/cluster.sbatch (the driver; the DaskRunner submits two worker jobs; each of the
  three on a node of its own): a worker job
  cancelled mid-run is replaced and costs only its units in flight; the driver requeued mid-run
  cancels its worker jobs, and its next start submits new ones and finishes; the rows are those
  of the local run;
- the check phase refuses a partition SLURM does not have (`sbatch --test-only`) before anything
  is written or submitted.
The settings and the worker script are tested without SLURM too.
"""
import json
import os
import re
import subprocess
import sys
import time

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

import beam_pipelines.runners  # noqa: F401: registers --slurm_*
from beam_pipelines.generate import run
from beam_pipelines.slurm import settings_from, worker_script
from common.cli import UsageError
from tests.jobs import committed_rows, quick_args, units_committed
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


def _submit(slurm, script, log, *args, sbatch=()) -> str:
    done = slurm.run("sbatch", "--parsable", f"--output={log}", *sbatch,
                     os.path.join(ROOT, "deploy", "slurm", script), *args)
    return done.stdout.strip().split(";")[0]


def _wait(what, timeout=300, slurm=None, job=None):
    deadline = time.time() + timeout
    while not what():
        if slurm is not None and job is not None:
            state = slurm.job(job).get("JobState")
            assert state in ("RUNNING", "PENDING", "CONFIGURING", "COMPLETING", "REQUEUED"), \
                (state, open(slurm.job(job)["StdOut"]).read()[-3000:])
        assert time.time() < deadline, "timed out"
        time.sleep(0.3)


def _start_now(slurm, job):
    """A requeued job waits two minutes (SLURM's BeginTime after a requeue): an administrator's
    `scontrol update StartTime=now` lets it start sooner. Not in the same second as the requeue:
    slurmd refuses a credential made in the second its predecessor's was revoked ("Job credential
    revoked", and the job fails)."""
    slurm.wait_state(job, {"PENDING"}, timeout=60)
    time.sleep(2)
    slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now")


@pytest.mark.slow
def test_single_node_job_requeued_and_warned_of_its_time_limit_continues_to_the_same_rows(
        slurm, bitext, tiny_nmt_models, local_rows, tmp_path):
    out, log = tmp_path / "out", tmp_path / "job.log"
    job = _submit(slurm, "generate.sbatch", log, *quick_args(bitext, out, tiny_nmt_models))
    _wait(lambda: units_committed(out) >= 2, slurm=slurm, job=job)
    slurm.run("scontrol", "requeue", job)                  # what a preemption with PreemptMode=REQUEUE does
    _start_now(slurm, job)
    _wait(lambda: slurm.job(job).get("Restarts") == "1" and slurm.job(job).get("JobState") == "RUNNING")
    before = units_committed(out)
    _wait(lambda: units_committed(out) >= before + 2, slurm=slurm, job=job)
    assert units_committed(out) < UNITS, "the run ended before its time-limit warning: give it more pairs"
    # two minutes before the time limit: SIGUSR1 to the batch shell (--signal=B:USR1@120)
    slurm.run("scancel", "--batch", "--signal=USR1", job)
    _start_now(slurm, job)
    info = slurm.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=300)
    text = log.read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", text[-3000:]
    assert info["Restarts"] == "2"
    assert text.count("stopped by SIGTERM") == 2 and "time limit near: requeued batch job" in text, text[-3000:]
    assert "(resumed)" in text and "Traceback" not in text
    assert committed_rows(out) == local_rows
    assert sorted(os.listdir(out)) == ["_manifest.json", "dedup", "paraphrases", "rejects"]      # nothing left over


@pytest.mark.slow
def test_many_nodes_a_cancelled_worker_is_replaced_and_a_requeued_driver_continues(
        slurm, bitext, tiny_nmt_models, local_rows, tmp_path):
    out, log, logs = tmp_path / "out", tmp_path / "driver.log", tmp_path / "workers"
    logs.mkdir()
    # Partition `nodes` (tests/slurm_cluster.py): 8-GB nodes, so the driver (8 GB) and each worker
    # (6 GB) have a node of their own. The queue looked at every 2 s, not 30: the lost worker is
    # replaced well before the run ends.
    job = _submit(slurm, "cluster.sbatch", log, "--slurm_workers", "2", "--slurm_cpus_per_worker", "1",
                  "--slurm_memory", "6GB", "--slurm_partition", "nodes", "--slurm_time", "30",
                  "--slurm_log_dir", str(logs), *quick_args(bitext, out, tiny_nmt_models),
                  sbatch=["--partition=nodes", "--export=ALL,PARAGEN_SLURM_CHECK_SECONDS=2"])

    def workers(state=("RUNNING", "PENDING")):
        return [j for j in slurm.jobs("paragen-worker-") if j["JobState"] in state]

    _wait(lambda: len(workers(("RUNNING",))) == 2 and units_committed(out) >= 2, slurm=slurm, job=job)
    hosts = {j["NodeList"] for j in workers(("RUNNING",))} | {slurm.job(job)["NodeList"]}
    assert hosts <= {"n1", "n2", "n3"} and len(hosts) == 3, hosts      # three nodes: the driver's, two workers'

    assert len({j["JobName"] for j in workers()}) == 1    # one cluster: its jobs share a name
    victim = workers(("RUNNING",))[0]["JobId"]
    slurm.run("scancel", victim)                          # a worker preempted, or at its time limit
    _wait(lambda: victim not in {j["JobId"] for j in workers()} and len(workers()) == 2, timeout=120,
          slurm=slurm, job=job)                           # replaced
    before = units_committed(out)
    _wait(lambda: units_committed(out) >= before + 2, slurm=slurm, job=job)
    assert units_committed(out) < UNITS, "the run ended before the driver could be requeued: give it more pairs"
    first = {j["JobId"] for j in workers()}
    slurm.run("scontrol", "requeue", job)                 # the driver preempted: its worker jobs go with it
    _start_now(slurm, job)
    assert not [j for j in workers() if j["JobId"] in first]
    info = slurm.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=300)
    text = log.read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", text[-3000:]
    assert "stopped by SIGTERM" in text and re.search(rf"worker job {victim} ended on n\d; submitting another", text)
    assert "(resumed)" in text and "Traceback" not in text
    names = {j["JobName"] for j in slurm.jobs("paragen-worker-") if str(logs) in j.get("StdErr", "")}
    assert len(names) == 1                                # both starts name their workers after the run
    _wait(lambda: not workers(), timeout=60)              # and cancelled them at its end
    assert committed_rows(out) == local_rows
    assert sorted(os.listdir(out)) == ["_manifest.json", "dedup", "paraphrases", "rejects"]


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


def _login_node_job(slurm, args, logs, env=(), **popen):
    """The generation job started from a login node (this process's machine) with its worker jobs
    on partition `nodes`: a Popen."""
    command = [sys.executable, "-m", "beam_pipelines.generate", "--runner", "DaskRunner",
               "--slurm_partition", "nodes", "--slurm_cpus_per_worker", "1", "--slurm_memory", "6GB",
               "--slurm_time", "30", "--slurm_log_dir", str(logs), *args]         # ARGS win
    return subprocess.Popen(command, cwd=ROOT, env={**slurm.env, "PYTHONPATH": ROOT, "PARAGEN_SLURM_CHECK_SECONDS": "1",
                                                      "PARAGEN_SLURM_BACKOFF_SECONDS": "1", **dict(env)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _alive(slurm, name):
    return [j for j in slurm.jobs(name) if j["JobState"] in ("RUNNING", "PENDING", "CONFIGURING")]


@pytest.mark.slow
def test_worker_jobs_that_fail_at_once_back_off_and_end_the_run_naming_them(slurm, small, tiny_nmt_models,
                                                                              tmp_path):
    """A worker Python that exits 1 at once (a node without the shared file system, say): the
    run resubmits with back-off, stops after five failed starts in a row, in one line naming the
    jobs and their logs (exit 1), and leaves no job behind."""
    bitext, _ = small
    out = tmp_path / "out"
    job = _login_node_job(slurm, [*quick_args(bitext, out, tiny_nmt_models), "--slurm_workers", "2",
                                  "--slurm_python", "/bin/false"], tmp_path / "logs")
    _, err = job.communicate(timeout=600)
    last = err.strip().splitlines()[-1]
    assert job.returncode == 1, err[-3000:]
    assert last.startswith("error: ") and "SLURM worker jobs in a row ended before any of their workers joined" in last
    ours = [j for j in slurm.jobs("paragen-worker-") if str(tmp_path / "logs") in j.get("StdErr", "")]
    assert 5 <= len(ours) <= 6, len(ours)                    # capped, not one sbatch every few seconds
    for j in ours[:5]:
        assert j["JobId"] in last and f"{j['JobName']}-{j['JobId']}.err" in last
        assert (tmp_path / "logs" / f"{j['JobName']}-{j['JobId']}.err").exists()   # one log a job
    assert "before any of its workers joined" in err and "submitting another" in err
    assert not _alive(slurm, ours[0]["JobName"])


@pytest.mark.slow
def test_pending_workers_are_reported_with_slurms_reason(slurm, small, tiny_nmt_models, tmp_path):
    """Worker jobs that wait (here: their partition is down) are reported with SLURM's reason; a
    stop cancels them."""
    bitext, _ = small
    slurm.run("scontrol", "update", "PartitionName=short", "State=DOWN")
    try:
        job = _login_node_job(slurm, [*quick_args(bitext, tmp_path / "out", tiny_nmt_models), "--slurm_workers",
                                      "1", "--slurm_partition", "short", "--slurm_time", "10"], tmp_path / "logs")
        said = []
        deadline = time.time() + 300
        for line in job.stderr:
            said.append(line)
            if "pending, the longest for" in line or time.time() > deadline:
                break
        assert "SLURM's reason: PartitionDown (the partition is down): 1" in said[-1], "".join(said)[-3000:]
        name = _alive(slurm, "paragen-worker-")[0]["JobName"]
        job.terminate()
        job.communicate(timeout=60)
        assert job.returncode == 143 and not _alive(slurm, name)
    finally:
        slurm.run("scontrol", "update", "PartitionName=short", "State=UP")


@pytest.mark.slow
def test_a_node_that_fails_two_starts_is_excluded_and_the_run_finishes(slurm, small, tiny_nmt_models, tmp_path):
    bitext, rows = small
    python = tmp_path / "python"                             # a node whose Python is broken: n1
    python.write_text(f'#!/bin/sh\n[ "$SLURMD_NODENAME" = n1 ] && exit 1\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    out = tmp_path / "out"
    job = _login_node_job(slurm, [*quick_args(bitext, out, tiny_nmt_models), "--slurm_workers", "1",
                                  "--slurm_python", str(python)], tmp_path / "logs")
    _, err = job.communicate(timeout=600)
    assert job.returncode == 0, err[-3000:]
    assert "excluding node(s) n1 from the worker jobs" in err
    assert committed_rows(out) == rows
    used = json.loads((out / "_manifest.json").read_text())["slurm"]         # what the workers cost
    assert used["excluded_nodes"] == ["n1"] and used["failed_starts"] == 2 and len(used["worker_jobs"]) == 3
    assert used["jobs_that_ran"] >= 1 and used["worker_job_hours"] > 0 and used["gpu_hours"] == 0


@pytest.mark.slow
def test_a_driver_killed_outright_and_started_again_cancels_the_workers_it_left(slurm, small, tiny_nmt_models,
                                                                               tmp_path):
    bitext, rows = small
    out, logs = tmp_path / "out", tmp_path / "logs"
    args = [*quick_args(bitext, out, tiny_nmt_models), "--slurm_workers", "2"]
    env = {"PARAGEN_LEASE_SECONDS": "4"}                     # the killed driver's claim lapses soon
    job = _login_node_job(slurm, args, logs, env)
    deadline = time.time() + 300
    while len([j for j in slurm.jobs("paragen-worker-") if j["JobState"] == "RUNNING"
               and str(logs) in j.get("StdErr", "")]) < 2:
        assert job.poll() is None and time.time() < deadline
        time.sleep(0.5)
    left = sorted(j["JobId"] for j in slurm.jobs("paragen-worker-") if j["JobState"] == "RUNNING"
                  and str(logs) in j.get("StdErr", ""))
    job.kill()                                               # SIGKILL: no clean-up, its workers live on
    job.wait()
    time.sleep(5)
    again = _login_node_job(slurm, args, logs, env)
    _, err = again.communicate(timeout=600)
    assert again.returncode == 0, err[-3000:]
    said = next(line for line in err.splitlines() if "an earlier start of this run left" in line)
    assert "cancelled 2 worker job(s)" in said and all(i in said for i in left)
    assert committed_rows(out) == rows
    assert not [j for j in slurm.jobs("paragen-worker-") if j["JobState"] in ("RUNNING", "PENDING")
                and str(logs) in j.get("StdErr", "")]


@pytest.mark.slow
def test_one_allocation_runs_driver_and_workers_together_and_continues_after_its_time_limit_warning(
        slurm, bitext, tiny_nmt_models, local_rows, tmp_path):
    """deploy/slurm/allocation.sbatch on two nodes: the driver, the scheduler and a Dask worker a
    node in one job; warned of its time limit (USR1) it stops, requeues itself and its next start
    finishes with the rows of the local run."""
    out, log, logs = tmp_path / "out", tmp_path / "job.log", tmp_path / "logs"
    job = _submit(slurm, "allocation.sbatch", log, *quick_args(bitext, out, tiny_nmt_models),
                  sbatch=["--nodes=2", "--partition=nodes", "--cpus-per-task=2", "--mem=6G",
                          f"--export=ALL,PROCESSES_PER_NODE=1,LOG_DIR={logs}"])
    _wait(lambda: units_committed(out) >= 2, slurm=slurm, job=job)
    assert slurm.job(job)["NumNodes"] == "2"
    first = logs / f"allocation-{job}-0"
    for node in ("n1", "n2"):                                # a worker on each node joined the scheduler
        assert "Registered to" in (first / f"worker-{node}.log").read_text()
    assert not slurm.jobs("paragen-worker-") or all(j["JobState"] not in ("RUNNING", "PENDING")
                                                   for j in slurm.jobs("paragen-worker-"))
    assert units_committed(out) < UNITS, "the run ended before its time-limit warning: give it more pairs"
    slurm.run("scancel", "--batch", "--signal=USR1", job)
    _start_now(slurm, job)
    info = slurm.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=300)
    text = log.read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", text[-3000:]
    assert "time limit near: requeued batch job" in text and "(resumed)" in text and "Traceback" not in text
    assert (logs / f"allocation-{job}-1" / "worker-n2.log").exists()
    assert committed_rows(out) == local_rows
    assert sorted(os.listdir(out)) == ["_manifest.json", "dedup", "paraphrases", "rejects"]


FILTER_CONFIG = """filters:
  - name: length
    thresholds: {paraphrase_length: {max: 8}}
  - name: ngram_overlap
    n: [1, 2, 3]
    thresholds: {trigram_overlap: {max: 0.7}}
  - name: bleu
"""


@pytest.mark.slow
def test_the_filter_job_on_slurm_workers_scores_as_a_local_run(slurm, local_run, tmp_path):
    """paragen-filter from a login node with --slurm_workers: its worker job scores the files and
    is cancelled at the end; the kept rows and their reasons are those of a local run."""
    from beam_pipelines.filter import run as filter_run
    from common import storage
    from paracorpus.commit import committed_files

    config = tmp_path / "filter.yaml"
    config.write_text(FILTER_CONFIG)
    args = ["--input", str(local_run), "--config", str(config), "--no_report"]
    filter_run([*args, "--output", str(tmp_path / "local")])
    done = subprocess.run([sys.executable, "-m", "beam_pipelines.filter", *args, "--output", str(tmp_path / "slurm"),
                           "--runner", "DaskRunner", "--slurm_workers", "1", "--slurm_cpus_per_worker", "1",
                           "--slurm_memory", "2GB", "--slurm_time", "30", "--slurm_log_dir", str(tmp_path)],
                          cwd=ROOT, env={**slurm.env, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SLURM: submitting 1 worker job(s)" in done.stderr and "--gres" not in open(
        next(tmp_path.glob("paragen-worker-*.err"))).read()

    def scored(out):
        table = storage.parquet_dataset(committed_files(str(out), "scored", "_filter_manifest.json")).to_table()
        return sorted((r["pair_id"], r["rank"], r["keep"], tuple(r["reasons"] or ()), round(r["trigram_overlap"], 9))
                      for r in table.to_pylist())
    local, on_slurm = scored(tmp_path / "local"), scored(tmp_path / "slurm")
    assert on_slurm == local and any(r[2] for r in local) and not all(r[2] for r in local)
    assert not [j for j in slurm.jobs("paragen-worker-") if j["JobState"] in ("RUNNING", "PENDING")]


def test_a_partition_slurm_does_not_have_is_refused_before_anything_is_submitted(slurm, bitext, tiny_nmt_models,
                                                                               tmp_path):
    out = tmp_path / "out"
    before = slurm.jobs()
    done = subprocess.run([sys.executable, "-m", "beam_pipelines.generate",
        *quick_args(bitext, out, tiny_nmt_models), "--runner", "DaskRunner", "--slurm_workers", "2",
        "--slurm_partition", "gpu-nosuch"], cwd=ROOT, env={**slurm.env, "PYTHONPATH": ROOT},
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "SLURM refuses the worker jobs" in done.stderr and "invalid partition" in done.stderr.lower()
    assert not out.exists() and slurm.jobs() == before


def test_a_dry_run_prints_the_worker_script_and_an_estimate_for_the_fleet(slurm, bitext, tiny_nmt_models, tmp_path):
    out = tmp_path / "out"
    before = slurm.jobs()
    done = subprocess.run([sys.executable, "-m", "beam_pipelines.generate", *quick_args(bitext, out, tiny_nmt_models),
                           "--dry_run", "--rate", "0.5", "--runner", "DaskRunner", "--slurm_workers", "4",
                           "--slurm_cpus_per_worker", "2", "--slurm_partition", "nodes"],
                          cwd=ROOT, env={**slurm.env, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    # 128 records at 0.5 pairs/s a process, 4 jobs x 2 processes: 32 s
    assert "32s with 8 worker process(es) (4 SLURM worker job(s) x 2 process(es)" in done.stdout, done.stdout
    assert "#SBATCH -p nodes" in done.stdout and "--nworkers 2" in done.stdout and "--slurm" not in done.stdout
    assert not out.exists() and slurm.jobs() == before and not (tmp_path / "paragen-logs").exists()


def test_a_worker_script_sbatch_accepts(slurm, tmp_path):
    """The script of a GPU worker job, as the check phase submits it to `sbatch --test-only`, is
    accepted as it is; too many GPUs for any node is refused there."""
    opts = PipelineOptions(["--slurm_workers", "3", "--slurm_gpus_per_worker", "2", "--slurm_partition", "debug"])
    script = tmp_path / "w.sh"
    script.write_text(worker_script(settings_from(opts, 2)))
    done = slurm.run("sbatch", "--test-only", str(script), check=False)
    assert done.returncode == 0 and "to start at" in done.stderr, done.stderr
    script.write_text(worker_script(settings_from(PipelineOptions(["--slurm_workers", "1",
                                                                   "--slurm_gpus_per_worker", "8"]), 1)))
    assert slurm.run("sbatch", "--test-only", str(script), check=False).returncode != 0


def test_settings_come_from_the_file_and_the_command_line_wins(tmp_path):
    config = tmp_path / "workers.yaml"
    config.write_text("partition: gpu\naccount: lab\ngpus_per_worker: 4\nprocesses_per_gpu: 2\nmemory: 256GB\n"
                      "time: '2-00:00:00'\nextra: ['--qos=long']\n")
    s = settings_from(PipelineOptions(["--slurm_workers", "8", "--slurm_config", str(config),
                                       "--slurm_partition", "a100"]))
    assert (s.workers, s.partition, s.account, s.gpus_per_worker, s.processes) == (8, "a100", "lab", 4, 8)
    assert s.cpus == 32 and s.memory_bytes == 256 * 10**9 and s.extra == ("--qos=long",)
    script = worker_script(s)
    for line in ("#SBATCH -p a100", "#SBATCH -A lab", "#SBATCH --cpus-per-task=32", "#SBATCH --gres=gpu:4",
                 "#SBATCH -t 2-00:00:00", "#SBATCH --no-requeue", "#SBATCH --qos=long", "nvidia-cuda-mps-control -d",
                 "--nworkers 8", "--nthreads 1", "--death-timeout 60", "--lifetime 2865m", "--lifetime-stagger 5m",
                 "PARAGEN_GPU_SLOTS="):
        assert line in script, (line, script)
    cpu = worker_script(settings_from(PipelineOptions(["--slurm_workers", "1", "--slurm_gpus_per_worker", "0",
                                                       "--slurm_cpus_per_worker", "4"])))
    assert "--gres" not in cpu and "--nworkers 4" in cpu and "mps" not in cpu
    assert settings_from(PipelineOptions([])) is None


def test_settings_as_hpc_sites_write_them(tmp_path):
    """Partition lists, typed GPUs or --gpus-per-node, directives a site refuses left out, a
    site's jobqueue.yaml prologue kept before ours, --slurm_extra with its value written apart."""
    import dask

    from beam_pipelines.options import join_dashed_values

    args = join_dashed_values(["--slurm_workers", "2", "--slurm_partition", "a100,h100", "--slurm_gpus_per_worker",
                               "4", "--slurm_gpu_type", "a100", "--slurm_extra", "--qos=long", "--slurm_skip",
                               "--mem", "--slurm_extra", "--output=/site/logs/x"])
    s = settings_from(PipelineOptions(args))
    assert s.extra == ("--qos=long", "--output=/site/logs/x") and s.skip == ("--mem",)
    with dask.config.set({"jobqueue.slurm.job-script-prologue": ["module load cuda/12.4"],
                          "jobqueue.slurm.job-extra-directives": ["--reservation=lab"]}):
        script = worker_script(s)
    assert "#SBATCH -p a100,h100" in script and "#SBATCH --gres=gpu:a100:4" in script
    assert "#SBATCH --mem" not in script and "#SBATCH --qos=long" in script and "#SBATCH --reservation=lab" in script
    assert script.index("module load cuda/12.4") < script.index("PARAGEN_GPU_SLOTS")
    per_node = worker_script(settings_from(PipelineOptions(["--slurm_workers", "1", "--slurm_gpu_directive",
                                                            "gpus-per-node", "--slurm_gpus_per_worker", "2"])))
    assert "#SBATCH --gpus-per-node=2" in per_node and "--gres" not in per_node


@pytest.mark.parametrize("args, says", [
    (["--slurm_partition", "gpu"], "without --slurm_workers"),
    (["--slurm_workers", "0", "--slurm_time", "10"], "without --slurm_workers"),
    (["--slurm_workers", "-2"], ">= 1"),
    (["--slurm_workers", "2", "--slurm_partition", "gpu; rm -rf /"], "letters, digits"),
    (["--slurm_workers", "2", "--slurm_extra", "--qos=x\n#SBATCH --uid=0"], "one sbatch option"),
    (["--slurm_workers", "2", "--slurm_extra", "qos"], "one sbatch option"),
    (["--slurm_workers", "2", "--slurm_time", "3"], "at least 5 minutes"),
    (["--slurm_workers", "2", "--slurm_time", "1 day"], "HH:MM:SS"),
    (["--slurm_workers", "2", "--slurm_memory", "lots"], "an amount"),
    (["--slurm_workers", "2", "--slurm_python", "python3"], "absolute path"),
    (["--slurm_workers", "2", "--slurm_gpus_per_worker", "-1"], ">= 0"),
    (["--slurm_workers", "2", "--slurm_partition", "a100,,h100"], "comma-separated list"),
    (["--slurm_workers", "2", "--slurm_skip", "mem"], "name of an sbatch option"),
    (["--slurm_workers", "2", "--slurm_gpu_type", "a100:2"], "letters, digits"),
])
def test_mistaken_settings_are_refused_in_one_line(args, says):
    with pytest.raises(UsageError, match=says.replace("(", r"\(")):
        settings_from(PipelineOptions(args))


def test_a_config_file_with_an_unknown_key_is_refused(tmp_path):
    config = tmp_path / "w.yaml"
    config.write_text("partition: gpu\ngpu_per_worker: 2\n")
    with pytest.raises(UsageError, match="unknown setting.*gpu_per_worker"):
        settings_from(PipelineOptions(["--slurm_workers", "1", "--slurm_config", str(config)]))
    config.write_text("- a list\n")
    with pytest.raises(UsageError, match="a mapping"):
        settings_from(PipelineOptions(["--slurm_workers", "1", "--slurm_config", str(config)]))


@pytest.mark.parametrize("value", ["0", "soon", "1e9"])
def test_a_mistaken_queue_check_interval_is_refused_before_anything_is_submitted(value, monkeypatch):
    from beam_pipelines.slurm import check_slurm

    monkeypatch.setenv("PARAGEN_SLURM_CHECK_SECONDS", value)
    with pytest.raises(UsageError, match="PARAGEN_SLURM_CHECK_SECONDS.*(between 1 and 600|not a number)"):
        check_slurm(["--slurm_workers", "1"], "DaskRunner", device="cpu")
