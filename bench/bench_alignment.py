"""Word alignment quality, speed and memory: the deterministic aligner against eflomal.

    python bench/bench_alignment.py [--data ../shared/data/divergence] [--pairs 10000] [--big 100000]

Aligns the `opensubs-parallel` pairs (English -> French, the divergence detector's training data)
with each aligner and scores the 40 hand-aligned pairs of bench/data/opensubs-gold-alignments.tsv
(sure and possible links; line numbers into the shared files, no text kept): alignment error rate
(AER, Och & Ney 2003: 1 - (|A&S| + |A&P|) / (|A| + |S|)), precision against the possible links,
recall against the sure ones, for each direction and each symmetrization. Every aligner runs in a
fresh process (its peak RSS measured); eflomal twice, to show how far its links move between two
runs of the same command. --big: the same on that many pairs (the 10,000, repeated with their
words renamed, so the vocabulary grows as real data's would), time and memory only.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
GOLD = os.path.join(ROOT, "bench", "data", "opensubs-gold-alignments.tsv")


def read_gold(path: str = GOLD) -> dict[int, tuple[set, set]]:
    """{line: (sure, possible)}; possible includes the sure links."""
    gold = {}
    with open(path, encoding="utf-8") as f:
        for row in f:
            if row.startswith(("#", "line\t")) or not row.strip():
                continue
            line, sure, possible = (row.rstrip("\n").split("\t") + ["", ""])[:3]
            links = lambda text: {tuple(int(x) for x in link.split("-")) for link in text.split()}  # noqa: E731
            gold[int(line)] = (links(sure), links(sure) | links(possible))
    return gold


def scores(predicted: dict[int, set], gold: dict[int, tuple[set, set]]) -> dict:
    a_s = a_p = n_a = n_s = 0
    for line, (sure, possible) in gold.items():
        links = predicted[line]
        a_s += len(links & sure)
        a_p += len(links & possible)
        n_a += len(links)
        n_s += len(sure)
    return {"aer": 1 - (a_s + a_p) / (n_a + n_s), "precision": a_p / max(n_a, 1), "recall": a_s / n_s,
            "links": n_a}


def read_pairs(data: str, n: int) -> tuple[list, list]:
    with open(os.path.join(data, "opensubs-parallel.en"), encoding="utf-8") as f:
        en = [line.split() for line in f.read().split("\n")[:n]]
    with open(os.path.join(data, "opensubs-parallel.fr"), encoding="utf-8") as f:
        fr = [line.split() for line in f.read().split("\n")[:n]]
    return en, fr


def _child(args) -> None:
    """In a fresh process: align, print the links of the gold lines and the time as JSON."""
    import resource

    from models.bitext.divergence import word_alignments

    en, fr = read_pairs(args.data, args.pairs)
    if args.big:
        en = [[f"{w}_{k}" if k else w for w in s] for k in range(args.big // len(en) + 1) for s in en][:args.big]
        fr = [[f"{w}_{k}" if k else w for w in s] for k in range(args.big // len(fr) + 1) for s in fr][:args.big]
    kept = [i for i, (s, t) in enumerate(zip(en, fr)) if s and t]
    start = time.perf_counter()
    fwd, rev = word_alignments([en[i] for i in kept], [fr[i] for i in kept], aligner=args.child)
    seconds = time.perf_counter() - start
    at = {line: k for k, line in enumerate(kept)}
    gold = read_gold()
    print(json.dumps({"seconds": seconds, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "pairs": len(kept),
                      "links": {line: [fwd[at[line]], rev[at[line]]] for line in gold if line in at}}))


def run_child(aligner: str, data: str, pairs: int, big: int = 0) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", aligner, "--data", data, "--pairs", str(pairs),
                           "--big", str(big)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT})
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    from models.bitext.word_align import SYMMETRIZATIONS, symmetrize

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data", "divergence"))
    ap.add_argument("--pairs", type=int, default=10_000)
    ap.add_argument("--big", type=int, default=0)
    ap.add_argument("--aligners", nargs="*", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return _child(args)
    from models.bitext.divergence import ALIGNERS

    gold = read_gold()
    runs = [(name, run_child(name, args.data, args.pairs)) for name in (args.aligners or ALIGNERS)]
    if "eflomal" in (args.aligners or ALIGNERS):
        runs.append(("eflomal (again)", run_child("eflomal", args.data, args.pairs)))
    # fewer --pairs than the gold's line numbers reach score the hand-aligned pairs among them
    gold = {line: links for line, links in gold.items() if str(line) in runs[0][1]["links"]}
    if not gold:
        raise SystemExit(f"error: none of the hand-aligned pairs is among the first {args.pairs} (raise --pairs)")
    print(f"{runs[0][1]['pairs']:,} pairs; {len(gold)} hand-aligned pairs, "
          f"{sum(len(s) for s, _ in gold.values())} sure and {sum(len(p) for _, p in gold.values())} possible links")
    print("\n| aligner | links | AER | precision | recall | align s | peak RSS MiB |\n|---|---|---:|---:|---:|---:|---:|")
    for name, result in runs:
        links = {int(line): (set(map(tuple, f)), set(map(tuple, r))) for line, (f, r) in result["links"].items()}
        for how in ("forward", "reverse", *SYMMETRIZATIONS):
            pred = {line: (f if how == "forward" else r if how == "reverse" else set(symmetrize(f, r, how)))
                    for line, (f, r) in links.items()}
            s = scores(pred, gold)
            print(f"| {name} | {how} | {100 * s['aer']:.1f} | {100 * s['precision']:.1f} | {100 * s['recall']:.1f} | "
                  f"{result['seconds']:.1f} | {result['rss_mib']:.0f} |", flush=True)
    if len(runs) > 1 and runs[-1][0] == "eflomal (again)":
        a = {line: set(map(tuple, f)) for line, (f, _r) in runs[-2][1]["links"].items()}
        b = {line: set(map(tuple, f)) for line, (f, _r) in runs[-1][1]["links"].items()}
        moved = sum(len(a[k] ^ b[k]) for k in a)
        print(f"\neflomal run twice: {moved} of {sum(len(v) for v in a.values())} forward links of the gold lines differ")
    if args.big:
        print(f"\n| aligner | pairs | align s | peak RSS MiB |\n|---|---:|---:|---:|")
        for name in args.aligners or ALIGNERS:
            r = run_child(name, args.data, args.pairs, args.big)
            print(f"| {name} | {r['pairs']:,} | {r['seconds']:.1f} | {r['rss_mib']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
