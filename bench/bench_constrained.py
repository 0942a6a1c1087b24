"""Constrained sampling against unconstrained, in one process: what banned phrases cost.

    python bench/bench_constrained.py --model M/cs-en --bitext ../shared/data/bitext/multi30k \\
        [--sources 100] [--rounds 3] [--device cpu|cuda] [--threads 1] [--decode_step tree]

Our sampler (top-k 10) on --sources `val` sources in one batch: 30 samples a source, and ParaBank 2's
5 constraint sets x 6 samples (the job's own draw of banned words), the two alternating for
--rounds rounds after a warm-up (this machine is shared: the ratio is what to compare). Prints
seconds (best and median) and sources/s of each, the ratio, the tensor operations a decoder step
(kernel launches on a GPU; models/nmt/decoding/round_trips.py), the milliseconds to build the batch's ban
tables as the sampler does (inside the constrained seconds), and a digest of the constrained
samples: two versions of the code that agree on it give the same samples.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time

from bench_gpu import ROOT, _sync, constrained_requests, free_requests, read_pairs  # noqa: F401 (ROOT: sys.path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a model directory (cs-en)")
    ap.add_argument("--bitext", required=True, help="folder with val.cs.gz and val.en.gz")
    ap.add_argument("--sources", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--decode_step", default="tree",
                    help="the sampler's step mode (models/nmt/decoding/fixed_sampler.py)")
    args = ap.parse_args(argv)

    import torch

    from models.nmt.decoding.bans import BanTable
    from models.nmt.decoding.round_trips import computing_ops, count_decoder_steps, count_device_ops
    from models.nmt.engines.fairseq_engine import Translator

    torch.set_num_threads(args.threads)
    engine = Translator(args.model, device=args.device, precision="fp32", step_mode=args.decode_step)
    engine.sample_batch_tokens = 10**9                  # one batch: the steps are comparable
    pairs = read_pairs(args.bitext, "val", args.sources)
    runs = {"30 samples": free_requests(pairs, 30), "5 sets x 6 samples": constrained_requests(pairs, 5, 6)}
    constrained = runs["5 sets x 6 samples"]
    phrases = [engine.banned_phrases(r.banned_words) for r in constrained]
    build = []                      # the batch's tables as the sampler builds them, words spelled before
    for _ in range(6):
        _sync()
        start = time.perf_counter()
        BanTable.from_packs([engine.banned_packs(r.banned_words) for r in constrained], len(engine.tgt_dict),
                            args.device)
        _sync()
        build.append((time.perf_counter() - start) * 1e3)
    build_ms = statistics.median(build[1:])
    times: dict = {label: [] for label in runs}
    outputs = {}
    for label, reqs in runs.items():
        engine.sample(reqs[:8], topk=10, seed=0)         # warm-up
    for _ in range(args.rounds):
        for label, reqs in runs.items():
            _sync()
            start = time.perf_counter()
            outputs[label] = engine.sample(reqs, topk=10, seed=0)
            _sync()
            times[label].append(time.perf_counter() - start)
    print(f"# constrained sampling, {len(pairs)} sources, {args.device}, {args.threads} thread(s), "
          f"decode step {engine.step_mode}, "
          f"{time.strftime('%Y-%m-%d')}\n")
    print("| requests | best s | median s | sources/s | tensor ops a step | decoder steps |")
    print("|---|---:|---:|---:|---:|---:|")
    compiled = engine.step_mode in ("compiled", "graphs")
    for label, reqs in runs.items():
        # A compiled step's operations are not dispatched one by one: not counted ("-").
        with count_device_ops(enabled=not compiled) as ops, count_decoder_steps() as steps:
            engine.sample(reqs, topk=10, seed=0)
        best = min(times[label])
        per_step = "-" if compiled else f"{computing_ops(ops) / steps.total:.0f}"
        print(f"| {label} | {best:.3f} | {statistics.median(times[label]):.3f} | {len(pairs) / best:.1f} | "
              f"{per_step} | {steps.total} |")
    ratio = min(times["5 sets x 6 samples"]) / min(times["30 samples"])
    digest = hashlib.sha256(json.dumps([[h.token_ids for h in hs] for hs in outputs["5 sets x 6 samples"]])
                            .encode()).hexdigest()[:16]
    print(f"\nconstrained / unconstrained: {ratio:.2f}x (best of {args.rounds})")
    print(f"ban tables of the batch: {build_ms:.1f} ms, the median of 5 after a first build of {build[0]:.1f} ms "
          f"({sum(map(len, phrases))} phrases, {len(phrases)} requests)")
    print(f"digest of the constrained samples: {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
