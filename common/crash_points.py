"""Stopping a job at one of its storage operations, on purpose: the hook of the crash-point harness
(tests/crash_points.py, bench/bench_crash_points.py; issue 53).

ALICE (Pillai et al., OSDI 2014) and SQLite's crash tests stop a program at every I/O operation and
check what a reader sees and what recovery does. The jobs' storage operations all go through
common/storage.py, which calls :func:`storage_op` before each write, delete and listing. With
neither variable set that is one dictionary lookup; with them:

* ``PARAGEN_STORAGE_TRACE=FILE`` appends ``<n> <kind> <pid> <path>`` to FILE for each operation of this
  process (how a harness learns how many there are, and which);
* ``PARAGEN_CRASH_AT=N:SIG`` sends signal SIG (``KILL``, ``TERM``, ``INT``; ``STOP`` pauses the
  process, as a suspended job or a VM pause would, until the harness sends SIGCONT) to this
  process just before its Nth operation (counted from 1); ``PARAGEN_CRASH_AT=~SUFFIX:SIG`` before
  the first operation on a path ending in SUFFIX (``~_manifest.json:TERM``: while the manifest is
  written; ``*TEXT``: a path containing TEXT), ``~SUFFIX@K:SIG`` before the Kth such operation, ``~SUFFIX@K+M:SIG`` before the Mth
  operation after it (``~_manifest.json@2+1:TERM``: the first step after a local manifest's
  rename, i.e. the first of its clean-up).

Both are read by the process that does the operation: the DirectRunner's worker processes inherit
them and count their own operations, so a harness wanting one sequence runs the job in one
process (the in-memory runner).
"""
from __future__ import annotations

import os
import signal
import threading

_LOCK = threading.Lock()
_COUNT = [0]
_FIRED = [False]
_MATCHED = [0]                 # operations so far on paths ending in the ~SUFFIX
_AT = [None]                   # ~SUFFIX@K+M: the operation number to stop before, once the Kth is seen


def storage_op(kind: str, path: str) -> None:
    """Called by common/storage.py before each storage operation KIND on PATH."""
    trace, crash = os.environ.get("PARAGEN_STORAGE_TRACE"), os.environ.get("PARAGEN_CRASH_AT")
    if not trace and not crash:
        return
    with _LOCK:
        _COUNT[0] += 1
        n = _COUNT[0]
        if trace:
            with open(trace, "a", encoding="utf-8") as f:
                f.write(f"{n} {kind} {os.getpid()} {path}\n")
        if not crash or _FIRED[0]:
            return
        where, _, name = crash.rpartition(":")
        if where[:1] in ("~", "*"):
            suffix, _, k = where[1:].partition("@")
            k, _, after = k.partition("+")
            if _AT[0] is not None:
                hit = n == _AT[0]
            elif not (path.endswith(suffix) if where[0] == "~" else suffix in path):
                return
            else:
                _MATCHED[0] += 1
                if _MATCHED[0] != int(k or 1):
                    return
                if after:
                    _AT[0] = n + int(after)
                    return
                hit = True
        else:
            hit = where == str(n)
        if not hit:
            return
        _FIRED[0] = True
    os.kill(os.getpid(), getattr(signal, f"SIG{name.upper()}"))


__all__ = ["storage_op"]
