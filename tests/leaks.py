"""Processes the suite leaves running: every process a test starts inherits a marker in its
environment (PARAGEN_TEST_SESSION, set once per suite run by conftest.py before any test or xdist
worker starts), so at the end of the run anything still alive with the marker is a leak: a server a
fixture did not stop, a daemon a script left (the Dask schedulers of deploy/slurm/allocation.sbatch
used to run on after their job). conftest.py reports them, ends them and fails the run.

Linux only (/proc); elsewhere nothing is found."""
from __future__ import annotations

import os
import signal
import time

SESSION_ENV = "PARAGEN_TEST_SESSION"
_GATEWAY = "import sys;exec(eval(sys.stdin.readline()))"      # execnet's command line: an xdist worker


def _read(pid: str, name: str) -> bytes:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except OSError:             # gone, or not ours to read
        return b""


def marked(marker: str, exclude: set[int] = frozenset()) -> dict[int, str]:
    """{pid: command line} of the live processes whose environment carries MARKER, but EXCLUDE,
    zombies and xdist's workers."""
    found = {}
    if not os.path.isdir("/proc"):
        return found
    needle = f"{SESSION_ENV}={marker}".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) in exclude:
            continue
        if needle not in _read(pid, "environ").split(b"\0"):
            continue
        stat = _read(pid, "stat").decode(errors="replace")
        if ") Z" in stat or ") X" in stat:
            continue
        cmd = _read(pid, "cmdline").replace(b"\0", b" ").decode(errors="replace").strip()
        if _GATEWAY in cmd:
            continue
        found[int(pid)] = cmd[:300]
    return found


def leftovers(marker: str, grace: float = 10.0) -> dict[int, str]:
    """The marked processes still alive after GRACE seconds (a server stopped by a fixture's
    teardown may take a moment to exit), this process and its parents aside."""
    exclude = {os.getpid()}
    pid = os.getppid()
    while pid > 1:
        exclude.add(pid)
        try:
            pid = int(_read(str(pid), "stat").decode().rsplit(")", 1)[1].split()[1])
        except (IndexError, ValueError):
            break
    deadline = time.monotonic() + grace
    while True:
        found = marked(marker, exclude)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def end(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def running_with(text: str) -> dict[int, str]:
    """{pid: command line} of the live processes (zombies aside) whose command line contains TEXT."""
    found = {}
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not pid.isdigit():
            continue
        cmd = _read(pid, "cmdline").replace(b"\0", b" ").decode(errors="replace")
        stat = _read(pid, "stat").decode(errors="replace")
        if text in cmd and ") Z" not in stat:
            found[int(pid)] = cmd.strip()[:300]
    return found
