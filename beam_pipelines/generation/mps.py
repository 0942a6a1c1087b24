"""GPU worker processes that really share a GPU: a CUDA MPS control daemon for the run.

Without MPS the kernels of different processes never run at the same time on one GPU: the
processes take turns (time-sliced contexts), so several decoding processes per GPU overlap only
their host work. Under an MPS server their kernels run side by side. A DirectRunner job on a GPU
machine starts its own control daemon when it runs more than one process per GPU
(``--mps auto``): ``nvidia-cuda-mps-control -d`` with its pipe and log directories in a fresh
folder of the run's temporary space (``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_LOG_DIRECTORY``,
which the worker processes inherit), and ``quit`` to it when the job ends, however it ends.
Nothing about the device is changed (MPS works in the default compute mode; the job never sets
one). Where the environment already names an MPS pipe directory (a daemon run by an
administrator or a launcher: deploy/), the workers use that one and nothing is started.

The launchers in deploy/ do the same for Dask workers and the SLURM and Kubernetes examples;
Dataflow asks for it with ``worker_accelerator=...;use_nvidia_mps`` (deploy/run_dataflow.sh).
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from beam_pipelines.options import is_local
from common import stopping
from common.cli import UsageError

log = logging.getLogger("paragen")

CONTROL = "nvidia-cuda-mps-control"
ENV = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")


@dataclass
class MpsState:
    """What the manifest records: on/off, and why."""
    on: bool
    how: str                 # "started", "external", or why not: "off", "cpu", "one process per GPU", ...

    def to_dict(self) -> dict:
        return {"on": self.on, "how": self.how}


def check_mps(mode: str, device: str | None, runner: str, processes_per_gpu: int) -> None:
    """Refuse --mps on where it cannot be had (checked before anything is written)."""
    if mode != "on":
        return
    if not is_local(runner):
        raise UsageError("--mps on: the job starts MPS for the DirectRunner's worker processes only; on a "
                         "cluster the workers' launcher does (deploy/README.md, 'GPU sharing')")
    if device == "cpu":
        raise UsageError("--mps on: this job decodes on the CPU")
    if not os.environ.get("CUDA_MPS_PIPE_DIRECTORY") and shutil.which(CONTROL) is None:
        raise UsageError(f"--mps on: {CONTROL} is not on PATH (it comes with the NVIDIA driver); use --mps auto "
                         "to run without MPS where it is missing")


def _control(args: list[str], env: dict, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([CONTROL, *args], env=env, input=stdin, capture_output=True, text=True, timeout=60)


class MpsDaemon:
    """The run's MPS control daemon, as a context manager: started on entry where MODE and the
    machine allow (``state`` says what happened), told to quit and its folder removed on exit."""

    def __init__(self, mode: str, gpu: bool, processes_per_gpu: int, temp_root: str | None = None):
        self.mode, self.gpu, self.processes_per_gpu = mode, gpu, processes_per_gpu
        self.temp_root = temp_root
        self.folder: str | None = None
        self._saved: dict = {}
        self.state = MpsState(False, "not started")

    def _why_not(self) -> str | None:
        if self.mode == "off":
            return "off"
        if not self.gpu:
            return "cpu"
        if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
            return None
        if self.processes_per_gpu < 2 and self.mode == "auto":
            return "one process per GPU"
        if shutil.which(CONTROL) is None:
            return f"{CONTROL} not found"
        return None

    def __enter__(self) -> "MpsDaemon":
        why = self._why_not()
        if why is not None:
            self.state = MpsState(False, why)
            return self
        if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
            self.state = MpsState(True, "external")
            log.info("CUDA MPS: the workers use the daemon of %s", os.environ["CUDA_MPS_PIPE_DIRECTORY"])
            return self
        self.folder = tempfile.mkdtemp(prefix="paragen-mps-", dir=self.temp_root)
        dirs = {name: os.path.join(self.folder, name.split("_")[2].lower()) for name in ENV}
        for d in dirs.values():
            os.makedirs(d)
        env = {**os.environ, **dirs}
        try:
            done = _control(["-d"], env)
        except (OSError, subprocess.SubprocessError) as exc:
            done = subprocess.CompletedProcess([CONTROL], 1, "", str(exc))
        if done.returncode != 0:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
            why = f"{CONTROL} -d failed: {(done.stderr or done.stdout).strip()[:200] or f'exit {done.returncode}'}"
            if self.mode == "on":
                raise RuntimeError(f"--mps on: {why}")
            log.warning("CUDA MPS not started (%s): the worker processes take turns on the GPU", why)
            self.state = MpsState(False, why)
            return self
        self._saved = {name: os.environ.get(name) for name in ENV}
        os.environ.update(dirs)                   # the worker processes started from here inherit it
        self.state = MpsState(True, "started")
        # a stop (SIGTERM, SIGINT, a dead worker) ends the process with os._exit, past this
        # object's __exit__: the daemon, detached by -d, would outlive the job
        stopping.at_end(self.__exit__)
        log.info("CUDA MPS control daemon started for the GPU worker processes (pipes in %s)", dirs[ENV[0]])
        return self

    def __exit__(self, *exc) -> None:
        stopping.not_at_end(self.__exit__)
        if self.folder is None:
            return
        env = dict(os.environ)
        try:
            done = _control([], env, stdin="quit\n")
            if done.returncode != 0:
                log.warning("CUDA MPS control daemon: quit answered %s", (done.stderr or done.stdout).strip()[:200])
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("CUDA MPS control daemon: could not send quit (%s)", exc)
        finally:
            for name, value in self._saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


__all__ = ["MpsDaemon", "MpsState", "check_mps"]
