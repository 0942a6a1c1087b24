"""The DaskRunner's workers as SLURM batch jobs, for clusters whose GPUs sit behind SLURM.

``--runner DaskRunner --slurm_workers N`` (with the ``--slurm_*`` settings of slurm_settings.py,
or a YAML file of them: ``--slurm_config``) makes the job's decode phase start a Dask scheduler in the job's own
process and submit N worker jobs with ``sbatch`` through dask-jobqueue's ``SLURMCluster``. Each
worker job holds ``--slurm_gpus_per_worker`` GPUs and runs GPUs x ``--slurm_processes_per_gpu``
Dask worker processes (one process's host work overlaps the others' decoding, as on one machine;
each process claims its GPU: models/nmt/devices.py). Nothing is submitted before the check phase
has passed (``sbatch --test-only`` of the worker script there refuses a wrong partition, account
or GPU request in one line) or when the run has nothing left to decode.

Faults: a worker job that ends (preempted, cancelled, its time limit reached) loses the units it
was decoding, which the scheduler runs again on the other workers (they were never committed),
and is replaced at the next look at the queue (:func:`keep_workers`, as
beam_pipelines/slurm_fleet.py decides: failed starts back off and end the run after five in a
row, nodes that fail starts are excluded, long waits are reported with SLURM's reason, spares go
in ahead of workers near their lifetime). Worker jobs end themselves a few minutes before their
time limit (Dask's ``--lifetime``, staggered), so that the limit does not cut a unit. They are
named after the run's output: when the job ends, however it ends (its SIGTERM included:
common/stopping.py runs :func:`cancel_worker_jobs`), they are cancelled, and a job killed
outright leaves workers that stop on their own once the scheduler has been gone for 60 s, or
that its next start cancels. The job itself, its driver, runs where the user starts it: in a
batch job of its own that requeues itself (deploy/slurm/cluster.sbatch) and continues the run
with the same command. deploy/slurm/allocation.sbatch runs driver and workers in one allocation
instead, without this module.
"""
from __future__ import annotations

import dataclasses
import getpass
import logging
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
import time

from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipelines.slurm_fleet import ALIVE, BACKOFF_FIRST_S, BACKOFF_MAX_S, Fleet, Row
from beam_pipelines.slurm_settings import (SlurmSettings, cluster_kwargs, job_name_for, lifetime_minutes, settings_from,
                                           worker_script)
from common.cli import UsageError
from common.settings import env_seconds

log = logging.getLogger("paragen")

KEEP_WORKERS_EVERY_S = 30    # seconds between looks at the queue (PARAGEN_SLURM_CHECK_SECONDS)
ALLOWED_FAILURES = 20        # a unit's workers may end this often (preemptions) before the run fails


