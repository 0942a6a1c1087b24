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
import os
import re
import sys

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

import beam_pipelines.runners  # noqa: F401: registers --slurm_*
from beam_pipelines.slurm_settings import settings_from, worker_script
from common.cli import UsageError
from tests.jobs import FILTER_CONFIG, committed_rows, quick_args, scored_rows, units_committed
from tests.slurm_jobs import (completed, ROOT, UNITS, bitext, local_rows, local_run, slurm, start_now,  # noqa: F401: fixtures
                              submit, wait_for)
from tests import warm_python



@pytest.mark.slow
def test_single_node_job_requeued_and_warned_of_its_time_limit_continues_to_the_same_rows(
        slurm, bitext, tiny_nmt_models, local_rows, tmp_path):
    out, log = tmp_path / "out", tmp_path / "job.log"
    job = submit(slurm, "generate.sbatch", log, *quick_args(bitext, out, tiny_nmt_models))
    wait_for(lambda: units_committed(out) >= 2, slurm=slurm, job=job)
    slurm.run("scontrol", "requeue", job)                  # what a preemption with PreemptMode=REQUEUE does
    start_now(slurm, job)
    wait_for(lambda: slurm.job(job).get("Restarts") == "1" and slurm.job(job).get("JobState") == "RUNNING")
    before = units_committed(out)
    wait_for(lambda: units_committed(out) >= before + 2, slurm=slurm, job=job)
    assert units_committed(out) < UNITS, "the run ended before its time-limit warning: give it more pairs"
    # two minutes before the time limit: SIGUSR1 to the batch shell (--signal=B:USR1@120)
    slurm.run("scancel", "--batch", "--signal=USR1", job)
    start_now(slurm, job)
    info, text = completed(slurm, job, log)
    assert info["Restarts"] == "2"
    assert text.count("stopped by SIGTERM") == 2 and "time limit near: requeued batch job" in text, text[-3000:]
    assert committed_rows(out) == local_rows
    assert sorted(os.listdir(out)) == ["_log", "_manifest.json", "dedup", "paraphrases", "rejects"]      # nothing left over


@pytest.mark.slow
def test_many_nodes_a_cancelled_worker_is_replaced_and_a_requeued_driver_continues(
        slurm, bitext, tiny_nmt_models, local_rows, tmp_path):
    out, log, logs = tmp_path / "out", tmp_path / "driver.log", tmp_path / "workers"
    logs.mkdir()
    # Partition `nodes` (tests/slurm_cluster.py): 8-GB nodes, so the driver (8 GB) and each worker
    # (6 GB) have a node of their own. The queue looked at every 2 s, not 30: the lost worker is
    # replaced well before the run ends.
    job = submit(slurm, "cluster.sbatch", log, "--slurm_workers", "2", "--slurm_cpus_per_worker", "1",
                  "--slurm_memory", "6GB", "--slurm_partition", "nodes", "--slurm_time", "30",
                  "--slurm_log_dir", str(logs), *quick_args(bitext, out, tiny_nmt_models),
                  sbatch=["--partition=nodes", "--export=ALL,PARAGEN_SLURM_CHECK_SECONDS=2"])

    def workers(state=("RUNNING", "PENDING")):
        return [j for j in slurm.jobs("paragen-worker-") if j["JobState"] in state]

    wait_for(lambda: len(workers(("RUNNING",))) == 2 and units_committed(out) >= 2, slurm=slurm, job=job)
    hosts = {j["NodeList"] for j in workers(("RUNNING",))} | {slurm.job(job)["NodeList"]}
    assert hosts <= {"n1", "n2", "n3"} and len(hosts) == 3, hosts      # three nodes: the driver's, two workers'

    assert len({j["JobName"] for j in workers()}) == 1    # one cluster: its jobs share a name
    victim = workers(("RUNNING",))[0]["JobId"]
    slurm.run("scancel", victim)                          # a worker preempted, or at its time limit
    wait_for(lambda: victim not in {j["JobId"] for j in workers()} and len(workers()) == 2, timeout=120,
          slurm=slurm, job=job)                           # replaced
    before = units_committed(out)
    wait_for(lambda: units_committed(out) >= before + 2, slurm=slurm, job=job)
    assert units_committed(out) < UNITS, "the run ended before the driver could be requeued: give it more pairs"
    first = {j["JobId"] for j in workers()}
    slurm.run("scontrol", "requeue", job)                 # the driver preempted: its worker jobs go with it
    start_now(slurm, job)
    assert not [j for j in workers() if j["JobId"] in first]
    _, text = completed(slurm, job, log)
    assert "stopped by SIGTERM" in text and re.search(rf"worker job {victim} ended on n\d; submitting another", text)
    names = {j["JobName"] for j in slurm.jobs("paragen-worker-") if str(logs) in j.get("StdErr", "")}
    assert len(names) == 1                                # both starts name their workers after the run
    wait_for(lambda: not workers(), timeout=60)              # and cancelled them at its end
    assert committed_rows(out) == local_rows
    assert sorted(os.listdir(out)) == ["_log", "_manifest.json", "dedup", "paraphrases", "rejects"]


