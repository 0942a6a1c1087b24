"""A real dask.distributed cluster on loopback (a scheduler and worker processes), for the tests'
fixture and the benchmarks: started, waited for, stopped."""
import contextlib
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextlib.contextmanager
def local_dask_cluster(folder: str, env: dict | None = None, workers: int = 2, worker_envs: list | None = None):
    """Yield the scheduler's address: a scheduler and WORKERS one-thread worker processes on
    127.0.0.1, their files under FOLDER, ENV added to their environment (a crash point, say); with
    WORKER_ENVS, one worker process for each, that added to its environment too (workers on
    machines of two kinds)."""
    os.makedirs(folder, exist_ok=True)
    sched_file = os.path.join(folder, f"scheduler-{time.monotonic_ns()}.json")
    penv = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                               "--port", "0", "--dashboard-address", ":0", "--scheduler-file", sched_file],
                              env=penv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        deadline = time.time() + 60
        while not os.path.exists(sched_file) and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(0.2)                               # written whole before it is read
        address = json.load(open(sched_file))["address"]
        launches = [(workers, {})] if worker_envs is None else [(1, extra) for extra in worker_envs]
        workers = sum(n for n, _extra in launches)
        for n, extra in launches:
            procs.append(subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address,
                                           "--nthreads", "1", "--nworkers", str(n), "--no-dashboard",
                                           "--host", "127.0.0.1", "--local-directory", os.path.join(folder, "w")],
                                          env={**penv, **extra}, cwd=ROOT, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        from distributed import Client

        with Client(address, timeout=60) as client:
            client.wait_for_workers(workers, timeout=120)
            assert len(client.scheduler_info()["workers"]) >= workers
        yield address
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
