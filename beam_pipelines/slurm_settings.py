"""The settings of the SLURM worker jobs (``--slurm_*``, or a YAML file of them: ``--slurm_config``),
checked, and the batch script they become (through dask-jobqueue's SLURMJob). No SLURM is asked
here: beam_pipelines/slurm.py submits and keeps the jobs."""
from __future__ import annotations

import dataclasses
import os
import re
import shlex
import sys

from apache_beam.options.pipeline_options import PipelineOptions

from common.cli import UsageError
from common.settings import env_seconds

DEATH_TIMEOUT_S = 60         # a worker's start that has not joined its scheduler by then fails (its job ends)


def death_timeout_seconds() -> float:
    """The longest a worker's start may take, joining its scheduler included (Dask's
    --death-timeout): $PARAGEN_SLURM_DEATH_TIMEOUT_SECONDS (default 60). A worker whose scheduler
    is gone ends sooner: at once when its connection breaks, and after Dask's connect timeout
    (distributed.comm.timeouts.connect, 30 s) when it never reached it (measured, distributed 2026.8)."""
    return env_seconds("PARAGEN_SLURM_DEATH_TIMEOUT_SECONDS", DEATH_TIMEOUT_S, 10, 86400, UsageError)


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


def lifetime_minutes(settings: SlurmSettings) -> tuple[int, int]:
    """Dask's --lifetime and --lifetime-stagger in minutes: workers end (and are replaced) before
    the time limit cuts a unit in half; a tenth of the limit, between 2 and 10 minutes, is kept
    free, and the stagger (Dask adds or takes up to it at random) spreads the ends: 2-4 minutes
    before a 5-minute limit, 10-20 before a day's."""
    limit = _minutes(settings.time)
    margin = max(2, min(10, limit // 10))
    stagger = max(1, margin // 2)
    return limit - margin - stagger, stagger


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

    lifetime, stagger = lifetime_minutes(settings)
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
                  worker_extra_args=["--lifetime", f"{lifetime}m", "--lifetime-stagger", f"{stagger}m",
                                     "--no-dashboard"],
                  python=shlex.quote(settings.python), death_timeout=death_timeout_seconds(),
                  interface=settings.interface, log_directory=settings.log_folder)
    return kwargs


def worker_script(settings: SlurmSettings, scheduler: str = "tcp://127.0.0.1:8786", logs: bool = False) -> str:
    """The batch script of one worker job (what `sbatch` gets), without starting a scheduler;
    LOGS: with the log lines (which creates the log folder; not for a check or a dry run)."""
    from dask_jobqueue.slurm import SLURMJob

    kwargs = cluster_kwargs(settings)
    kwargs.pop("interface")                        # the scheduler's address is given here
    if not logs:
        kwargs["log_directory"] = None
    return SLURMJob(scheduler=scheduler, name=kwargs["job_name"], **kwargs).job_script()
