"""Benchmark of nearest-neighbour mining (models/bitext/similarity.py): faiss exact and IVF vs numpy.

    python bench/bench_mining.py [--n 100000] [--d 512] [--exact_queries 5000] [--threads 2] [--nprobe P]
    python bench/bench_mining.py --encoder runs/bilingual-cs-en --bitext ../shared/data/bitext/multi30k/train

Every figure is measured in this invocation (the machine is shared and noisy). Data: by default a
synthetic bitext of N x N vectors with a known answer: source vectors are drawn around 2,000 topic
centroids, each target is its source plus noise, and the target side is shuffled (cosine of a
true pair about 0.87, of two sentences on one topic about 0.5). Pure Gaussian noise would be no
test: it has no neighbours worth finding and no inverted index can do better than chance on it.
With --encoder, the first N lines of a bitext are encoded instead.

Prints (Markdown):
  1. the top-k search, sources against all targets: numpy blocked brute force (a BLAS matrix
     product + argpartition per block of rows), faiss exact (IndexFlatIP) and faiss IVF (the
     index `nearest` uses above its size limit, training and adding included). The two
     brute-force searches cost exactly the same per query (each scans the whole base), so they
     are timed on the first --exact_queries sources and the time for all N is extrapolated
     linearly, and the table says so; the IVF search runs on all N;
  2. the IVF index's recall against exact search on those queries (top-1 and recall@k), and the
     share of sources whose nearest target is their true translation;
  3. margin mining (LASER ratio margin, both directions) of all N x N through the IVF index with
     `mine_both`, and its accuracy against the true pairs.
"""
from __future__ import annotations

import argparse
import gzip
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from models.bitext import similarity  # noqa: E402


