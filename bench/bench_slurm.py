"""What SLURM costs a run of the generation job (issue 54), on a real SLURM started here
(tests/slurm_cluster.py; Debian's slurm-wlm and munge, as root):

    python bench/bench_slurm.py --models M [--pairs 96] [--workers 2] [--runs undisturbed,cancel]

Submits deploy/slurm/cluster.sbatch with --slurm_workers W (CPU workers, one core each), once per
--runs: `undisturbed`; `cancel`, one worker job cancelled (`scancel`) after a quarter of the
units; `lifetime`, with --slurm_time 5, so that the workers leave at their lifetime (1 to 3
minutes: Dask's --lifetime 2m, stagger 1m) and are replaced (give it --pairs so that decoding
outlasts that: ~2,000 with the tiny models). It prints for each: seconds from the driver's start
to its first worker registered, decoding wall time, how long a cancelled worker took to be
replaced (from the scancel to a new worker registered), worker jobs replaced, units decoded twice
or more (their files of two attempts seen) and units reused (a task run again found them
committed), units per worker process, and whether the rows equal a local run's (DirectRunner, in
memory, also timed). M holds cs-en/ and en-cs/ (the tests' tiny models will do).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from datetime import datetime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _stamp(line: str) -> float:
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _first(log: str, pattern: str, after: float = 0.0) -> float | None:
    """The time of LOG's first timestamped line matching PATTERN later than AFTER."""
    for line in log.splitlines():
        if re.search(pattern, line) and re.match(r"\d{4}-\d\d-\d\d ", line) and _stamp(line) > after:
            return _stamp(line)
    return None


class Attempts:
    """Which attempts wrote each unit's files (part-u<unit>-<attempt>*.parquet), seen by looking at
    OUT every 2 s while the job decodes (compaction removes them at the end): a unit with files of
    two attempts was decoded twice."""

    def __init__(self, out: str):
        self.out, self.seen, self._stop = out, {}, threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self):
        while not self._stop.wait(2):
            for _folder, _dirs, names in os.walk(self.out):
                for name in names:
                    m = re.match(r"part-u(\d+)-([0-9a-f]+)", name)
                    if m:
                        self.seen.setdefault(int(m.group(1)), set()).add(m.group(2))

    def stop(self) -> int:
        """Units decoded more than once."""
        self._stop.set()
        self._thread.join()
        return sum(len(a) > 1 for a in self.seen.values())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", required=True)
    ap.add_argument("--pairs", type=int, default=96)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--runs", default="undisturbed,cancel", help="undisturbed, cancel, lifetime (comma-separated)")
    args = ap.parse_args(argv)

    from tests.slurm_cluster import missing

    why = missing()
    if why:
        print(f"no SLURM here: {why}", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="paragen-slurm-bench-")
    try:
        return _bench(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _bench(args, work: str) -> int:
    from beam_pipelines.generate import run
    from tests.jobs import committed_rows, quick_args, units_committed
    from tests.slurm_cluster import slurm_cluster
    from tests.toydata import toy_bitext

    bitext = os.path.join(work, "in.tsv")
    with open(bitext, "w", encoding="utf-8") as f:
        f.writelines(f"{s}\t{t}\n" for s, t in toy_bitext(max(400, args.pairs), seed=31)[:args.pairs])
    units = (args.pairs + 3) // 4
    start = time.monotonic()
    run(quick_args(bitext, os.path.join(work, "local"), args.models))
    local_seconds = time.monotonic() - start
    local = committed_rows(os.path.join(work, "local"))

    with slurm_cluster(os.path.join(work, "slurm")) as slurm:
        version = slurm.run("sinfo", "--version").stdout.strip()
        print(f"# SLURM (one node: g1), {version}, {args.pairs} pairs ({units} units), {args.workers} CPU worker jobs, "
              f"{time.strftime('%Y-%m-%d')}\n")
        print(f"local run (DirectRunner, in memory, 1 process): {local_seconds:.1f} s\n")
        print("| run | to first worker (s) | decode wall (s) | replaced in (s) | worker jobs replaced | units decoded "
              "twice or more | units reused | units per worker | rows equal local |")
        print("|---|---:|---:|---:|---:|---:|---:|---|---|")
        for name in args.runs.split(","):
            cancel = name == "cancel"
            out, log = os.path.join(work, f"out-{name}"), os.path.join(work, f"driver-{name}.log")
            done = slurm.run("sbatch", "--parsable", f"--output={log}",
                             os.path.join(ROOT, "deploy", "slurm", "cluster.sbatch"), "--slurm_workers",
                             str(args.workers), "--slurm_cpus_per_worker", "1", "--slurm_memory", "2GB",
                             "--slurm_time", "5" if name == "lifetime" else "30", "--slurm_log_dir", work,
                             *quick_args(bitext, out, args.models))
            job = done.stdout.strip()
            attempts = Attempts(out)
            cancelled_at = None
            if cancel:
                while units_committed(out) < units // 4:
                    time.sleep(0.2)
                victim = next(j["JobId"] for j in slurm.jobs("paragen-worker-") if j["JobState"] == "RUNNING")
                cancelled_at = time.time()
                slurm.run("scancel", victim)
            info = slurm.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=1800)
            again_decoded = attempts.stop()
            text = open(log, encoding="utf-8", errors="replace").read()
            assert info["JobState"] == "COMPLETED", text[-3000:]
            submitted = _first(text, r"SLURM: submitting")
            registered = _first(text, r"Register worker")
            ended = _first(text, r"Remove client")
            replaced = ""
            if cancelled_at is not None:
                again = _first(text, r"Register worker", after=cancelled_at)
                replaced = f"{again - cancelled_at:.1f}" if again else "never"
            manifest = json.load(open(os.path.join(out, "_manifest.json"), encoding="utf-8"))
            title = {"cancel": "one worker cancelled", "lifetime": "workers at their lifetime (--slurm_time 5)"}
            units_of = manifest["units"]
            print(f"| {title.get(name, name)} | {registered - submitted:.1f} | "
                  f"{ended - submitted:.1f} | {replaced or '-'} | {text.count('ended; submitting another')} | "
                  f"{again_decoded} | {units_of['reused_from_earlier_attempt']} | "
                  f"{sorted(units_of['per_worker'].values(), reverse=True)} | {committed_rows(out) == local} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
