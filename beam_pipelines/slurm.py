"""The DaskRunner's workers as SLURM batch jobs, for clusters whose GPUs sit behind SLURM.

``--runner DaskRunner --slurm_workers N`` (with the ``--slurm_*`` settings below, or a YAML file
of them: ``--slurm_config``) makes the job's decode phase start a Dask scheduler in the job's own
process and submit N worker jobs with ``sbatch`` through dask-jobqueue's ``SLURMCluster``. Each
worker job holds ``--slurm_gpus_per_worker`` GPUs and runs GPUs x ``--slurm_processes_per_gpu``
Dask worker processes (one process's host work overlaps the others' decoding, as on one machine;
each process claims its GPU: models/nmt/devices.py). Nothing is submitted before the check phase
has passed (``sbatch --test-only`` of the worker script there refuses a wrong partition, account
or GPU request in one line) or when the run has nothing left to decode.

Faults: a worker job that ends (preempted, cancelled, its time limit reached) loses the units it
was decoding, which the scheduler runs again on the other workers (they were never committed),
and is replaced by a new worker job within a minute (:func:`keep_workers`). Worker jobs end
themselves a few minutes before their time limit (Dask's ``--lifetime``, staggered), so that the
limit does not cut a unit. When the job ends, however it ends (its SIGTERM included: common/
stopping.py runs :func:`cancel_worker_jobs`), its worker jobs are cancelled; a job killed
outright leaves workers that stop on their own once the scheduler has been gone for 60 s.
The job itself, its driver, runs where the user starts it: in a batch job of its own that
requeues itself (deploy/slurm/cluster.sbatch) and continues the run with the same command.
"""
from __future__ import annotations

import dataclasses
import getpass
import logging
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading

from apache_beam.options.pipeline_options import PipelineOptions

from common.cli import UsageError
from common.settings import env_seconds

log = logging.getLogger("paragen")

DEATH_TIMEOUT_S = 60         # a worker whose scheduler is gone that long stops (its job ends)
KEEP_WORKERS_EVERY_S = 10    # how often lost worker jobs are replaced (PARAGEN_SLURM_CHECK_SECONDS)
ALLOWED_FAILURES = 20        # a unit's workers may end this often (preemptions) before the run fails
_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,128}$")
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


class SlurmOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--slurm_workers", type=int, default=None,
                            help="DaskRunner: submit this many SLURM worker jobs for the run (0 or unset: use "
                                 "--dask_client_address); the --slurm_* settings or --slurm_config size them")
        parser.add_argument("--slurm_config", default=None,
                            help="YAML file of SLURM settings (keys: the --slurm_* option names without the prefix); "
                                 "options on the command line win")
        parser.add_argument("--slurm_partition", default=None, help="partition of the worker jobs (sbatch -p)")
        parser.add_argument("--slurm_account", default=None, help="account charged (sbatch -A)")
        parser.add_argument("--slurm_gpus_per_worker", type=int, default=None,
                            help="GPUs a worker job holds (--gres=gpu:G; 0: CPU workers); default 1")
        parser.add_argument("--slurm_processes_per_gpu", type=int, default=None,
                            help="Dask worker processes per GPU; default the job's --processes_per_gpu")
        parser.add_argument("--slurm_cpus_per_worker", type=int, default=None,
                            help="CPU cores a worker job holds; default 8 per GPU, or 1 for CPU workers (which run "
                                 "one decoding process per core)")
        parser.add_argument("--slurm_memory", default=None,
                            help="memory of a worker job, e.g. 64GB; default 32GB per GPU, or 4GB per core")
        parser.add_argument("--slurm_time", default=None,
                            help="time limit of a worker job (sbatch -t: MINUTES, HH:MM:SS, D-HH:MM:SS); default "
                                 "24:00:00. Workers end a few minutes before it and are replaced")
        parser.add_argument("--slurm_extra", action="append", default=None,
                            help="one more sbatch option for the worker jobs, e.g. --slurm_extra=--qos=long "
                                 "(repeat the option for several)")
        parser.add_argument("--slurm_python", default=None,
                            help="the Python of the worker jobs (default: this one, which must be on a file "
                                 "system the nodes share)")
        parser.add_argument("--slurm_interface", default=None,
                            help="network interface the scheduler and workers talk over (e.g. ib0); default: "
                                 "the host's address")
        parser.add_argument("--slurm_log_dir", default=None, help="folder for the worker jobs' logs (default: "
                                                                   "sbatch's, the submit folder)")
        parser.add_argument("--slurm_mps", default=None, choices=("auto", "on", "off"),
                            help="CUDA MPS in GPU worker jobs with several processes per GPU (default auto: "
                                 "where nvidia-cuda-mps-control is found)")


