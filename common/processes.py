"""Which process holds something (a run's claim, a directory's lock) and whether it has ended:
a holder of this machine whose process is gone can be taken over at once, without waiting for
its record to go stale."""
from __future__ import annotations

import contextlib
import os
import socket


def identity() -> dict:
    """What tells this process apart from one with the same pid elsewhere: the host name, the
    kernel's boot id and the pid namespace (pods with host networking share a host name, not
    their pids)."""
    ident = {"host": socket.gethostname(), "pid": os.getpid()}
    with contextlib.suppress(OSError):
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            ident["boot_id"] = f.read().strip()
    with contextlib.suppress(OSError):
        ident["pid_ns"] = os.stat("/proc/self/ns/pid").st_ino
    return ident


def same_pid_space(holder: dict) -> bool:
    """True when HOLDER's pid (an identity()) means a process of this machine's pid namespace."""
    mine = identity()
    if holder.get("host") != mine["host"] or not holder.get("pid"):
        return False
    return all(holder.get(k) == mine.get(k) for k in ("boot_id", "pid_ns") if k in holder or k in mine)


def ended(holder: dict) -> bool:
    """True when HOLDER (an identity()) is a process of this machine's pid namespace that has
    ended; False when it is alive, another user's, or not one this machine can tell about."""
    if not same_pid_space(holder):
        return False
    try:
        os.kill(int(holder["pid"]), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError, TypeError):
        return False
    return False
