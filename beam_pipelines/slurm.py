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
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipelines.slurm_fleet import ALIVE, BACKOFF_FIRST_S, BACKOFF_MAX_S, Fleet, Row
from common.cli import UsageError
from common.settings import env_seconds

log = logging.getLogger("paragen")

DEATH_TIMEOUT_S = 60         # a worker whose scheduler is gone that long stops (its job ends)
KEEP_WORKERS_EVERY_S = 30    # seconds between looks at the queue (PARAGEN_SLURM_CHECK_SECONDS)
ALLOWED_FAILURES = 20        # a unit's workers may end this often (preemptions) before the run fails
_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,128}$")
_NAMES_LIST = re.compile(r"^[A-Za-z0-9_.+-]{1,128}(,[A-Za-z0-9_.+-]{1,128}){0,31}$")    # -p a100,h100
_DIRECTIVE = re.compile(r"^-{1,2}[A-Za-z][A-Za-z0-9-]*$")                            # --mem, -t
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
        parser.add_argument("--slurm_partition", default=None,
                            help="partition(s) of the worker jobs (sbatch -p; a list: a100,h100)")
        parser.add_argument("--slurm_account", default=None, help="account charged (sbatch -A)")
        parser.add_argument("--slurm_gpus_per_worker", type=int, default=None,
                            help="GPUs a worker job holds (--gres=gpu:G; 0: CPU workers); default 1")
        parser.add_argument("--slurm_gpu_type", default=None,
                            help="the GPUs' type where a cluster names them (--gres=gpu:TYPE:G), e.g. a100")
        parser.add_argument("--slurm_gpu_directive", default=None, choices=("gres", "gpus-per-node"),
                            help="how the GPUs are asked for: gres (--gres=gpu:G, the default) or gpus-per-node "
                                 "(--gpus-per-node=G)")
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
                            help="network interface the workers talk over (e.g. ib0); default: the host's address")
        parser.add_argument("--slurm_scheduler_interface", default=None,
                            help="network interface the scheduler (in the job's own process) listens on, where it "
                                 "differs from the workers' (default: --slurm_interface)")
        parser.add_argument("--slurm_log_dir", default=None,
                            help="folder for the worker jobs' logs, one .out and one .err a job (default: "
                                 "paragen-logs/JOB_NAME in the submit folder)")
        parser.add_argument("--slurm_skip", action="append", default=None,
                            help="an #SBATCH directive to leave out of the worker script, for sites that refuse it "
                                 "(e.g. --slurm_skip=--mem; repeat for several)")
        parser.add_argument("--slurm_job_name", default=None,
                            help="name of the worker jobs (default: paragen-worker- and a digest of --output, so "
                                 "that a restarted run finds and cancels what an earlier start left)")
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
    scheduler_interface: str | None = None
    log_dir: str | None = None
    mps: str = "auto"
    gpu_type: str | None = None
    gpu_directive: str = "gres"
    skip: tuple[str, ...] = ()
    job_name: str | None = None

    @property
    def log_folder(self) -> str:
        """Where the worker jobs' logs go (one .out and .err a job): LOG_DIR, else
        paragen-logs/JOB_NAME under the submit folder."""
        if self.log_dir:
            return self.log_dir
        base = os.environ.get("SLURM_SUBMIT_DIR") or os.getcwd()
        return os.path.join(base, "paragen-logs", self.job_name or "paragen-worker")

    def gpu_directives(self) -> list[str]:
        if not self.gpus_per_worker:
            return []
        count = f"{self.gpu_type}:{self.gpus_per_worker}" if self.gpu_type else str(self.gpus_per_worker)
        return [f"--gpus-per-node={count}" if self.gpu_directive == "gpus-per-node" else f"--gres=gpu:{count}"]

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
    for key in ("account", "interface", "scheduler_interface", "gpu_type", "job_name"):
        if values.get(key) is not None and not _NAME.match(str(values[key])):
            raise UsageError(f"--slurm_{key} {values[key]!r}: letters, digits and . _ + - only")
    if values.get("partition") is not None and not _NAMES_LIST.match(str(values["partition"])):
        raise UsageError(f"--slurm_partition {values['partition']!r}: a partition or a comma-separated list "
                         "(letters, digits and . _ + - only)")
    if values.get("gpu_directive", "gres") not in ("gres", "gpus-per-node"):
        raise UsageError(f"--slurm_gpu_directive must be gres or gpus-per-node, not {values['gpu_directive']!r}")
    for key in ("extra", "skip"):
        given = values.get(key) or ()
        values[key] = (given,) if isinstance(given, str) else tuple(str(e) for e in given)
    for e in values["extra"]:
        # each goes into the worker script as one '#SBATCH' line: one option, nothing else
        if not e.startswith("-") or any(c in e for c in "\n\r\0#;`$"):
            raise UsageError(f"--slurm_extra {e!r}: one sbatch option per value, such as --qos=long")
    for e in values["skip"]:
        if not _DIRECTIVE.match(e):
            raise UsageError(f"--slurm_skip {e!r}: the name of an sbatch option, such as --mem")
    if "time" in values:
        values["time"] = str(values["time"])
        if _minutes(values["time"]) < 5:
            raise UsageError(f"--slurm_time {values['time']}: at least 5 minutes (workers stop 2-20 minutes "
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
    limit cuts a unit in half; a tenth of the limit, between 2 and 10 minutes, is kept free, and
    the stagger (Dask adds or takes up to it at random) spreads the ends: 2-4 minutes before a
    5-minute limit, 10-20 before a day's."""
    limit = _minutes(settings.time)
    margin = max(2, min(10, limit // 10))
    stagger = max(1, margin // 2)
    return f"{limit - margin - stagger}m", f"{stagger}m"


def prologue(settings: SlurmSettings) -> list[str]:
    """The worker script's lines before `dask worker`: the site's own (jobqueue.yaml's
    job-script-prologue: `module load ...`), then GPU slots per job, no profiler, MPS."""
    import dask

    lines = [*(dask.config.get("jobqueue.slurm.job-script-prologue", None) or []),
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


def job_name_for(output: str) -> str:
    """The worker jobs' name for a run into OUTPUT: the same at every start of the same command, so
    that a start finds (and cancels) the worker jobs an earlier one left."""
    import hashlib

    return "paragen-worker-" + hashlib.sha256(output.encode("utf-8")).hexdigest()[:10]


def cluster_kwargs(settings: SlurmSettings, exclude: tuple[str, ...] = ()) -> dict:
    """SLURMCluster's (and SLURMJob's) arguments for SETTINGS; EXCLUDE: nodes the jobs must avoid.
    A site's jobqueue.yaml (dask's config: jobqueue.slurm.*) is honoured: its job-script-prologue
    runs first, its job-extra-directives and job-directives-skip are kept beside ours."""
    import dask

    lifetime, stagger = _lifetime(settings)
    site_extra = list(dask.config.get("jobqueue.slurm.job-extra-directives", None) or [])
    site_skip = list(dask.config.get("jobqueue.slurm.job-directives-skip", None) or [])
    directives = [*settings.gpu_directives(),
                  "--no-requeue",          # a preempted worker is replaced, not requeued
                  *(["--exclude=" + ",".join(exclude)] if exclude else []),
                  *site_extra, *settings.extra]
    skip = [*site_skip, *settings.skip]
    if skip:
        directives = [d for d in directives if not any(d.startswith(k) for k in skip)]
    # cores=processes: one Dask thread per process (a process decodes one unit at a time); the
    # job's cores (job_cpu) are what the processes' torch threads and host work share
    kwargs = dict(queue=settings.partition, account=settings.account, cores=settings.processes,
                  job_cpu=settings.cpus, processes=settings.processes, memory=f"{settings.memory_bytes}B",
                  walltime=settings.time, job_name=settings.job_name or "paragen-worker",
                  job_extra_directives=directives, job_directives_skip=skip,
                  job_script_prologue=prologue(settings),
                  worker_extra_args=["--lifetime", lifetime, "--lifetime-stagger", stagger,
                                     "--no-dashboard"],
                  python=shlex.quote(settings.python), death_timeout=DEATH_TIMEOUT_S,
                  interface=settings.interface, log_directory=settings.log_folder)
    return kwargs


def worker_script(settings: SlurmSettings, scheduler: str = "tcp://127.0.0.1:8786", logs: bool = True) -> str:
    """The batch script of one worker job (what `sbatch` gets), without starting a scheduler;
    LOGS False: without the log lines (a check that must not create the log folder)."""
    from dask_jobqueue.slurm import SLURMJob

    kwargs = cluster_kwargs(settings)
    kwargs.pop("interface")                        # the scheduler's address is given here
    if not logs:
        kwargs["log_directory"] = None
    return SLURMJob(scheduler=scheduler, name=kwargs["job_name"], **kwargs).job_script()


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
_FLEETS: dict = {}                       # id(stop event) -> (Fleet, SlurmSettings) of a running cluster
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
            subprocess.run(["scancel", "--name", name, "--user", getpass.getuser()], capture_output=True, timeout=10,
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
        subprocess.run(["scancel", "--name", name, "--user", getpass.getuser()], capture_output=True, timeout=30,
                       check=False)
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
    lifetime, stagger = _lifetime(settings)
    spares = os.environ.get("PARAGEN_SLURM_SPARES", "1") != "0"      # 0: replace workers only once they left
    fleet = Fleet(settings.workers, _seconds(lifetime) if spares else None, _seconds(stagger), check_seconds(),
                  backoff_s=(backoff_seconds(), BACKOFF_MAX_S))
    with _LOCK:
        _FLEETS[id(stop)] = (fleet, settings)
    threading.Thread(target=keep_workers, args=(cluster, settings, stop, fleet), name="paragen-slurm",
                     daemon=True).start()
    return cluster, stop


def _seconds(duration: str) -> float:
    value, unit = float(duration[:-1]), duration[-1]
    return value * {"s": 1, "m": 60, "h": 3600}[unit]


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
                cluster.workers.pop(job.spec, None)
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
        fleet, settings = _FLEETS.pop(id(stop), (None, None))
        if fleet is not None:
            _LAST_USAGE[:] = [{"job_name": settings.job_name, "gpus_per_worker": settings.gpus_per_worker,
                               **fleet.usage(time.monotonic(), settings.gpus_per_worker)}]
    try:
        cluster.close(timeout=30)
    finally:
        cancel_worker_jobs()
