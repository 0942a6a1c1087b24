"""Run a bench function in a fresh Python process, so that each measurement has its own caches,
threads and peak memory; start the jobs a benchmark measures.

PARAGEN_BENCH_IN_PROCESS=1 runs a function in the calling process instead, and under the test
suite's smoke tier (PARAGEN_WARM_ZYGOTE set) the jobs are forked from its warm interpreter
(tests/warm_python.py): the same commands, without their 4-5 s of imports each (a smoke run's
figures mean nothing; a process start was most of one)."""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")


def in_process() -> bool:
    """Whether measurements run in this process (PARAGEN_BENCH_IN_PROCESS=1)."""
    return os.environ.get("PARAGEN_BENCH_IN_PROCESS") == "1"


def in_fresh_process(module: str, function: str, *args) -> dict:
    """bench/MODULE.py's FUNCTION(*ARGS) in a new process with one OpenMP thread; its JSON result."""
    if in_process():
        # the same JSON round trip as a child's, so that a result that would not cross fails here too
        if BENCH not in sys.path:
            sys.path.insert(0, BENCH)
        fn = getattr(importlib.import_module(module), function)
        return json.loads(json.dumps(fn(*json.loads(json.dumps(args)))))
    code = (f"import json, sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {BENCH!r}); "
            f"import {module} as b; print('RESULT', json.dumps(b.{function}(*json.loads(sys.argv[1]))))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{function} failed:\n{done.stderr[-3000:]}")
    return json.loads(line[7:])


def _warm():
    """tests/warm_python.py where the smoke tier gave this script its zygote, else None."""
    if not os.environ.get("PARAGEN_WARM_ZYGOTE"):
        return None
    from tests import warm_python

    return warm_python


def job_popen(args, **kwargs) -> subprocess.Popen:
    """subprocess.Popen of a job's command (forked warm under the smoke tier)."""
    warm = _warm()
    return warm.popen(args, **kwargs) if warm else subprocess.Popen(args, **kwargs)


def job_run(args, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run of a job's command (forked warm under the smoke tier)."""
    warm = _warm()
    return warm.run(args, **kwargs) if warm else subprocess.run(args, **kwargs)
