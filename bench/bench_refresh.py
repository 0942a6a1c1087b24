"""Benchmark of scheduled refreshes: an incremental refresh vs a full run, and a no-op refresh.

    python bench/bench_refresh.py --bitext ../shared/data/bitext/multi30k/train [--models DIR]
        [--shards 20] [--pairs_per_shard 1000]

The figures are ratios of runs made in the same invocation (the machine is shared and noisy).
Models: as bench/bench_cluster.py (trained once into runs/bench-cluster-models without --models).
Prints (Markdown):

  1. a refresh that adds 10% new input shards to a corpus of SHARDS shards, vs a full run of the
     generation job on the same SHARDS * 1.1 shards (goal: <= 0.15x);
  2. a refresh with nothing changed (goal: under 10 s plus the time to list the input), and that
     listing time on its own.
Every job runs as a fresh process, the way the scheduler starts it (deploy/refresh.sh).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from bench_cluster import ensure_models, read_pairs, write_tsv  # noqa: E402
from fresh_process import job_run  # noqa: E402  (the jobs it measures: bench/fresh_process.py)

PY = sys.executable


def job_options(inp: str, models: str) -> list[str]:
    return ["--input", inp, "--forward_model", f"{models}/cs-en", "--backward_model", f"{models}/en-cs",
            "--preset", "parabank2-cpu", "--num_sets", "2", "--num_samples", "4", "--dual_xent_threshold", "-1",
            "--device", "cpu"]


def timed(cmd: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = job_run(cmd, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return seconds, done.stdout


def refresh(root: str, inp: str, models: str) -> tuple[float, str]:
    return timed([PY, "-m", "beam_pipelines.refresh", "--root", root, "--", *job_options(inp, models)])


def latest_manifest(root: str) -> dict:
    run_id = json.load(open(os.path.join(root, "latest.json")))["run_id"]
    return json.load(open(os.path.join(root, "runs", run_id, "_manifest.json")))


def listing_seconds(inp: str) -> float:
    """What a no-op refresh cannot avoid: list the input and look at every shard's size and time."""
    code = ("import sys, time; t = time.perf_counter(); from paracorpus.incremental import shard_versions; "
            "from common.shards import discover_shards; "
            "[shard_versions(s) for s in discover_shards([sys.argv[1]], 'cs', 'en')]; "
            "print(time.perf_counter() - t)")
    return float(subprocess.run([PY, "-c", code, inp], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bitext", required=True, help="prefix of PREFIX.cs.gz / PREFIX.en.gz")
    ap.add_argument("--models", help="a directory with cs-en/ and en-cs/ (default: train small ones)")
    ap.add_argument("--shards", type=int, default=20, help="input shards of the first refresh (default 20)")
    ap.add_argument("--pairs_per_shard", type=int, default=1000, help="pairs per shard (default 1000)")
    ap.add_argument("--workdir", help="keep the runs here (default: a temporary directory)")
    a = ap.parse_args()
    models = ensure_models(a.models, a.bitext)
    new = max(1, a.shards // 10)
    pairs = read_pairs(a.bitext, (a.shards + new) * a.pairs_per_shard)
    tmp = a.workdir or tempfile.mkdtemp(prefix="bench-refresh-")
    inp, full_inp = os.path.join(tmp, "in"), os.path.join(tmp, "in-full")
    for d in (inp, full_inp):
        os.makedirs(d, exist_ok=True)

    def shard(i, where):
        return write_tsv(pairs[i * a.pairs_per_shard:(i + 1) * a.pairs_per_shard],
                         os.path.join(where, f"part-{i:04d}.tsv"))

    for i in range(a.shards):
        shard(i, inp)
    for i in range(a.shards + new):
        shard(i, full_inp)
    root = os.path.join(tmp, "corpus")
    print(f"{a.shards} shards of {a.pairs_per_shard} pairs, then {new} new; models {models}; work in {tmp}",
          flush=True)
    first, _ = refresh(root, inp, models)
    print(f"first refresh (everything decoded): {first:.1f} s", flush=True)
    for i in range(a.shards, a.shards + new):
        shard(i, inp)
    incremental, _ = refresh(root, inp, models)
    manifest = latest_manifest(root)
    decoded = sorted(e["input_shard"] for e in manifest["inputs"] if e["decoded_in"] == manifest["run_id"])
    assert len(decoded) == new, decoded
    full, _ = timed([PY, "-m", "beam_pipelines.generate", *job_options(full_inp, models),
                     "--output", os.path.join(tmp, "full")])
    print(f"incremental refresh: {incremental:.1f} s, full run: {full:.1f} s", flush=True)
    noop, out = refresh(root, inp, models)
    assert "nothing changed" in out, out
    listing = listing_seconds(inp)

    print()
    print(f"| measurement ({a.shards}+{new} shards x {a.pairs_per_shard} pairs) | seconds | ratio | goal |")
    print("|---|---|---|---|")
    print(f"| full run on {a.shards + new} shards (baseline) | {full:.1f} | 1.00x | |")
    print(f"| refresh adding {new} shard(s) ({new / a.shards:.0%} new) | {incremental:.1f} | "
          f"{incremental / full:.2f}x | <= 0.15x |")
    print(f"| no-op refresh (nothing changed) | {noop:.1f} | {noop / full:.2f}x | < 10 s + listing |")
    print(f"| listing + fingerprinting the input (part of the no-op) | {listing:.2f} | | |")


if __name__ == "__main__":
    main()
