"""`LOCAL=1 deploy/run_flink.sh JOB_ARGS...`: the path a Flink submission takes on the Python side,
on this machine, with no Flink cluster.

Beam's FlinkRunner is the PortableRunner plus a Java job server. This starts Beam's own Python job
service (`apache_beam.runners.portability.local_job_service_main`: the same portable Job API, with
artifact staging) and an EXTERNAL worker pool (`apache_beam.runners.worker.worker_pool_main`, what
`boot --worker_pool` is in the SDK image) on loopback, submits the job to them as run_flink.sh
with ENV_TYPE=EXTERNAL would (`--runner PortableRunner --job_endpoint ... --environment_type
EXTERNAL --setup_file setup.py`), and stops both at the end. The pipeline is serialised, its
artifacts staged, and it runs in SDK harness processes the pool starts: processes that share
nothing with the submitting one but the installed packages (as the image's do), so a pipeline
that only works in one process fails here first.

Usage: python deploy/portable_local.py generate|filter JOB_ARGS...   (exit status: the job's)
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START_SECONDS = 60


def _wait_for(read, what: str, proc: subprocess.Popen, log: str) -> str:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        value = read()
        if value:
            return value
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    with open(log, errors="replace") as f:
        tail = f.read()[-2000:]
    raise SystemExit(f"error: {what} did not start (its log: {log}): {tail.strip()}")


def _read(path: str) -> str:
    with contextlib.suppress(OSError), open(path, errors="replace") as f:
        return f.read()
    return ""


@contextlib.contextmanager
def services(folder: str):
    """(job endpoint, worker pool address) of a job service and a worker pool started in FOLDER."""
    procs = []
    try:
        port_file, job_log = os.path.join(folder, "job_service.port"), os.path.join(folder, "job_service.log")
        with open(job_log, "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "apache_beam.runners.portability.local_job_service_main", "--port", "0",
                 "--port_file", port_file, "--staging_dir", os.path.join(folder, "staging")],
                stdout=log, stderr=subprocess.STDOUT, cwd=folder, start_new_session=True))
        job_port = _wait_for(lambda: _read(port_file).strip(), "Beam's job service", procs[-1], job_log)
        pool_log = os.path.join(folder, "worker_pool.log")
        # The pool starts its SDK workers as `python ...`: this interpreter's folder first on PATH,
        # and nothing of the submitter's (no PYTHONPATH, another working folder)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        with open(pool_log, "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main", "--service_port", "0"],
                stdout=log, stderr=subprocess.STDOUT, cwd=folder, env=env, start_new_session=True))

        def pool_address():
            m = re.search(r"worker pool servicer at port: (\S+:\d+)", _read(pool_log))
            return m and m.group(1)
        pool = _wait_for(pool_address, "Beam's worker pool", procs[-1], pool_log)
        yield f"localhost:{job_port}", pool
    finally:
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("generate", "filter") or argv[1:2] in (["-h"], ["--help"]):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 0 if argv[1:2] in (["-h"], ["--help"]) else 2
    job, args = argv[0], argv[1:]
    if any(a == "--runner" or a.startswith("--runner=") for a in args):
        print("error: LOCAL=1 chooses the runner (PortableRunner): leave --runner out", file=sys.stderr)
        return 2
    folder = tempfile.mkdtemp(prefix="paragen-portable-")
    with services(folder) as (endpoint, pool):
        print(f"paragen: Beam job service at {endpoint}, worker pool at {pool} (logs in {folder})",
              file=sys.stderr, flush=True)
        command = [sys.executable, "-m", f"beam_pipelines.{job}", "--runner", "PortableRunner",
                   "--job_endpoint", endpoint, "--environment_type", "EXTERNAL", "--environment_config", pool,
                   "--setup_file", os.path.join(ROOT, "setup.py"), *args]
        proc = subprocess.Popen(command, cwd=ROOT)
        # a stop reaches the job (its own SIGTERM contract), then the services go
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda s, _f: proc.send_signal(s))
        status = proc.wait()
    if status == 0:
        shutil.rmtree(folder, ignore_errors=True)
    else:
        print(f"paragen: the job service's and the worker pool's logs: {folder}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
