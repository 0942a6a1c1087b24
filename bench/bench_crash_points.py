"""Every crash point of the generation job, the filter job and a refresh (issue 53): the job
stopped just before each of its storage operations, by SIGKILL and by SIGTERM, on a local disk and
in an S3 bucket (moto on loopback), from a committed run of other settings
that it replaces (a refresh: from a committed refresh of other inputs); at each instant what a
reader sees, then the same command run again (tests/crash_points.py says what is checked).

    python bench/bench_crash_points.py --models M [--pairs 12] [--stores local,s3] [--signals KILL,TERM]
        [--jobs generate,filter,refresh]

M holds cs-en/ and en-cs/ (paragen-train-nmt's layout; the tests' tiny models are enough). Prints
one row per (store, signal): operations in the run, points tried, readers that saw the previous
run, the new one, a mix or none, reruns that failed, runs whose rows were lost or duplicated, and
runs that left files the manifest does not list; then each point that failed.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", required=True, help="folder with cs-en/ and en-cs/")
    ap.add_argument("--pairs", type=int, default=12, help="pairs of the run (default 12: three work units)")
    ap.add_argument("--stores", default="local,s3")
    ap.add_argument("--signals", default="KILL,TERM")
    ap.add_argument("--jobs", default="generate,filter,refresh")
    args = ap.parse_args(argv)

    from tests.crash_points import Store, Sweep, temporary_store
    from tests.jobs import quick_args
    from tests.object_stores import s3_server
    from tests.test_crash_points import filter_sweep, refresh_sweep
    from tests.toydata import toy_bitext

    print(f"# crash points, generation job on {args.pairs} pairs, {time.strftime('%Y-%m-%d')}\n")
    print("| job | store | signal | operations | points | previous | new | mixed | none | rerun failed | rows lost "
          "or duplicated | left over | minutes |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    failures = []

    def sweep_rows(job_name, store_name, sweep):
        ops = sweep.prepare()
        for sig in args.signals.split(","):
            start = time.monotonic()
            points = [sweep.point(n, kind, path, sig) for n, kind, path in ops]
            seen = [p.seen for p in points]
            print(f"| {job_name} | {store_name} | SIG{sig} | {len(ops)} | {len(points)} | {seen.count('previous')} | "
                  f"{seen.count('new')} | {seen.count('MIXED')} | {seen.count('none')} | "
                  f"{sum(p.rerun_status != 0 for p in points)} | {sum(not p.rows_right for p in points)} | "
                  f"{sum(bool(p.left) for p in points)} | {(time.monotonic() - start) / 60:.1f} |", flush=True)
            failures.extend((f"{job_name} {store_name}", p) for p in points if not p.ok)

    for job_name in ("refresh", "filter", "generate"):
        if job_name not in args.jobs.split(","):
            continue
        for store_name in args.stores.split(","):
            local, work = temporary_store()
            server = s3_server() if store_name == "s3" else None
            s3 = server.__enter__() if server else None
            try:
                store = Store(f"s3://{s3.make_bucket()}/runs", s3.env) if s3 else local
                if job_name == "refresh":
                    sweep = refresh_sweep(work, args.models, store)
                elif job_name == "filter":
                    sweep = filter_sweep(work, store)
                else:
                    bitext = os.path.join(work, "in.tsv")
                    with open(bitext, "w", encoding="utf-8") as f:
                        f.writelines(f"{s}\t{t}\n" for s, t in toy_bitext(400, seed=31)[:args.pairs])
                    sweep = Sweep(store, lambda out, bitext=bitext: quick_args(bitext, out, args.models),
                                  ["--num_samples", "2"], [], work)
                sweep_rows(job_name, store_name, sweep)
            finally:
                if server:
                    server.__exit__(None, None, None)
                shutil.rmtree(work, ignore_errors=True)
    for store_name, p in failures:
        print(f"\nFAILED {store_name} SIG{p.signal} before op {p.n} ({p.kind} {p.path}): exit {p.exit_status}, reader "
              f"saw {p.seen}, rerun exit {p.rerun_status}, rows right {p.rows_right}, left {p.left[:5]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