@dataclasses.dataclass(frozen=True)
class SlurmSettings:
    """What a worker job asks for and runs (checked: :func:`settings_from`)."""
    workers: int
    partition: str | None = None
    account: str | None = None
    gpus_per_worker: int = 1
    processes_per_gpu: int = 4
    cpus_per_worker: int | None = None
    memory: str | None = None
    time: str = "24:00:00"
    extra: tuple[str, ...] = ()
    python: str = sys.executable
    interface: str | None = None
    log_dir: str | None = None
    mps: str = "auto"

    @property
    def cpus(self) -> int:
        return self.cpus_per_worker or (8 * self.gpus_per_worker if self.gpus_per_worker else 1)

    @property
    def processes(self) -> int:
        """Dask worker processes per worker job: P per GPU, or one per core on CPU workers."""
        return self.gpus_per_worker * self.processes_per_gpu if self.gpus_per_worker else self.cpus

    @property
    def memory_bytes(self) -> int:
        from dask.utils import parse_bytes

        if self.memory:
            return parse_bytes(self.memory)
        return (32 * self.gpus_per_worker if self.gpus_per_worker else 4 * self.cpus) * 2**30


FIELDS = {f.name for f in dataclasses.fields(SlurmSettings)}


def _minutes(value: str) -> int:
    """sbatch -t's formats (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in whole minutes."""
    m = _TIME.match(value)
    if not m:
        raise UsageError(f"--slurm_time {value!r}: use MINUTES, HH:MM:SS or D-HH:MM:SS")
    days, a, b, c = (int(x) if x else None for x in m.groups())
    if days is not None:                        # D-HH[:MM[:SS]]
        return days * 1440 + a * 60 + (b or 0)
    if c is not None:                           # HH:MM:SS
        return a * 60 + b
    return a                                    # MM or MM:SS


