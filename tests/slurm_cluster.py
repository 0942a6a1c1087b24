"""A real SLURM cluster on this machine, for the tests: munged, slurmctld and one slurmd per node
(Debian's slurm-wlm and munge, scripts/install_slurm.sh) in the foreground, on free loopback
ports, with every file in a temporary folder; stopped by the test. No cgroups: processes are
tracked by their parent ids (proctrack/linuxproc). The nodes claim more cores and memory than
this machine has (SlurmdParameters=config_overrides), as a real cluster's nodes would have:

- partition `debug` (the default) and `short` (10-minute limit): node g1, 16 cores,
  256 GB, four GPUs by count only (stand-in device files), so that the deploy/slurm scripts'
  GPU requests are granted (the jobs decode on the CPU);
- partition `nodes`: nodes n1..n3 (one slurmd each, on its own port: SLURM's several-slurmd-a-host
  set-up), 4 cores and 8 GB each, so that a driver (8 GB) and each worker job asking for more
  than 4 GB have a node of their own, as on a cluster of many nodes (memory is a consumable
  resource, CR_Core_Memory, as on most clusters)."""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import subprocess
import time

DAEMONS = ("munged", "slurmctld", "slurmd")


def missing() -> str | None:
    """Why a SLURM cluster cannot be started here (None: it can)."""
    absent = [d for d in (*DAEMONS, "sbatch", "scontrol", "squeue", "scancel") if not shutil.which(d)]
    if absent:
        return f"{', '.join(absent)} not installed (scripts/install_slurm.sh installs Debian's slurm-wlm and munge)"
    if os.geteuid() != 0:
        return "slurmd runs jobs as their users and needs root here"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONF = """\
ClusterName=paragen-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge/socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool/%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/log/slurmctld.log
SlurmdLogFile={dir}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
MinJobAge=3600
KillWait=10
SchedulerParameters=sched_interval=2
GresTypes=gpu
NodeName=g1 NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=16 RealMemory=262144 Gres=gpu:4 State=UNKNOWN
{small_nodes}
PartitionName=debug Nodes=g1 Default=YES MaxTime=INFINITE State=UP
PartitionName=short Nodes=g1 MaxTime=10 State=UP
PartitionName=nodes Nodes={small_names} MaxTime=INFINITE State=UP
"""
SMALL_NODES = ("n1", "n2", "n3")
NODES = ("g1", *SMALL_NODES)


class Slurm:
    """The running cluster: ENV for its commands (SLURM_CONF), and helpers a test needs."""

    def __init__(self, folder: str):
        self.dir = folder
        self.conf = os.path.join(folder, "slurm.conf")
        self.env = {**os.environ, "SLURM_CONF": self.conf}
        self._procs: list[subprocess.Popen] = []

    def run(self, *args, check=True, timeout=60) -> subprocess.CompletedProcess:
        done = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
        return done

    def job(self, job_id: str) -> dict:
        """scontrol show job's fields of JOB_ID (its state, restarts, exit code, ...)."""
        text = self.run("scontrol", "show", "job", "-o", str(job_id)).stdout
        return dict(field.split("=", 1) for field in text.split() if "=" in field)

    def jobs(self, name_prefix: str = "") -> list[dict]:
        """Every job slurmctld knows (finished ones included), whose name starts with NAME_PREFIX."""
        text = self.run("scontrol", "show", "job", "-o").stdout
        out = []
        for line in text.splitlines():
            fields = dict(field.split("=", 1) for field in line.split() if "=" in field)
            if fields.get("JobName", "").startswith(name_prefix):
                out.append(fields)
        return out

    def wait_state(self, job_id: str, states: set[str], timeout: float = 300) -> dict:
        deadline = time.time() + timeout
        while True:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            if time.time() > deadline:
                raise AssertionError(f"job {job_id} still {info.get('JobState')} after {timeout:.0f} s; "
                                     f"slurmctld log: {self.log('slurmctld')[-2000:]}")
            time.sleep(0.5)

    def log(self, daemon: str) -> str:
        path = os.path.join(self.dir, "log", f"{daemon}.log")
        return open(path, errors="replace").read() if os.path.exists(path) else ""

    def _start(self, args: list[str], name: str) -> None:
        out = open(os.path.join(self.dir, "log", f"{name}.out"), "w")
        self._procs.append(subprocess.Popen(args, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True))

    def start(self) -> None:
        d = self.dir
        for sub in ("munge", "state", "log", *(os.path.join("spool", n) for n in NODES)):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        os.chmod(os.path.join(d, "munge"), 0o700)
        with open(os.path.join(d, "munge", "munge.key"), "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(os.path.join(d, "munge", "munge.key"), 0o600)
        with open(self.conf, "w") as f:
            small = "\n".join(f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={_free_port()} CPUs=4 "
                              f"RealMemory=8192 State=UNKNOWN" for n in SMALL_NODES)
            f.write(CONF.format(dir=d, ctld_port=_free_port(), d_port=_free_port(), small_nodes=small,
                                small_names=",".join(SMALL_NODES)))
        # four stand-in GPU device files (character devices like /dev/null): jobs may ask for
        # --gres=gpu:N, as on a GPU cluster, and decode on the CPU here
        for i in range(4):
            os.mknod(os.path.join(d, f"gpu{i}"), 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        with open(os.path.join(d, "gres.conf"), "w") as f:
            f.write(f"NodeName=g1 Name=gpu File={d}/gpu[0-3]\n")
        m = os.path.join(d, "munge")
        self._start(["munged", "--foreground", "--force", f"--socket={m}/socket", f"--key-file={m}/munge.key",
                     f"--pid-file={m}/munged.pid", f"--seed-file={m}/seed", f"--log-file={d}/log/munged.log"],
                    "munged")
        self._wait(lambda: os.path.exists(f"{m}/socket"), "munged")
        self._start(["slurmctld", "-D", "-i", "-f", self.conf], "slurmctld")
        self._wait(lambda: self.run("scontrol", "ping", check=False).returncode == 0, "slurmctld")
        for node in NODES:
            self._start(["slurmd", "-D", "-f", self.conf, "-N", node], f"slurmd-{node}")
        self._wait(lambda: self.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.split() == ["idle"] * 5,
                   "slurmd-g1")

    def _wait(self, ready, what: str, timeout: float = 60) -> None:
        deadline = time.time() + timeout
        while not ready():
            dead = [p for p in self._procs if p.poll() is not None]
            if dead or time.time() > deadline:
                out = open(os.path.join(self.dir, "log", f"{what}.out"), errors="replace").read()
                raise RuntimeError(f"{what} did not start: {out[-2000:]} {self.log(what)[-2000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.run("scancel", "--user", "root", "--full", check=False, timeout=10)
            time.sleep(1)
        for p in reversed(self._procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 15)
        for p in reversed(self._procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, 9)
                p.wait(timeout=5)


@contextlib.contextmanager
def slurm_cluster(folder: str):
    cluster = Slurm(str(folder))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
