"""The SLURM worker fleet over a run whose worker jobs reach their lifetime several times: how many
worker jobs are running at each moment, with spares (the default) and without
(PARAGEN_SLURM_SPARES=0), in the same session.

A real SLURM (tests/slurm_cluster.py: munged, slurmctld, three 4-core nodes) on this machine; the
generation job's driver on the "login node" (this process's machine) with --slurm_workers W,
--slurm_time T minutes (workers end 2-4 minutes before it, a few minutes after they start) and a
queue wait for every worker job (--begin=now+WAIT: what a busy cluster makes a new job wait). The
fleet is sampled every 2 s with squeue from the first worker's start until the driver cancels its
workers at the end of decoding (none running and none pending).

    python bench/bench_slurm_lifetime.py --models DIR [--pairs 3000] [--workers 1] [--time 8] [--wait 60]

Needs root and Debian's slurm-wlm and munge (scripts/install_slurm.sh); DIR: models as
tests/conftest.py trains them (PARAGEN_TEST_MODELS).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.jobs import quick_args  # noqa: E402
from tests.slurm_cluster import missing, slurm_cluster  # noqa: E402
from tests.toydata import toy_bitext  # noqa: E402


def one_run(slurm, args, logs: str, spares: bool, wait: int) -> dict:
    env = {**slurm.env, "PYTHONPATH": ROOT, "PARAGEN_SLURM_CHECK_SECONDS": "2",
           "PARAGEN_SLURM_SPARES": "1" if spares else "0"}
    command = [sys.executable, "-m", "beam_pipelines.generate", *args, "--runner", "DaskRunner",
               "--slurm_partition", "nodes", "--slurm_cpus_per_worker", "1", "--slurm_memory", "6GB",
               "--slurm_log_dir", logs, f"--slurm_extra=--begin=now+{wait}"]
    started = time.monotonic()
    with open(os.path.join(logs, "driver.log"), "w") as out:
        job = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        samples, first = [], None
        while job.poll() is None:
            rows = slurm.run("squeue", "-h", "-o", "%j %T", check=False).stdout.split("\n")
            running = sum(1 for r in rows if r.startswith("paragen-worker-") and r.endswith("RUNNING"))
            pending = sum(1 for r in rows if r.startswith("paragen-worker-") and r.endswith("PENDING"))
            now = time.monotonic() - started
            if running and first is None:
                first = now
            if first is not None:
                samples.append((now, running, pending))
            time.sleep(2)
    text = open(os.path.join(logs, "driver.log")).read()
    if job.returncode != 0:
        raise SystemExit(f"the run failed ({job.returncode}): {text[-3000:]}")
    # the decode phase: until the driver cancels its workers at the end (none running, none
    # pending); a drop mid-run has a replacement pending
    decoding = [smp for smp in samples if smp[1] or smp[2]]
    zero = sum(2 for smp in decoding if smp[1] == 0)             # seconds with no worker running
    return {"spares": spares, "seconds": time.monotonic() - started, "samples": samples,
            "min_running": min(smp[1] for smp in decoding), "zero_s": zero,
            "mean_running": sum(smp[1] for smp in decoding) / len(decoding),
            "ended": text.count("ended on n"), "spare_lines": text.count("submitting a spare")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", required=True)
    ap.add_argument("--pairs", type=int, default=3000)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--time", type=int, default=8, help="--slurm_time, minutes")
    ap.add_argument("--wait", type=int, default=60, help="seconds every worker job waits in the queue")
    a = ap.parse_args()
    why = missing()
    if why:
        raise SystemExit(f"no SLURM here: {why}")
    work = tempfile.mkdtemp(prefix="paragen-lifetime-")
    bitext = os.path.join(work, "toy.tsv")
    with open(bitext, "w") as f:
        f.writelines(f"{s}\t{t}\n" for s, t in toy_bitext(a.pairs, seed=41))
    results = []
    with slurm_cluster(os.path.join(work, "slurm")) as slurm:
        for spares in (True, False):
            tag = "spares" if spares else "no-spares"
            logs = os.path.join(work, tag)
            os.makedirs(logs)
            args = [*quick_args(bitext, os.path.join(work, f"out-{tag}"), a.models), "--slurm_workers",
                    str(a.workers), "--slurm_time", str(a.time)]
            print(f"run with{'' if spares else 'out'} spares ...", file=sys.stderr, flush=True)
            results.append(one_run(slurm, args, logs, spares, a.wait))
    print(f"# SLURM worker fleet over a run, {time.strftime('%Y-%m-%d')}: {a.pairs} pairs, --slurm_workers "
          f"{a.workers}, --slurm_time {a.time} (workers end 2-4 min before it), every job {a.wait} s in the queue\n")
    print("| spares | run (min) | running workers while decoding: min | mean | seconds with none running | "
          "workers ended | spare submissions |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {'on' if r['spares'] else 'off'} | {r['seconds'] / 60:.1f} | {r['min_running']} | "
              f"{r['mean_running']:.2f} | {r['zero_s']} | {r['ended']} | {r['spare_lines']} |")
    print("\nfleet over time (seconds from the first worker's start: running/pending), every 30 s:")
    for r in results:
        t0 = r["samples"][0][0]
        marks = [f"{s[0] - t0:.0f}:{s[1]}/{s[2]}" for i, s in enumerate(r["samples"]) if i % 15 == 0]
        print(f"  spares {'on ' if r['spares'] else 'off'}: " + " ".join(marks))


if __name__ == "__main__":
    main()