def _load_file(path: str) -> dict:
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except OSError as exc:
        raise UsageError(f"--slurm_config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"--slurm_config {path}: not YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise UsageError(f"--slurm_config {path}: a mapping of settings, not {type(data).__name__}")
    data = {str(k).removeprefix("slurm_"): v for k, v in data.items()}
    unknown = sorted(set(data) - FIELDS - {"config"})
    if unknown:
        raise UsageError(f"--slurm_config {path}: unknown setting(s) {', '.join(unknown)}; known: "
                         f"{', '.join(sorted(FIELDS))}")
    return data


def settings_from(options: PipelineOptions, processes_per_gpu: int | None = None,
                  gpus_per_worker: int | None = None) -> SlurmSettings | None:
    """The checked settings of OPTIONS' --slurm_* (None without --slurm_workers); UsageError for a
    mistake. PROCESSES_PER_GPU, GPUS_PER_WORKER: the defaults of --slurm_processes_per_gpu (the
    job's --processes_per_gpu) and --slurm_gpus_per_worker where neither the options nor the file
    set them."""
    given = options.view_as(SlurmOptions).get_all_options(drop_default=True)
    given = {k.removeprefix("slurm_"): v for k, v in given.items()
             if k.startswith("slurm_") and v is not None}
    values = _load_file(given["config"]) if "config" in given else {}
    values.update({k: v for k, v in given.items() if k != "config"})
    if not values.get("workers"):
        if len(values) > 1 or (values and "workers" not in values):
            raise UsageError("--slurm_* settings without --slurm_workers N: say how many worker jobs to submit")
        return None
    if processes_per_gpu and "processes_per_gpu" not in values:
        values["processes_per_gpu"] = processes_per_gpu
    if gpus_per_worker is not None and "gpus_per_worker" not in values:
        values["gpus_per_worker"] = gpus_per_worker
    for key in ("workers", "gpus_per_worker", "processes_per_gpu", "cpus_per_worker"):
        if key in values:
            try:
                values[key] = int(values[key])
            except (TypeError, ValueError):
                raise UsageError(f"--slurm_{key} must be a whole number, not {values[key]!r}") from None
    if values["workers"] < 1:
        raise UsageError(f"--slurm_workers must be >= 1, not {values['workers']}")
    for key, least in (("gpus_per_worker", 0), ("processes_per_gpu", 1), ("cpus_per_worker", 1)):
        if key in values and values[key] < least:
            raise UsageError(f"--slurm_{key} must be >= {least}, not {values[key]}")
    for key in ("partition", "account", "interface"):
        if values.get(key) is not None and not _NAME.match(str(values[key])):
            raise UsageError(f"--slurm_{key} {values[key]!r}: letters, digits and . _ + - only")
    extra = values.get("extra") or ()
    extra = (extra,) if isinstance(extra, str) else tuple(str(e) for e in extra)
    for e in extra:
        # each goes into the worker script as one '#SBATCH' line: one option, nothing else
        if not e.startswith("-") or any(c in e for c in "\n\r\0#;`$"):
            raise UsageError(f"--slurm_extra {e!r}: one sbatch option per value, such as --qos=long")
    values["extra"] = extra
    if "time" in values:
        values["time"] = str(values["time"])
        if _minutes(values["time"]) < 5:
            raise UsageError(f"--slurm_time {values['time']}: at least 5 minutes (workers stop 2-10 minutes "
                             "before it)")
    if "memory" in values:
        from dask.utils import parse_bytes

        try:
            if parse_bytes(str(values["memory"])) < 2**28:
                raise ValueError
        except ValueError:
            raise UsageError(f"--slurm_memory {values['memory']!r}: an amount such as 64GB (at least 256MB)") from None
        values["memory"] = str(values["memory"])
    for key in ("python", "log_dir"):
        if values.get(key) is not None and (not os.path.isabs(str(values[key]))
                                            or any(c in str(values[key]) for c in "\n\r\0")):
            raise UsageError(f"--slurm_{key} {values[key]!r}: an absolute path the nodes share")
    if values.get("mps", "auto") not in ("auto", "on", "off"):
        raise UsageError(f"--slurm_mps must be auto, on or off, not {values['mps']!r}")
    return SlurmSettings(**values)


def _lifetime(settings: SlurmSettings) -> tuple[str, str]:
    """Dask's --lifetime and --lifetime-stagger: workers end (and are replaced) before the time
    limit cuts a unit in half; a tenth of the limit, between 2 and 10 minutes, is kept free."""
    limit = _minutes(settings.time)
    margin = max(2, min(10, limit // 10))
    stagger = max(1, margin // 2)
    return f"{limit - margin - stagger}m", f"{stagger}m"


def prologue(settings: SlurmSettings) -> list[str]:
    """The worker script's lines before `dask worker`: GPU slots per job, no profiler, MPS."""
    lines = [
        # two worker jobs on one node each see their own GPUs as 0..G-1: their slot files must differ
        'export PARAGEN_GPU_SLOTS="${TMPDIR:-/tmp}/paragen-gpu-slots-${SLURM_JOB_ID:-$$}"',
        # Dask's statistical profiler keeps a call tree a second: memory a decoding worker does not need
        "export DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False",
    ]
    if settings.gpus_per_worker and settings.mps != "off" and (settings.processes_per_gpu > 1 or settings.mps == "on"):
        lines += [
            "# CUDA MPS: the processes' kernels overlap on each GPU instead of taking turns",
            'if [ -z "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && command -v nvidia-cuda-mps-control >/dev/null; then',
            '  mps=$(mktemp -d "${TMPDIR:-/tmp}/paragen-mps-XXXXXX") && mkdir "$mps/pipe" "$mps/log"',
            '  export CUDA_MPS_PIPE_DIRECTORY=$mps/pipe CUDA_MPS_LOG_DIRECTORY=$mps/log',
            '  if nvidia-cuda-mps-control -d; then trap \'echo quit | nvidia-cuda-mps-control; rm -rf "$mps"\' EXIT',
            '  else unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; fi',
            *(['elif [ -z "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then',
               '  echo "paragen worker: --slurm_mps on but nvidia-cuda-mps-control is not on PATH" >&2; exit 1']
              if settings.mps == "on" else []),
            "fi",
        ]
    return lines


def cluster_kwargs(settings: SlurmSettings) -> dict:
    """SLURMCluster's (and SLURMJob's) arguments for SETTINGS."""
    lifetime, stagger = _lifetime(settings)
    directives = [*(["--gres=gpu:%d" % settings.gpus_per_worker] if settings.gpus_per_worker else []),
                  "--no-requeue",          # a preempted worker is replaced, not requeued
                  *settings.extra]
    # cores=processes: one Dask thread per process (a process decodes one unit at a time); the
    # job's cores (job_cpu) are what the processes' torch threads and host work share
    kwargs = dict(queue=settings.partition, account=settings.account, cores=settings.processes,
                  job_cpu=settings.cpus, processes=settings.processes, memory=f"{settings.memory_bytes}B",
                  walltime=settings.time, job_name="paragen-worker", job_extra_directives=directives,
                  job_script_prologue=prologue(settings),
                  worker_extra_args=["--lifetime", lifetime, "--lifetime-stagger", stagger,
                                     "--no-dashboard"],
                  python=shlex.quote(settings.python), death_timeout=DEATH_TIMEOUT_S,
                  interface=settings.interface, log_directory=settings.log_dir)
    return kwargs


def worker_script(settings: SlurmSettings, scheduler: str = "tcp://127.0.0.1:8786") -> str:
    """The batch script of one worker job (what `sbatch` gets), without starting a scheduler."""
    from dask_jobqueue.slurm import SLURMJob

    kwargs = cluster_kwargs(settings)
    kwargs.pop("interface")                        # the scheduler's address is given here
    return SLURMJob(scheduler=scheduler, name="paragen-worker", **kwargs).job_script()


def check_slurm(beam_args: list[str], runner: str, device: str | None = None,
                processes_per_gpu: int | None = None, default_gpus: int | None = None) -> list[str]:
    """BEAM_ARGS with the worker jobs' GPUs and processes per GPU made explicit (so that the runner
    submits what was checked), after refusing (UsageError) --slurm_* settings that cannot work,
    before anything is written or submitted: the DaskRunner without a --dask_client_address,
    sbatch on PATH, GPUs that agree with --device, and the worker script accepted by
    `sbatch --test-only` (the partition, account, GPUs and time limit). DEVICE: the job's
    --device (None: the workers' GPU if they have one); PROCESSES_PER_GPU: the job's;
    DEFAULT_GPUS: a worker job's GPUs unless set (default 0 for --device cpu, else 1)."""
    options = PipelineOptions(beam_args)
    if default_gpus is None:
        default_gpus = 0 if device == "cpu" else 1
    settings = settings_from(options, processes_per_gpu, default_gpus)
    if settings is None:
        return beam_args
    check_seconds()
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
        f.write(worker_script(settings))
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
    return [*beam_args, "--slurm_gpus_per_worker", str(settings.gpus_per_worker),
            "--slurm_processes_per_gpu", str(settings.processes_per_gpu)]


# ------------------------------------------------------------------------------------------------
# the cluster, while a pipeline runs

_NAMES: set[str] = set()                 # job names of this process's worker jobs (for a stop)
_LOCK = threading.Lock()


def cancel_worker_jobs() -> None:
    """Cancel every worker job this process submitted, pending submissions included (each
    cluster's jobs share a name of their own). A stop calls it: common/stopping.py."""
    with _LOCK:
        names = sorted(_NAMES)
        _NAMES.clear()
    if names and shutil.which("scancel"):
        user = getpass.getuser()
        for name in names:
            subprocess.run(["scancel", "--name", name, "--user", user], capture_output=True, timeout=10, check=False)


def start_cluster(settings: SlurmSettings):
    """A SLURMCluster with SETTINGS.workers worker jobs submitted and kept (:func:`keep_workers`);
    returns (cluster, an Event that stops the keeping)."""
    import dask
    from dask_jobqueue import SLURMCluster

    from common import stopping

    name = f"paragen-worker-{secrets.token_hex(4)}"
    with _LOCK:
        _NAMES.add(name)
    stopping.at_end(cancel_worker_jobs)
    # a worker job that ends mid-unit counts against the unit: preemptions must not fail the run
    with dask.config.set({"distributed.scheduler.allowed-failures": ALLOWED_FAILURES}):
        cluster = SLURMCluster(scheduler_options={"dashboard_address": ":0"},
                               **{**cluster_kwargs(settings), "job_name": name})
    log.info("SLURM: submitting %d worker job(s) (%s) of %d process(es), %d GPU(s), %d core(s), %s, time limit %s; "
             "scheduler %s", settings.workers, name, settings.processes, settings.gpus_per_worker, settings.cpus,
             dask.utils.format_bytes(settings.memory_bytes), settings.time, cluster.scheduler_address)
    cluster.scale(jobs=settings.workers)
    stop = threading.Event()
    threading.Thread(target=keep_workers, args=(cluster, settings.workers, stop), name="paragen-slurm",
                     daemon=True).start()
    return cluster, stop


def keep_workers(cluster, jobs: int, stop: threading.Event) -> None:
    """Every few seconds: worker jobs that ended (preempted, cancelled, past their lifetime) are
    forgotten and new ones submitted, so that JOBS stay submitted while the run lasts."""
    while not stop.wait(check_seconds()):
        try:
            submitted = {name: str(job.job_id) for name, job in list(cluster.workers.items())
                         if getattr(job, "job_id", None)}
            alive = queued(list(submitted.values()))
            for name, job_id in submitted.items():
                if job_id not in alive and not stop.is_set():
                    log.warning("SLURM: worker job %s ended; submitting another", job_id)
                    cluster.worker_spec.pop(name, None)
                    cluster.workers.pop(name, None)
            if not stop.is_set():
                cluster.scale(jobs=jobs)        # submits what is missing (a no-op when all are there)
        except Exception as exc:  # noqa: BLE001: a failed look at the queue is tried again next time
            log.warning("SLURM: could not check the worker jobs (%s); trying again", exc)


def check_seconds() -> float:
    """Seconds between looks at the queue: $PARAGEN_SLURM_CHECK_SECONDS (1-600), else 10 (one
    squeue call each: a busy controller may want fewer)."""
    return env_seconds("PARAGEN_SLURM_CHECK_SECONDS", KEEP_WORKERS_EVERY_S, 1, 600, UsageError)


def queued(job_ids: list[str]) -> set[str]:
    """Those of JOB_IDS that are pending or running (squeue)."""
    if not job_ids:
        return set()
    done = subprocess.run(["squeue", "-h", "-o", "%i %t", "-j", ",".join(job_ids)], capture_output=True, text=True,
                          timeout=30, check=False)
    if done.returncode != 0 and "Invalid job id" not in done.stderr:
        raise RuntimeError(done.stderr.strip() or f"squeue exit status {done.returncode}")
    states = dict(line.split() for line in done.stdout.splitlines() if len(line.split()) == 2)
    return {i for i, state in states.items() if state in ("PD", "R", "CF", "RQ", "RS", "RH", "S")}


def close_cluster(cluster, stop: threading.Event) -> None:
    """Stop replacing workers and cancel every worker job (the run is over)."""
    stop.set()
    try:
        cluster.close(timeout=30)
    finally:
        cancel_worker_jobs()