def synthetic_bitext(n: int, d: int, seed: int, topics: int = 2000, noise: float = 0.8
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, tgt, truth): tgt[truth[i]] is the translation of src[i]."""
    rng = np.random.default_rng(seed)
    centroids = rng.standard_normal((topics, d), dtype=np.float32) / np.sqrt(d)
    src = centroids[rng.integers(0, topics, n)]
    src += rng.standard_normal((n, d), dtype=np.float32) / np.sqrt(d)
    tgt = src + noise * rng.standard_normal((n, d), dtype=np.float32) / np.sqrt(d)
    perm = rng.permutation(n)                    # shuffled target j is the translation of source perm[j]
    truth = np.argsort(perm)
    return src, tgt[perm], truth


def encoded_bitext(encoder_dir: str, prefix: str, src_lang: str, tgt_lang: str, n: int, seed: int):
    from models.bitext.bilingual_encoder import load_bilingual_encoder

    def lines(lang):
        with gzip.open(f"{prefix}.{lang}.gz", "rt", encoding="utf-8") as f:
            return [line.rstrip("\n") for _, line in zip(range(n), f)]
    enc = load_bilingual_encoder(encoder_dir)
    src, tgt = lines(src_lang), lines(tgt_lang)
    perm = np.random.default_rng(seed).permutation(len(tgt))
    return enc.encode(src, src_lang), enc.encode([tgt[j] for j in perm], tgt_lang), np.argsort(perm)


def numpy_topk(queries: np.ndarray, base: np.ndarray, k: int, block: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """The baseline: blocked brute force on normalised vectors, top k by argpartition then sort."""
    sims = np.empty((len(queries), k), dtype=np.float32)
    idx = np.empty((len(queries), k), dtype=np.int64)
    for start in range(0, len(queries), block):
        m = queries[start:start + block] @ base.T
        part = np.argpartition(-m, k - 1, axis=1)[:, :k]
        vals = np.take_along_axis(m, part, 1)
        order = np.argsort(-vals, axis=1)
        sims[start:start + block] = np.take_along_axis(vals, order, 1)
        idx[start:start + block] = np.take_along_axis(part, order, 1)
    return sims, idx


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - start, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="sentences per side (default 100,000)")
    ap.add_argument("--d", type=int, default=512, help="dimensions of the synthetic vectors (default 512)")
    ap.add_argument("--k", type=int, default=4, help="neighbours (default 4, LASER's margin)")
    ap.add_argument("--exact_queries", type=int, default=5_000,
                    help="sources timed with the two brute-force searches, extrapolated to N (0: all)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="faiss threads (default: all cores)")
    ap.add_argument("--nprobe", type=int, help="IVF lists scanned per query (default: similarity.default_nprobe)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--encoder", help="bilingual encoder directory: mine its embeddings of --bitext instead")
    ap.add_argument("--bitext", default=os.path.join(ROOT, "..", "shared", "data", "bitext", "multi30k", "train"),
                    help="Moses prefix read with --encoder (PREFIX.<lang>.gz)")
    ap.add_argument("--src_lang", default="cs")
    ap.add_argument("--tgt_lang", default="en")
    a = ap.parse_args()

    load = os.getloadavg()[0]
    if a.encoder:
        gen_s, (src, tgt, truth) = timed(encoded_bitext, a.encoder, a.bitext, a.src_lang, a.tgt_lang, a.n, a.seed)
        data = f"{a.encoder} embeddings of {a.bitext}"
    else:
        gen_s, (src, tgt, truth) = timed(synthetic_bitext, a.n, a.d, a.seed)
        data = "synthetic bitext (2,000 topics, shuffled targets)"
    n, d = src.shape
    src_n, tgt_n = similarity.normalize(src), similarity.normalize(tgt)
    q = n if a.exact_queries <= 0 else min(a.exact_queries, n)
    scale = n / q
    nlist = similarity.ivf_lists(n)
    nprobe = a.nprobe or similarity.default_nprobe(nlist)
    print(f"# bench_mining: {n:,} x {n:,} vectors, d={d}, {data} ({gen_s:.0f}s to make), top-{a.k}, "
          f"{a.threads} faiss threads, {os.cpu_count()} CPUs, load average {load:.1f} at start\n", flush=True)

    np_s, (np_sims, np_idx) = timed(numpy_topk, src_n[:q], tgt_n, a.k)
    with similarity.faiss_threads(a.threads):
        ex_s, (ex_sims, ex_idx) = timed(similarity.nearest, src_n[:q], tgt_n, a.k, exact=True)
        build_s, ivf = timed(similarity.build_index, tgt_n, exact=False, nprobe=nprobe)
        search_s, (ivf_sims, ivf_idx) = timed(similarity.search, ivf, src_n, a.k)
    ivf_s = build_s + search_s
    np_all, ex_all = np_s * scale, ex_s * scale
    note = "measured" if q == n else f"extrapolated x{scale:g} from {q:,} queries"
    print(f"| top-{a.k} search, {n:,} sources vs {n:,} targets | queries timed | s timed | s for all {n:,} | "
          f"speed-up vs numpy |\n|---|---:|---:|---:|---:|")
    print(f"| numpy blocked brute force (BLAS + argpartition) | {q:,} | {np_s:.1f} | {np_all:.1f} ({note}) | 1.0x |")
    print(f"| faiss exact (IndexFlatIP) | {q:,} | {ex_s:.1f} | {ex_all:.1f} ({note}) | {np_all / ex_s / scale:.1f}x |")
    print(f"| faiss IVF (nlist {nlist}, nprobe {nprobe}; build {build_s:.1f}s + search {search_s:.1f}s) | {n:,} | "
          f"{ivf_s:.1f} | {ivf_s:.1f} (measured) | {np_all / ivf_s:.1f}x |")
    print(f"\nIVF vs faiss exact: **{ex_all / ivf_s:.1f}x** faster on all {n:,} queries "
          f"(exact extrapolated from {q:,})\n" if q < n else f"\nIVF vs faiss exact: **{ex_all / ivf_s:.1f}x** faster\n")

    top1 = float(np.mean(ivf_idx[:q, 0] == ex_idx[:, 0]))
    recall = float(np.mean([len(set(ivf_idx[i]) & set(ex_idx[i])) / a.k for i in range(q)]))
    same = float(np.mean(np_idx[:, 0] == ex_idx[:, 0]))
    true_ex = float(np.mean(ex_idx[:, 0] == truth[:q]))
    true_ivf = float(np.mean(ivf_idx[:q, 0] == truth[:q]))
    print(f"| on the first {q:,} sources | value |\n|---|---:|\n"
          f"| IVF top-1 = exact top-1 | {100 * top1:.2f}% |\n| IVF recall@{a.k} of the exact top {a.k} | "
          f"{100 * recall:.2f}% |\n| numpy top-1 = faiss exact top-1 (sanity) | {100 * same:.2f}% |\n"
          f"| nearest target is the true translation: exact | {100 * true_ex:.2f}% |\n"
          f"| nearest target is the true translation: IVF | {100 * true_ivf:.2f}% |\n", flush=True)

    mine_s, (fwd, bwd) = timed(similarity.mine_both, src, tgt, "margin_ratio", a.k, exact=False, threads=a.threads,
                               nprobe=nprobe)
    inv_truth = np.argsort(truth)
    print(f"| margin mining (ratio, k={a.k}), IVF, both directions, all {n:,} x {n:,} | value |\n|---|---:|\n"
          f"| seconds (two index builds, two searches, scoring) | {mine_s:.1f} |\n"
          f"| sources mined to their true translation | {100 * np.mean(fwd.index == truth):.2f}% |\n"
          f"| targets mined to their true source | {100 * np.mean(bwd.index == inv_truth):.2f}% |\n")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
