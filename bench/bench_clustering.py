"""Clustering speed: ms per source for paracorpus.clustering.cluster_candidates.

    python bench/bench_clustering.py [--sources 200] [--candidates 150] [--seed 0]

Each source gets a random 12-word reference and `candidates` perturbed copies of it (word
substitutions, insertions, deletions, swaps, case and punctuation noise, some exact repeats), the
way sampled back-translations of one source look, with random NLL-like scores. Single process,
single thread (rapidfuzz workers=1). Prints ms per source (median of 3 timed passes, after a
warm-up pass).
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

_PUNCT = [",", ".", "!", "?", ";", ":", "'s", " -", '"']


def _vocab(rng: random.Random, size: int = 3000) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(size)]


def _perturb(rng: random.Random, words: list[str], vocab: list[str]) -> str:
    out = list(words)
    for _ in range(rng.choice([0, 1, 1, 2, 2, 3, 3, 4, 5, 6])):
        op = rng.random()
        pos = rng.randrange(len(out)) if out else 0
        if op < 0.45 and out:                      # substitution (synonym-like)
            out[pos] = rng.choice(vocab[:400]) if rng.random() < 0.7 else rng.choice(vocab)
        elif op < 0.65:                            # insertion
            out.insert(pos, rng.choice(vocab[:400]))
        elif op < 0.85 and len(out) > 4:           # deletion
            del out[pos]
        elif len(out) > 1:                         # swap of neighbours (reordering)
            j = min(pos + 1, len(out) - 1)
            out[pos], out[j] = out[j], out[pos]
    if out and rng.random() < 0.3:
        out[0] = out[0].capitalize()
    text = " ".join(out)
    if rng.random() < 0.5:
        text += rng.choice(_PUNCT[:4])
    if rng.random() < 0.2 and len(out) > 3:
        k = rng.randrange(1, len(out))
        text = " ".join(out[:k]) + rng.choice(_PUNCT) + " " + " ".join(out[k:])
    return text


def make_sources(num_sources: int, num_candidates: int, seed: int = 0):
    rng = random.Random(seed)
    vocab = _vocab(rng)
    sources = []
    for _ in range(num_sources):
        ref_words = [rng.choice(vocab) for _ in range(12)]
        reference = " ".join(ref_words).capitalize() + "."
        cands = []
        for _ in range(num_candidates):
            if cands and rng.random() < 0.1:
                cands.append(rng.choice(cands))            # sampling repeats itself
            else:
                cands.append(_perturb(rng, ref_words, vocab))
        scores = [rng.gauss(2.0, 0.6) for _ in cands]
        sources.append((reference, cands, scores))
    return sources


def bench_clustering(num_sources: int = 200, num_candidates: int = 150, seed: int = 0,
                     k: int = 7, n: int = 5, repeats: int = 3) -> dict:
    from paracorpus.clustering import cluster_candidates

    sources = make_sources(num_sources, num_candidates, seed)
    for ref, cands, scores in sources:             # warm-up (lazy punctuation table, imports)
        cluster_candidates(ref, cands, scores, k=k, n=n)
    times = []
    selected = iterations = distinct = 0
    for _ in range(max(1, repeats)):
        selected = iterations = distinct = 0
        start = time.perf_counter()
        for ref, cands, scores in sources:
            r = cluster_candidates(ref, cands, scores, k=k, n=n)
            selected += len(r.selected)
            iterations += r.iterations
            distinct += r.num_distinct
        times.append(time.perf_counter() - start)
    ms = statistics.median(times) / num_sources * 1000
    return {"sources": num_sources, "candidates_per_source": num_candidates, "k": k, "n": n,
            "ms_per_source": round(ms, 3), "sources_per_s": round(1000 / ms, 1),
            "mean_distinct_candidates": round(distinct / num_sources, 1),
            "mean_selected": round(selected / num_sources, 2),
            "mean_iterations": round(iterations / num_sources, 2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sources", type=int, default=200)
    ap.add_argument("--candidates", type=int, default=150)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    r = bench_clustering(args.sources, args.candidates, args.seed, repeats=args.repeats)
    print(f"{r['ms_per_source']:.3f} ms/source ({r['sources']} sources x {r['candidates_per_source']} "
          f"candidates, k={r['k']}, n={r['n']}; {r['sources_per_s']} sources/s)")
    print(r)


if __name__ == "__main__":
    main()
