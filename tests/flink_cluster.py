"""A real Flink session cluster on this machine, for the tests: one JobManager and two TaskManagers,
each a JVM of its own started by Flink's own scripts (``bin/jobmanager.sh start-foreground``,
``bin/taskmanager.sh start-foreground``) from the Flink that scripts/install_flink.sh unpacked in
.flink/, with a configuration written to a temporary folder (free loopback ports, memory sized for
two cores and a few GB). Each task manager starts the Python SDK workers of a job itself, as a
user without Docker runs them: Beam's PROCESS environment with deploy/flink/sdk_worker.sh as its
boot command (BOOT). (Beam's EXTERNAL worker pool does not do for two task managers of one
machine: both number their workers from 1-1, and one pool mixes them up; on separate machines
each has its own.) The jobs are submitted through deploy/run_flink.sh, which starts Beam's Flink
job server (the jar install_flink.sh built) itself. Everything is stopped by the test.

Each task manager has two slots and the cluster spreads a job's subtasks over the task managers
(cluster.evenly-spread-out-slots), so a job of parallelism 2 runs on both, and the one left after
the other is killed still has the slots to restart it, where the cluster's configuration has a
restart strategy (``restarts``; heartbeat.timeout 12 s notices a lost task manager)."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLINK_VERSION = "1.19.3"
FLINK_HOME = os.path.join(ROOT, ".flink", f"flink-{FLINK_VERSION}")
JOB_SERVER_JAR = os.path.join(ROOT, ".flink", "job-server", "beam-flink-job-server.jar")
BOOT = os.path.join(ROOT, "deploy", "flink", "sdk_worker.sh")


def missing() -> str | None:
    """Why the Flink tests cannot run here, or None."""
    import shutil

    if not shutil.which("java"):
        return "no java on PATH (Flink needs Java 17)"
    if not os.path.isfile(os.path.join(FLINK_HOME, "lib", f"flink-dist-{FLINK_VERSION}.jar")):
        return f"Flink is not installed in {FLINK_HOME} (scripts/install_flink.sh)"
    if not os.path.isfile(JOB_SERVER_JAR):
        return f"Beam's Flink job server is not built ({JOB_SERVER_JAR}: scripts/install_flink.sh)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _java_opts() -> str:
    """The JVM options Flink's own config.yaml carries for Java 17 (--add-opens and -exports)."""
    with open(os.path.join(FLINK_HOME, "conf", "config.yaml")) as f:
        m = re.search(r"^\s+all: (--add-\S+(?: --add-\S+)*)\s*$", f.read(), re.M)
    return m.group(1) if m else ""


CONFIG = """env:
  java:
    opts:
      all: {java_opts} -Djava.io.tmpdir={tmp}
io:
  tmp:
    dirs: {tmp}
jobmanager:
  bind-host: 127.0.0.1
  rpc:
    address: 127.0.0.1
    port: {rpc}
  memory:
    process:
      size: 1024m
taskmanager:
  bind-host: 127.0.0.1
  host: 127.0.0.1
  numberOfTaskSlots: 2
  memory:
    process:
      size: 1536m
cluster:
  evenly-spread-out-slots: true
heartbeat:
  interval: 2000
  timeout: 12000
blob:
  server:
    port: "{blob}"
rest:
  address: 127.0.0.1
  bind-address: 127.0.0.1
  port: {rest}
parallelism:
  default: 2
"""
RESTARTS = """restart-strategy:
  type: fixed-delay
  fixed-delay:
    attempts: {attempts}
    delay: {delay_ms} ms
"""