@pytest.mark.slow
def test_the_filter_job_on_slurm_workers_scores_as_a_local_run(slurm, local_run, tmp_path):
    """paragen-filter from a login node with --slurm_workers: its worker job scores the files and
    is cancelled at the end; the kept rows and their reasons are those of a local run."""
    from beam_pipelines.filter import run as filter_run

    config = tmp_path / "filter.yaml"
    config.write_text(FILTER_CONFIG)
    args = ["--input", str(local_run), "--config", str(config), "--no_report"]
    filter_run([*args, "--output", str(tmp_path / "local")])
    done = warm_python.run([sys.executable, "-m", "beam_pipelines.filter", *args, "--output", str(tmp_path / "slurm"),
                            "--runner", "DaskRunner", "--slurm_workers", "1", "--slurm_cpus_per_worker", "1",
                            "--slurm_memory", "2GB", "--slurm_time", "30", "--slurm_log_dir", str(tmp_path)],
                           cwd=ROOT, env={**slurm.env, "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SLURM: submitting 1 worker job(s)" in done.stderr and "--gres" not in open(
        next(tmp_path.glob("paragen-worker-*.err"))).read()
    local, on_slurm = scored_rows(tmp_path / "local"), scored_rows(tmp_path / "slurm")
    assert on_slurm == local and any(r[2] for r in local) and not all(r[2] for r in local)
    assert not [j for j in slurm.jobs("paragen-worker-") if j["JobState"] in ("RUNNING", "PENDING")]


def test_a_partition_slurm_does_not_have_is_refused_before_anything_is_submitted(slurm, bitext, tiny_nmt_models,
                                                                               tmp_path):
    out = tmp_path / "out"
    before = slurm.jobs()
    done = warm_python.run([sys.executable, "-m", "beam_pipelines.generate",
         *quick_args(bitext, out, tiny_nmt_models), "--runner", "DaskRunner", "--slurm_workers", "2",
         "--slurm_partition", "gpu-nosuch"], cwd=ROOT, env={**slurm.env, "PYTHONPATH": ROOT},
         capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "SLURM refuses the worker jobs" in done.stderr and "invalid partition" in done.stderr.lower()
    assert not out.exists() and slurm.jobs() == before


def test_a_dry_run_prints_the_worker_script_and_an_estimate_for_the_fleet(slurm, bitext, tiny_nmt_models, tmp_path):
    out = tmp_path / "out"
    before = slurm.jobs()
    done = warm_python.run([sys.executable, "-m", "beam_pipelines.generate", *quick_args(bitext, out, tiny_nmt_models),
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


@pytest.mark.parametrize("forgotten", [True, False])
def test_an_ended_worker_job_dropped_from_the_cluster_lets_it_close(forgotten):
    """keep_workers drops a worker job that ended from the cluster (slurm._forget). SpecCluster.close
    asserts that every worker it ever created is closed, and dask_jobqueue's job keeps the status it
    had; without _forget a run failed at its very end while anything still referred to the job (a
    CI run: AssertionError: Status.running). The second case shows the assertion this guards against."""
    from dask_jobqueue.slurm import SLURMJob
    from distributed import Scheduler, SpecCluster

    from beam_pipelines.slurm import _forget

    cluster = SpecCluster(workers={}, scheduler={"cls": Scheduler,
                                                 "options": {"host": "127.0.0.1", "dashboard_address": None}})
    job = SLURMJob(scheduler=cluster.scheduler_address, name="w", cores=1, memory="1GB")
    cluster._created.add(job)           # what SpecCluster does with each job it starts
    if forgotten:
        _forget(job)
        _forget(None)                   # a job the cluster no longer had
        cluster.close()
        assert cluster.status.name == "closed"
    else:
        with pytest.raises(AssertionError, match="created"):
            cluster.close()
