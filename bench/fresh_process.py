"""Run a bench function in a fresh Python process, so that each measurement has its own caches,
threads and peak memory."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def in_fresh_process(module: str, function: str, *args) -> dict:
    """bench/MODULE.py's FUNCTION(*ARGS) in a new process with one OpenMP thread; its JSON result."""
    code = (f"import json, sys; sys.path.insert(0, {ROOT!r}); sys.path.insert(0, {os.path.join(ROOT, 'bench')!r}); "
            f"import {module} as b; print('RESULT', json.dumps(b.{function}(*json.loads(sys.argv[1]))))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{function} failed:\n{done.stderr[-3000:]}")
    return json.loads(line[7:])