class Flink:
    """The cluster in FOLDER: :meth:`start`, :meth:`stop`, the REST API, the task managers."""

    def __init__(self, folder: str, restarts: tuple[int, int] | None = None):
        self.restarts = restarts          # (attempts, delay in ms) of a fixed-delay restart strategy, or none
        self.dir = folder
        self.conf = os.path.join(folder, "conf")
        self.logs = os.path.join(folder, "log")
        # the JVMs' temporaries (Flink's io.tmp.dirs, its JAAS file, lz4's native library) in the
        # test's folder: Java does not read TMPDIR, and a killed task manager removes nothing
        self.tmp = os.path.join(folder, "tmp")
        self.rest_port = _free_port()
        self.master = f"127.0.0.1:{self.rest_port}"
        self.jobmanager: subprocess.Popen | None = None
        self.taskmanagers: list[subprocess.Popen] = []

    # ---- processes
    def _env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}      # as a machine's daemon has it
        return {**env, "FLINK_CONF_DIR": self.conf, "FLINK_LOG_DIR": self.logs, "FLINK_PID_DIR": self.logs,
                "FLINK_HOME": FLINK_HOME}

    def _start(self, script: str, log: str) -> subprocess.Popen:
        out = open(os.path.join(self.logs, log), "w")
        return subprocess.Popen(["bash", os.path.join(FLINK_HOME, "bin", script), "start-foreground"], env=self._env(),
                                stdout=out, stderr=subprocess.STDOUT, cwd=self.dir, start_new_session=True)

    def start(self, taskmanagers: int = 2) -> "Flink":
        os.makedirs(self.conf, exist_ok=True)
        os.makedirs(self.logs, exist_ok=True)
        os.makedirs(self.tmp, exist_ok=True)
        for name in os.listdir(os.path.join(FLINK_HOME, "conf")):
            if name.startswith("log4j"):
                with open(os.path.join(FLINK_HOME, "conf", name)) as src, open(os.path.join(self.conf, name), "w") as dst:
                    dst.write(src.read())
        with open(os.path.join(self.conf, "config.yaml"), "w") as f:
            f.write(CONFIG.format(java_opts=_java_opts(), tmp=self.tmp, rpc=_free_port(), blob=_free_port(), rest=self.rest_port))
            if self.restarts:
                f.write(RESTARTS.format(attempts=self.restarts[0], delay_ms=self.restarts[1]))
        self.jobmanager = self._start("jobmanager.sh", "jobmanager.out")
        for _ in range(taskmanagers):
            self.start_taskmanager()
        self.wait(lambda: self.overview().get("taskmanagers") == taskmanagers, f"{taskmanagers} task managers", 180)
        return self

    def start_taskmanager(self) -> subprocess.Popen:
        tm = self._start("taskmanager.sh", f"taskmanager-{len(self.taskmanagers)}.out")
        self.taskmanagers.append(tm)
        return tm

    def kill_taskmanager(self, tm: subprocess.Popen) -> None:
        """SIGKILL a task manager's JVM (a lost machine): no word to the job manager."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(tm.pid, signal.SIGKILL)
        tm.wait(timeout=30)

    def stop(self) -> None:
        for p in [*self.taskmanagers, self.jobmanager]:
            if p is None or p.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in [*self.taskmanagers, self.jobmanager]:
            if p is None:
                continue
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)

    # ---- what the cluster says
    def rest(self, path: str, method: str = "GET"):
        req = urllib.request.Request(f"http://{self.master}{path}", method=method)
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else {}

    def overview(self) -> dict:
        try:
            return self.rest("/overview")
        except OSError:
            return {}

    def jobs(self) -> list[dict]:
        """[{jid, name, state, ...}] of every job the cluster has seen, oldest first."""
        return sorted(self.rest("/jobs/overview")["jobs"], key=lambda j: j["start-time"])

    def taskmanagers_of(self, jid: str) -> set[str]:
        """The ids of the task managers that ran a subtask of job JID (any vertex, any attempt)."""
        used = set()
        for vertex in self.rest(f"/jobs/{jid}")["vertices"]:
            for tm in self.rest(f"/jobs/{jid}/vertices/{vertex['id']}/taskmanagers").get("taskmanagers", []):
                used.add(tm.get("taskmanager-id") or tm.get("host"))
        return used

    def restarted(self, jid: str) -> bool:
        """True when Flink restarted job JID at least once (its RESTARTING state has a time)."""
        return bool(self.rest(f"/jobs/{jid}").get("timestamps", {}).get("RESTARTING"))

    def log(self, name: str) -> str:
        with contextlib.suppress(OSError), open(os.path.join(self.logs, name), errors="replace") as f:
            return f.read()
        return ""

    def logs_text(self) -> str:
        return "\n".join(f"== {n}\n{self.log(n)[-3000:]}" for n in sorted(os.listdir(self.logs)))

    def wait(self, ready, what: str, timeout: float) -> None:
        """Until READY(); RuntimeError naming WHAT and the logs if TIMEOUT passes (a guard against a
        hang: the cluster's start, not a measured time)."""
        deadline = time.monotonic() + timeout
        while not ready():
            if self.jobmanager is not None and self.jobmanager.poll() is not None:
                raise RuntimeError(f"the job manager ended while waiting for {what}:\n{self.logs_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: not there after {timeout:.0f} s:\n{self.logs_text()}")
            time.sleep(0.5)


@contextlib.contextmanager
def flink_cluster(folder: str, taskmanagers: int = 2, restarts: tuple[int, int] | None = None):
    """A cluster in FOLDER; RESTARTS (attempts, delay ms): a fixed-delay restart strategy in its
    configuration, else none (Flink's default: a failed task fails a batch job)."""
    cluster = Flink(str(folder), restarts)
    try:
        yield cluster.start(taskmanagers)
    finally:
        cluster.stop()
