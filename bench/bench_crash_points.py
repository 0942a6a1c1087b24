"""Crash points of the generation job, the filter job and a refresh on the paths users take
(issues 53, 57): the job stopped just before each of its storage operations (SIGKILL, SIGTERM, or
paused past its lease while the same command takes over: STOP), in each store (a local disk, S3 on
moto, GCS on fake-gcs-server, HDFS on Hadoop's MiniDFSCluster over WebHDFS, all on loopback) and mode (replacing a run with --overwrite, the same
command rerun as it was, --previous on itself, worker processes' operations, a refresh with
--keep 2 or gaining / losing --filter_args); at each instant what a reader sees, then the same
command again (tests/crash_points.py says what is checked).

    python bench/bench_crash_points.py --models M [--cases generate:local:same:KILL,...] [--every N | --points N | --at N,N]
    python bench/bench_crash_points.py --models M --list      # the cases this script knows

A case is JOB:STORE:MODE:SIGNAL[:PATH]: JOB generate, filter or refresh; STORE local, s3, gcs or
hdfs; MODE as in
tests/crash_points.py (generation: overwrite, same, previous, workers, dask; filter: overwrite,
same; refresh: filtered, keep2, filter_on, filter_off); PATH driver (default: the driver's
operations, N:SIG) or workers (the worker processes' writes, by path). --every N tries every Nth
operation (plus the first unit file and record, the manifest and the first delete after it).
M holds cs-en/ and en-cs/ (the tests' tiny models are enough). Prints one row per case: the
operations, points tried, what the reader of the commit point saw (the state before, the new
run, none yet, a mix), the latest/ view's partial states, failed reruns, runs whose rows were lost
or duplicated, runs that left files behind, and the paused holders that did not stop (exit 75) or
find the work done; then each point that failed.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DEFAULT = ("generate:local:same:KILL,generate:local:same:TERM,generate:local:overwrite:KILL,"
           "generate:local:previous:TERM,generate:local:same:STOP,generate:local:workers:KILL:workers,"
           "generate:s3:same:TERM,generate:gcs:same:KILL,generate:local:dask:KILL:workers,"
           "filter:local:same:KILL,filter:local:overwrite:TERM,filter:s3:overwrite:KILL,filter:gcs:same:TERM,"
           "refresh:local:keep2:KILL,refresh:local:filter_on:KILL,refresh:local:filter_off:TERM,"
           "refresh:local:keep2:STOP,refresh:s3:filtered:TERM,generate:hdfs:same:KILL")


@contextlib.contextmanager
def store_for(name: str, work: str):
    from tests.crash_points import Store
    from tests.object_stores import gcs_server, s3_server

    if name == "local":
        yield Store(os.path.join(work, "runs"))
        return
    if name == "hdfs":
        from tests.hdfs_cluster import hdfs_server

        server = hdfs_server(os.path.join(work, "hdfs"))
    else:
        server = s3_server() if name == "s3" else gcs_server()
    with server as s:
        env = dict(s.env)
        yield Store(f"{s.scheme}://{s.make_bucket()}/runs", env, name)
        for key, value in env.items():
            if os.environ.get(key) == value:
                del os.environ[key]


def dask_cluster(work: str, env: dict):
    from tests.dask_cluster import local_dask_cluster

    return local_dask_cluster(os.path.join(work, "dask"), env)


def make_sweep(job: str, mode: str, store, work: str, models: str, pairs: int, extra=()):
    from tests.crash_points import filter_sweep, generation_sweep, refresh_sweep

    if job == "generate":
        workers = ("--direct_running_mode", "multi_processing", "--direct_num_workers", "2") if mode == "workers" else ()
        return generation_sweep(store, work, models, "same" if mode in ("workers", "dask") else mode, pairs,
                                workers + tuple(extra))
    if job == "filter":
        return filter_sweep(work, store, mode)
    return refresh_sweep(work, models, store, mode)


def picked(ops, every: int, sweep, path: str, points: int = 0, at: str = ""):
    """The operations to stop at: with PATH workers, the worker processes' writes (each by a path
    pattern unique in the run); else every EVERY-th driver operation plus the marked ones (the first
    of each kind of step), or only the first POINTS of those."""
    from tests.crash_points import chosen, worker_crash

    if path == "workers":
        found = []
        for o in ops:
            if o[3] != sweep.driver and o[1] in ("write", "delete"):
                crash = worker_crash(o[2], ops)
                if crash and crash not in [c for _, c in found]:
                    found.append((o, crash))
        return found[::every] if every > 1 else found
    if at:                               # the driver operations numbered so, as a sweep printed them
        wanted = {int(n) for n in at.split(",")}
        return [(o, None) for o in ops if o[0] in wanted]
    if points:
        return [(o, None) for o in chosen(ops, points)[:points]]
    if every <= 1:
        return [(o, None) for o in ops]
    return [(o, None) for o in chosen(ops, max(6, len(ops) // every))]


def run_case(case: str, args, failures: list) -> None:
    from tests.crash_points import temporary_store

    job, store_name, mode, sig, *rest = case.split(":")
    path = rest[0] if rest else "driver"
    _, work = temporary_store()
    start = time.monotonic()
    try:
        with store_for(store_name, work) as store:
            extra = ("--runner", "DaskRunner", "--dask_client_address", "(set per cluster)") if mode == "dask" else ()
            sweep = make_sweep(job, mode, store, work, args.models, args.pairs, extra)
            if mode == "dask":           # the workers trace their operations too
                with dask_cluster(work, {"PARAGEN_STORAGE_TRACE": sweep.trace}) as address:
                    sweep.base_args = _with_address(sweep.base_args, address)
                    ops = sweep.prepare()
            else:
                ops = sweep.prepare()
            points = []
            for op, crash in picked(ops, args.every, sweep, path, args.points, args.at):
                if mode == "dask":           # the workers' crash point is in their environment: a cluster a point
                    points.append(_dask_point(sweep, op, sig, crash, work))
                else:
                    points.append(sweep.point(*op[:3], sig, crash=crash))
    finally:
        if os.environ.get("PARAGEN_CRASH_KEEP"):        # to look at what a failed point left
            print(f"kept {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    seen = [p.seen for p in points]
    print(f"| {job} | {store_name} | {mode} | {path} | SIG{sig} | {len(ops)} | {len(points)} | "
          f"{seen.count('previous')} | {seen.count('new')} | {seen.count('none')} | "
          f"{sum(s.startswith('MIXED') for s in seen)} | {sum(p.seen_view == 'partial' for p in points)} | "
          f"{sum(p.rerun_status != 0 for p in points)} | {sum(not p.rows_right for p in points)} | "
          f"{sum(bool(p.left) for p in points)} | "
          f"{sum(p.signal == 'STOP' and p.exit_status not in (0, 75) for p in points)} | "
          f"{(time.monotonic() - start) / 60:.1f} |", flush=True)
    failures.extend((case, p) for p in points if not p.ok)


def _with_address(base_args, address):
    def args(out):
        given = base_args(out)
        i = given.index("--dask_client_address")
        return [*given[:i + 1], address, *given[i + 2:]]
    return args


def _dask_point(sweep, op, sig, crash, work):
    """A Dask point: the stopped run on a cluster whose workers carry the crash point (CRASH:SIG),
    the same command again on a fresh cluster without it."""
    from tests.crash_points import Point, _classify, job, leftovers, rows

    started = time.monotonic()
    out = sweep.store.path(f"dask-{op[0]}-{time.monotonic_ns() % 10**6}")
    sweep.store.copy(sweep.start, out)
    p = Point(op[0], op[1], op[2], sig, fresh=sweep.previous_rows is None)
    with dask_cluster(work, {"PARAGEN_CRASH_AT": f"{crash}:{sig}"}) as address:
        args = [a.replace("{out}", out) for a in (*_with_address(sweep.base_args, address)(out), *sweep.command)]
        stopped = job(args, sweep.env, which=sweep.which)
    p.exit_status = stopped.returncode
    p.seen = _classify(rows(out, sweep.which), sweep.previous_rows, sweep.new_rows)
    with dask_cluster(work, {}) as address:
        args = [a.replace("{out}", out) for a in (*_with_address(sweep.base_args, address)(out), *sweep.command)]
        again = job(args, sweep.env, which=sweep.which)
    p.rerun_status = again.returncode
    p.rows_right = rows(out, sweep.which) == sweep.new_rows
    p.left = leftovers(out, sweep.which)
    p.seconds = time.monotonic() - started
    return p


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", required=True, help="folder with cs-en/ and en-cs/")
    ap.add_argument("--pairs", type=int, default=12, help="pairs of a generation run (default 12: three work units)")
    ap.add_argument("--cases", default=DEFAULT, help="JOB:STORE:MODE:SIGNAL[:PATH], comma-separated")
    ap.add_argument("--every", type=int, default=1, help="every Nth operation (default 1: all)")
    ap.add_argument("--points", type=int, default=0,
                    help="instead, only the first N of the marked driver operations (the run's first operation, "
                         "a unit's first write, ...): a quick check of this script")
    ap.add_argument("--at", default="", help="instead, the operations numbered so (comma-separated, as FAILED "
                                                "lines print them): to reproduce a failed point")
    ap.add_argument("--list", action="store_true", help="print the default cases and exit")
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(DEFAULT.split(",")))
        return 0
    print(f"# crash points, {time.strftime('%Y-%m-%d')}, generation runs of {args.pairs} pairs, every "
          f"{args.every} operation(s)\n")
    print("| job | store | mode | path | signal | operations | points | previous | new | none | mixed | view "
          "partial | rerun failed | rows lost or duplicated | left over | paused holder wrong | minutes |")
    print("|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    failures: list = []
    for case in args.cases.split(","):
        run_case(case, args, failures)
    for case, p in failures:
        print(f"\nFAILED {case} before op {p.n} ({p.kind} {p.path}): exit {p.exit_status}, reader saw {p.seen} "
              f"(view {p.seen_view or '-'}), rerun exit {p.rerun_status}, rows right {p.rows_right}, left {p.left[:5]}\n{p.log}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