def check_slurm(beam_args: list[str], runner: str, device: str | None = None,
                processes_per_gpu: int | None = None, default_gpus: int | None = None,
                output: str | None = None) -> list[str]:
    """BEAM_ARGS with the worker jobs' GPUs, processes per GPU and name made explicit (so that the
    runner submits what was checked), after refusing (UsageError) --slurm_* settings that cannot
    work, before anything is written or submitted: the DaskRunner without a --dask_client_address,
    sbatch on PATH, GPUs that agree with --device, and the worker script accepted by
    `sbatch --test-only` (the partition, account, GPUs and time limit). DEVICE: the job's
    --device (None: the workers' GPU if they have one); PROCESSES_PER_GPU: the job's;
    DEFAULT_GPUS: a worker job's GPUs unless set (default 0 for --device cpu, else 1); OUTPUT:
    the job's --output (the worker jobs are named after it)."""
    options = PipelineOptions(beam_args)
    if default_gpus is None:
        default_gpus = 0 if device == "cpu" else 1
    settings = settings_from(options, processes_per_gpu, default_gpus)
    if settings is None:
        return beam_args
    check_seconds(), backoff_seconds()
    if device == "cpu" and settings.gpus_per_worker:
        raise UsageError("--device cpu with --slurm_gpus_per_worker > 0: the worker jobs would hold GPUs they "
                         "do not use")
    if device == "cuda" and not settings.gpus_per_worker:
        raise UsageError("--device cuda with --slurm_gpus_per_worker 0: the worker jobs would have no GPU")
    if not runner.endswith("DaskRunner"):
        raise UsageError(f"--slurm_workers: worker jobs are for the DaskRunner (--runner DaskRunner), not {runner}")
    from apache_beam.runners.dask.dask_runner import DaskOptions

    if options.view_as(DaskOptions).address:
        raise UsageError("--slurm_workers and --dask_client_address: either the job submits its own workers or "
                         "it uses a running scheduler, not both")
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise UsageError("--slurm_workers: sbatch is not on PATH (run the job on a SLURM login or batch node)")
    with tempfile.NamedTemporaryFile("w", suffix=".sh", prefix="paragen-worker-") as f:
        f.write(worker_script(settings, logs=False))
        f.flush()
        try:
            done = subprocess.run([sbatch, "--test-only", f.name], capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            raise UsageError("--slurm_workers: `sbatch --test-only` did not answer within 60 s (is slurmctld "
                             "up?)") from None
    if done.returncode != 0:
        said = " ".join(line.removeprefix("sbatch: ").strip()
                        for line in (done.stderr or done.stdout).splitlines() if line.strip())
        raise UsageError(f"--slurm_workers: SLURM refuses the worker jobs: {said or 'exit status %d' % done.returncode}")
    log.info("SLURM: sbatch --test-only accepts the worker jobs (%s)", " ".join((done.stderr or "").split()[1:]))
    name = settings.job_name or (job_name_for(output) if output else None)
    return [*beam_args, "--slurm_gpus_per_worker", str(settings.gpus_per_worker),
            "--slurm_processes_per_gpu", str(settings.processes_per_gpu),
            *(["--slurm_job_name", name] if name and not settings.job_name else [])]


# ------------------------------------------------------------------------------------------------
# the cluster, while a pipeline runs

_NAMES: set[str] = set()                 # job names of this process's worker jobs (for a stop)
_LOCK = threading.Lock()
_FLEETS: dict = {}                       # id(stop event) -> (Fleet, SlurmSettings, keeper thread) of a running cluster
_LAST_USAGE: list = []                   # the usage of the last cluster closed in this process


def last_usage() -> dict | None:
    """The worker jobs and GPU-hours of the last SLURM cluster this process closed (None: none),
    for the run's manifest; taken once."""
    with _LOCK:
        return _LAST_USAGE.pop() if _LAST_USAGE else None


def cancel_worker_jobs() -> None:
    """Cancel every worker job this process submitted, pending submissions included (each
    cluster's jobs share a name of their own). A stop calls it: common/stopping.py."""
    with _LOCK:
        names = sorted(_NAMES)
        _NAMES.clear()
    if names and shutil.which("scancel"):
        for name in names:
            _scancel(name, timeout=10)


def _scancel(name: str, timeout: float) -> None:
    """Cancel this user's jobs named NAME, pending and running."""
    subprocess.run(["scancel", "--name", name, "--user", getpass.getuser()], capture_output=True, timeout=timeout,
                   check=False)


def start_cluster(settings: SlurmSettings):
    """A SLURMCluster with SETTINGS.workers worker jobs submitted and kept (:func:`keep_workers`);
    returns (cluster, an Event that stops the keeping). Worker jobs of the same name that an
    earlier start left (a driver killed outright) are cancelled first."""
    import dask
    from dask_jobqueue import SLURMCluster

    from common import stopping

    name = settings.job_name or f"paragen-worker-{secrets.token_hex(4)}"
    settings = dataclasses.replace(settings, job_name=name)
    left = [i for i, row in own_jobs(name).items() if row.state in ALIVE]
    if left:
        _scancel(name, timeout=30)
        log.warning("SLURM: cancelled %d worker job(s) an earlier start of this run left (%s)", len(left),
                    ", ".join(left))
    with _LOCK:
        _NAMES.add(name)
    stopping.at_end(cancel_worker_jobs)
    scheduler = {"dashboard_address": ":0"}
    if settings.scheduler_interface:
        scheduler["interface"] = settings.scheduler_interface
    # a worker job that ends mid-unit counts against the unit: preemptions must not fail the run
    with dask.config.set({"distributed.scheduler.allowed-failures": ALLOWED_FAILURES}):
        cluster = SLURMCluster(scheduler_options=scheduler, **cluster_kwargs(settings))
    log.info("SLURM: submitting %d worker job(s) (%s) of %d process(es), %d GPU(s), %d core(s), %s, time limit %s; "
             "scheduler %s; logs in %s", settings.workers, name, settings.processes, settings.gpus_per_worker,
             settings.cpus, dask.utils.format_bytes(settings.memory_bytes), settings.time, cluster.scheduler_address,
             settings.log_folder)
    cluster.scale(jobs=settings.workers)
    stop = threading.Event()
    lifetime, stagger = lifetime_minutes(settings)
    spares = os.environ.get("PARAGEN_SLURM_SPARES", "1") != "0"      # 0: replace workers only once they left
    fleet = Fleet(settings.workers, 60.0 * lifetime if spares else None, 60.0 * stagger, check_seconds(),
                  backoff_s=(backoff_seconds(), BACKOFF_MAX_S))
    keeper = threading.Thread(target=keep_workers, args=(cluster, settings, stop, fleet), name="paragen-slurm",
                              daemon=True)
    with _LOCK:
        _FLEETS[id(stop)] = (fleet, settings, keeper)
    keeper.start()
    return cluster, stop


def joined_specs(cluster) -> set[str]:
    """The cluster's job names (its worker_spec keys) of which a Dask worker is connected now."""
    names = {str(w.get("name", "")) for w in cluster.scheduler_info.get("workers", {}).values()}
    return {spec for spec in list(cluster.worker_spec) if any(n == str(spec) or n.startswith(f"{spec}-")
                                                             for n in names)}


def keep_workers(cluster, settings: SlurmSettings, stop: threading.Event, fleet: Fleet) -> None:
    """Keeps SETTINGS.workers worker jobs submitted while the run lasts, as
    beam_pipelines/slurm_fleet.py decides: ended jobs replaced (failed starts with back-off, and
    the run ended after five in a row), nodes that fail starts excluded, long waits in the queue
    reported, spares submitted ahead of workers near their lifetime. Looks at the queue every
    check_seconds() (one squeue call, for this user's jobs of this name)."""
    from common import stopping

    check = fleet.check_s
    last = time.monotonic()
    while not stop.wait(1.0):
        try:
            for spec in joined_specs(cluster):
                fleet.joined(spec)
            now = time.monotonic()
            if now - last < check:
                continue
            last = now
            in_flight = 0
            for spec, job in list(cluster.workers.items()):
                if getattr(job, "job_id", None):
                    fleet.submitted(str(spec), str(job.job_id), now)
                else:
                    in_flight += 1
            in_flight += len(set(cluster.worker_spec) - set(cluster.workers))
            step = fleet.look(own_jobs(settings.job_name), now, in_flight)
            if stop.is_set():
                return
            for job in step.ended:
                where = f" on {job.node}" if job.node else ""
                if job.joined:
                    log.warning("SLURM: worker job %s ended%s; submitting another", job.job_id, where)
                else:
                    log.warning("SLURM: worker job %s ended%s before any of its workers joined (log: %s); %s",
                                job.job_id, where, _log_of(settings, job.job_id),
                                "submitting another" if not step.give_up else "giving up")
                cluster.worker_spec.pop(job.spec, None)
                _forget(cluster.workers.pop(job.spec, None))
            if step.exclude:
                log.warning("SLURM: excluding node(s) %s from the worker jobs (two failed starts each)",
                            ", ".join(step.exclude))
                cluster.new_spec = {**cluster.new_spec,
                                    "options": cluster_kwargs(settings, tuple(fleet.excluded))}
            if step.report:
                log.warning("SLURM: %s", step.report)
            if step.give_up:
                logs = ", ".join(_log_of(settings, j.job_id) for j in fleet.failed_in_a_row)
                stop.set()
                stopping.end_in_this_process(f"{step.give_up}; their logs: {logs}", 1)
                return
            if step.want > len(cluster.worker_spec):
                if step.want > settings.workers:
                    log.info("SLURM: submitting a spare worker job: %d worker job(s) near their lifetime",
                             step.want - settings.workers)
                cluster.scale(jobs=step.want)
        except Exception as exc:  # noqa: BLE001: a failed look at the queue is tried again next time
            log.warning("SLURM: could not check the worker jobs (%s); trying again", exc)


def _forget(worker) -> None:
    """A worker job that ended, dropped from the cluster, marked closed: dask_jobqueue's Job.close
    leaves its status "running", and SpecCluster.close asserts that every worker it ever created
    (a weak set: the job stays there while anything still refers to it) is closed; the run failed
    at its very end when one was still referred to (a CI run: AssertionError: Status.running)."""
    if worker is not None:
        from distributed.core import Status

        worker.status = Status.closed


def _log_of(settings: SlurmSettings, job_id: str) -> str:
    return os.path.join(settings.log_folder, f"{settings.job_name}-{job_id}.err")


def check_seconds() -> float:
    """Seconds between looks at the queue: $PARAGEN_SLURM_CHECK_SECONDS (1-600), else 30 (one
    squeue call each, for this user's jobs of one name: what a shared controller tolerates)."""
    return env_seconds("PARAGEN_SLURM_CHECK_SECONDS", KEEP_WORKERS_EVERY_S, 1, 600, UsageError)


def backoff_seconds() -> float:
    """The first wait before a worker job that failed to start is submitted again (doubled after
    each failed start in a row, up to 10 minutes): $PARAGEN_SLURM_BACKOFF_SECONDS (1-600), else 30."""
    return env_seconds("PARAGEN_SLURM_BACKOFF_SECONDS", BACKOFF_FIRST_S, 1, 600, UsageError)


def own_jobs(name: str) -> dict[str, Row]:
    """This user's jobs named NAME that slurmctld still knows (finished ones for MinJobAge), by id."""
    done = subprocess.run(["squeue", "-h", "--user", getpass.getuser(), "--name", name, "--states", "all",
                           "-o", "%i|%t|%r|%N"], capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip() or f"squeue exit status {done.returncode}")
    rows = {}
    for line in done.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4:
            rows[parts[0]] = Row(parts[1], parts[2], parts[3])
    return rows


def close_cluster(cluster, stop: threading.Event) -> None:
    """Stop replacing workers and cancel every worker job (the run is over); what they cost is
    kept for :func:`last_usage`."""
    stop.set()
    with _LOCK:
        fleet, settings, keeper = _FLEETS.pop(id(stop), (None, None, None))
        if fleet is not None:
            _LAST_USAGE[:] = [{"job_name": settings.job_name, "gpus_per_worker": settings.gpus_per_worker,
                               **fleet.usage(time.monotonic(), settings.gpus_per_worker)}]
    if keeper is not None and keeper is not threading.current_thread():
        keeper.join(timeout=35)         # its step ends (a squeue: 30 s at most): no worker job submitted while closing
    try:
        cluster.close(timeout=30)
    finally:
        cancel_worker_jobs()
