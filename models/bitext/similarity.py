"""Similarity of sentence embeddings across two languages, and nearest-neighbour mining.

Plain functions over float32 numpy arrays (one row per sentence):

* ``cosine_pairs`` / ``euclidean_pairs``: row i of A against row i of B (the euclidean one is a
  similarity: the negative distance, so that larger is better for every method);
* ``nearest``: cosine (or euclidean) k-NN through faiss, ``knn_mean``: the mean cosine of the k
  nearest neighbours, r(x) below;
* ``csls_pairs`` / ``csls_matrix``: CSLS(x, y) = 2 cos(x, y) - r_Y(x) - r_X(y), with r_Y(x) the mean
  cosine of x's k nearest targets and r_X(y) that of y's k nearest sources (Conneau et al. 2018,
  "Word translation without parallel data", k=10 there);
* ``margin_pairs`` / ``margin_matrix``: the margin of Artetxe & Schwenk 2019 (LASER's
  source/mine_bitexts.py), cos(x, y) divided by (ratio) or minus (distance) the average of the
  two neighbourhood means, (r_Y(x) + r_X(y)) / 2, k=4 there. Both penalise hubs: a sentence close
  to everything needs a much higher cosine to win. Note that CSLS = 2 x margin distance at equal
  k, so those two always mine the same pairs;
* ``mine`` / ``mine_both``: for every source the best target (and the reverse) under one of
  METHODS, through k-NN candidates rather than a full n x m matrix.

Search. ``exact=True`` is ``faiss.IndexFlatIP`` on L2-normalised vectors: a blocked brute-force
matrix product, exact, O(n m d). Above EXACT_LIMIT base vectors (or with ``exact=False``) an
inverted-file index is used instead (``IndexIVFFlat``, spherical k-means into about 4 sqrt(m)
lists, of which NPROBE_FRACTION are scanned per query, at least MIN_NPROBE): every query is
compared with the centroids and a few percent of the base, which is what makes 1M x 1M mining a
matter of minutes on a many-core machine rather than hours. The vectors stay uncompressed (no
quantisation loss) and one knob, nprobe, trades recall for speed. IVF was preferred to HNSW on
measurements at 100k x 512 (synthetic bitext, shared 2-core machine): IVF built in 34 s and
reached recall@4 99.8% at nprobe 8-16 in 1.2-2.3 s per 5k queries; HNSW32 (efConstruction 40)
took 88 s to build and reached 98.2% / 99.5% at efSearch 32 / 64 in 2.1 / 3.9 s; IVF with 8-bit
scalar quantisation lost recall (98.6%) for no speed. ``python bench/bench_mining.py`` measures
the exact and IVF searches against numpy and the IVF recall.

Mining is exact when the search is: a source's best target under CSLS or a margin is looked for
among its ``candidates`` nearest targets by cosine, and a row is scored against every target
(blocked numpy) only when a bound shows that a target outside its candidates could still win
(see ``_outside_bound``). With an approximate index that check is impossible and is skipped.
"""
from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass

import numpy as np

METHODS = ("cosine", "euclidean", "csls", "margin_ratio", "margin_distance")
EXACT_LIMIT = 200_000          # base size above which nearest() switches to the IVF index by default
MIN_POINTS_PER_LIST = 39       # faiss's k-means wants at least this many training points per centroid
TRAIN_POINTS_PER_LIST = 64     # the k-means sample: enough for stable centroids, quick to train
NPROBE_FRACTION = 1 / 64       # share of the inverted lists scanned per query (bench: recall@4 99.8%)
MIN_NPROBE = 8
BLOCK_FLOATS = 1 << 24         # scores per block of the numpy paths (64 MiB of float32)


# ---------------------------------------------------------------------------- pairwise scores
def as_float32(x) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"expected a 2-D array of embeddings, got shape {x.shape}")
    return x


def normalize(x) -> np.ndarray:
    """Rows scaled to unit length (a new float32 array; zero rows stay zero): inner products of
    normalised rows are cosines, which is what lets faiss's inner-product indexes do cosine k-NN."""
    x = as_float32(x)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def cosine_pairs(a, b) -> np.ndarray:
    """cos(a[i], b[i]) for every row i."""
    a, b = _same_shape(a, b)
    # clipped: float rounding puts identical vectors a hair above 1
    return np.clip((normalize(a) * normalize(b)).sum(1), -1.0, 1.0)


def euclidean_pairs(a, b) -> np.ndarray:
    """-||a[i] - b[i]|| for every row i, on the raw (unnormalised) vectors as in Kim et al. 2019:
    on unit vectors it would rank exactly as cosine does."""
    a, b = _same_shape(a, b)
    return -np.linalg.norm(a - b, axis=1)


def _same_shape(a, b) -> tuple[np.ndarray, np.ndarray]:
    a, b = as_float32(a), as_float32(b)
    if a.shape != b.shape:
        raise ValueError(f"pairs need arrays of the same shape, got {a.shape} and {b.shape}")
    return a, b


# ---------------------------------------------------------------------------- k-NN search
def _faiss():
    """faiss, imported without its loader's INFO lines: it probes for an AVX2/AVX-512 build first
    and logs the ModuleNotFoundError of the one this wheel lacks, which reads like an error."""
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
    import faiss

    return faiss


@contextlib.contextmanager
def faiss_threads(threads: int | None):
    """Run the block with faiss (OpenMP) limited to THREADS threads; None leaves faiss's setting."""
    faiss = _faiss()

    if not threads:
        yield
        return
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(int(threads))
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def ivf_lists(n: int) -> int:
    """Number of inverted lists for N base vectors: about 4 sqrt(N) (faiss's guideline is 4-16
    sqrt(N)), but never fewer than MIN_POINTS_PER_LIST vectors per list to train k-means on."""
    return int(max(1, min(round(4 * math.sqrt(n)), n // MIN_POINTS_PER_LIST)))


def default_nprobe(nlist: int) -> int:
    return int(min(nlist, max(MIN_NPROBE, round(nlist * NPROBE_FRACTION))))


def build_index(base, exact: bool | None = None, metric: str = "cosine", nlist: int | None = None,
                nprobe: int | None = None, seed: int = 0, threads: int | None = None, normalized: bool = False):
    """A faiss index over BASE (rows normalised here for cosine, unless NORMALIZED says they are:
    at 1M x 512 every copy is 2 GB). exact=None: exact up to EXACT_LIMIT vectors, IVF above."""
    faiss = _faiss()

    if metric not in ("cosine", "euclidean"):
        raise ValueError(f"metric must be 'cosine' or 'euclidean', not {metric!r}")
    base = normalize(base) if metric == "cosine" and not normalized else as_float32(base)
    n, d = base.shape
    if n == 0:
        raise ValueError("cannot search an empty set of vectors")
    exact = n <= EXACT_LIMIT if exact is None else exact
    faiss_metric = faiss.METRIC_INNER_PRODUCT if metric == "cosine" else faiss.METRIC_L2
    flat = faiss.IndexFlatIP(d) if metric == "cosine" else faiss.IndexFlatL2(d)
    with faiss_threads(threads):
        if exact:
            flat.add(base)
            return flat
        nlist = nlist or ivf_lists(n)
        index = faiss.IndexIVFFlat(flat, d, nlist, faiss_metric)   # faiss's wrapper keeps `flat` alive
        if metric == "cosine":
            index.cp.spherical = True              # unit-length centroids: assignment by cosine
        index.cp.seed = seed
        sample = min(n, nlist * TRAIN_POINTS_PER_LIST)
        rows = np.sort(np.random.default_rng(seed).choice(n, sample, replace=False)) if sample < n else slice(None)
        index.train(base[rows])
        index.add(base)
        index.nprobe = nprobe or default_nprobe(nlist)
    return index


def search(index, queries, k: int, metric: str = "cosine", threads: int | None = None, normalized: bool = False
           ) -> tuple[np.ndarray, np.ndarray]:
    """(sims, idx), each (n, k), best first. An approximate index may find fewer than k vectors in
    the lists it scans for some query: those rows are searched again exhaustively."""
    faiss = _faiss()

    queries = normalize(queries) if metric == "cosine" and not normalized else as_float32(queries)
    k = min(k, index.ntotal)
    with faiss_threads(threads):
        dist, idx = index.search(queries, k)
        missing = np.flatnonzero((idx < 0).any(1))
        if len(missing):
            flat = faiss.IndexFlatIP(index.d) if metric == "cosine" else faiss.IndexFlatL2(index.d)
            flat.add(_ivf_vectors(index))
            dist[missing], idx[missing] = flat.search(queries[missing], k)
    sims = dist if metric == "cosine" else -np.sqrt(np.maximum(dist, 0))
    return sims.astype(np.float32, copy=False), idx.astype(np.int64, copy=False)


def _ivf_vectors(index) -> np.ndarray:
    """The base vectors of an IVF index, in the order they were added."""
    index.make_direct_map()
    return index.reconstruct_n(0, index.ntotal)


def nearest(queries, base, k: int, exact: bool | None = None, metric: str = "cosine", nprobe: int | None = None,
            threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest rows of BASE for every row of QUERIES: (sims, idx), each (n, min(k, len(base))),
    most similar first. Cosine by default; metric="euclidean" gives negative L2 distances.
    exact=None picks the exact index up to EXACT_LIMIT base vectors, the IVF index above."""
    index = build_index(base, exact, metric, nprobe=nprobe, threads=threads)
    return search(index, queries, k, metric, threads)


def knn_mean(queries, base, k: int, exact: bool | None = None, threads: int | None = None) -> np.ndarray:
    """Mean cosine of each query's k nearest rows of BASE: r(x) of CSLS and of the margin. (Within
    one set, a query's own row counts as a neighbour; bitext mining always searches the other set.)"""
    return nearest(queries, base, k, exact, threads=threads)[0].mean(1)


# ---------------------------------------------------------------------------- CSLS and margin
def combine(method: str, cos, r_src, r_tgt):
    """The score of METHOD from cosines and the neighbourhood means of the source and of the
    target (numpy broadcasting: pairs, candidate tables and full matrices alike)."""
    if method == "csls":
        return 2 * cos - r_src - r_tgt
    if method == "margin_distance":
        return cos - (r_src + r_tgt) / 2
    if method == "margin_ratio":
        return cos / ((r_src + r_tgt) / 2)
    raise ValueError(f"method must be one of csls, margin_ratio, margin_distance, not {method!r}")


def _neighbourhoods(a, b, k: int, a_pool=None, b_pool=None, exact=None, threads=None):
    """r of each row of A among B_POOL (default B) and of each row of B among A_POOL (default A)."""
    r_a = knn_mean(a, b if b_pool is None else b_pool, k, exact, threads)
    r_b = knn_mean(b, a if a_pool is None else a_pool, k, exact, threads)
    return r_a, r_b


def csls_pairs(a, b, k: int = 10, a_pool=None, b_pool=None, exact: bool | None = None,
               threads: int | None = None) -> np.ndarray:
    """CSLS of each pair (a[i], b[i]); neighbourhoods are searched in the other side's rows, or in
    A_POOL / B_POOL when the pairs are a sample of larger sets."""
    r_a, r_b = _neighbourhoods(a, b, k, a_pool, b_pool, exact, threads)
    return combine("csls", cosine_pairs(a, b), r_a, r_b)


def margin_pairs(a, b, k: int = 4, kind: str = "ratio", a_pool=None, b_pool=None, exact: bool | None = None,
                 threads: int | None = None) -> np.ndarray:
    """LASER's margin of each pair (a[i], b[i]): cos / avg (kind="ratio") or cos - avg
    (kind="distance"), avg = (r_B(a) + r_A(b)) / 2 with k neighbours."""
    r_a, r_b = _neighbourhoods(a, b, k, a_pool, b_pool, exact, threads)
    return combine(f"margin_{_kind(kind)}", cosine_pairs(a, b), r_a, r_b)


def _kind(kind: str) -> str:
    if kind not in ("ratio", "distance"):
        raise ValueError(f"margin kind must be 'ratio' or 'distance', not {kind!r}")
    return kind


def cosine_matrix(a, b) -> np.ndarray:
    return normalize(a) @ normalize(b).T


def euclidean_matrix(a, b) -> np.ndarray:
    a, b = as_float32(a), as_float32(b)
    sq = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2 * (a @ b.T)
    return -np.sqrt(np.maximum(sq, 0))


def csls_matrix(a, b, k: int = 10, exact: bool | None = None, threads: int | None = None) -> np.ndarray:
    """Full (len(a), len(b)) CSLS matrix: for small sets (it is n x m floats)."""
    r_a, r_b = _neighbourhoods(a, b, k, exact=exact, threads=threads)
    return combine("csls", cosine_matrix(a, b), r_a[:, None], r_b[None, :])


def margin_matrix(a, b, k: int = 4, kind: str = "ratio", exact: bool | None = None,
                  threads: int | None = None) -> np.ndarray:
    """Full (len(a), len(b)) margin matrix: for small sets."""
    r_a, r_b = _neighbourhoods(a, b, k, exact=exact, threads=threads)
    return combine(f"margin_{_kind(kind)}", cosine_matrix(a, b), r_a[:, None], r_b[None, :])


def score_matrix(src, tgt, method: str, k: int = 4, exact: bool | None = None,
                 threads: int | None = None) -> np.ndarray:
    """Full (len(src), len(tgt)) matrix of METHOD's scores (small sets; `mine` does not need it)."""
    _check_method(method)
    if method == "cosine":
        return cosine_matrix(src, tgt)
    if method == "euclidean":
        return euclidean_matrix(src, tgt)
    if method == "csls":
        return csls_matrix(src, tgt, k, exact, threads)
    return margin_matrix(src, tgt, k, method[len("margin_"):], exact, threads)


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, not {method!r}")


# ---------------------------------------------------------------------------- mining
@dataclass
class Mined:
    """The best match of every query row: index into the other side, its score under the method."""
    index: np.ndarray          # (n,) int64
    score: np.ndarray          # (n,) float32
    exact: bool                # True when the result is provably the argmax over all candidates
    rescored: int = 0          # rows scored against every target because their candidates could miss the best


def mine(src, tgt, method: str = "margin_ratio", k: int = 4, candidates: int = 16, exact: bool | None = None,
         full: bool = False, threads: int | None = None, nprobe: int | None = None) -> Mined:
    """For every row of SRC, the row of TGT with the best METHOD score (see `mine_both`)."""
    return mine_both(src, tgt, method, k, candidates, exact, full, threads, nprobe, backward=False)[0]


def mine_both(src, tgt, method: str = "margin_ratio", k: int = 4, candidates: int = 16, exact: bool | None = None,
              full: bool = False, threads: int | None = None, nprobe: int | None = None, backward: bool = True
              ) -> tuple[Mined, Mined | None]:
    """(forward, backward): the best target of each source and the best source of each target.

    CSLS and the margins are scored on each query's CANDIDATES nearest neighbours by cosine (at
    least k); the same two searches give the neighbourhood means r, as in LASER. full=True scores
    the full matrix instead (small sets only). exact, nprobe, threads: as for `nearest`."""
    _check_method(method)
    src, tgt = as_float32(src), as_float32(tgt)
    if len(src) == 0 or len(tgt) == 0:
        raise ValueError("mining needs at least one source and one target vector")
    if full:
        scores = score_matrix(src, tgt, method, k, exact, threads)
        fwd = Mined(scores.argmax(1), scores.max(1), True)
        return fwd, (Mined(scores.argmax(0), scores.max(0), True) if backward else None)
    if method in ("cosine", "euclidean"):
        fwd_index = build_index(tgt, exact, method, nprobe=nprobe, threads=threads)
        sims, idx = search(fwd_index, src, 1, method, threads)
        fwd = Mined(idx[:, 0], sims[:, 0], _is_exact(fwd_index))
        if not backward:
            return fwd, None
        bwd_index = build_index(src, exact, method, nprobe=nprobe, threads=threads)
        sims, idx = search(bwd_index, tgt, 1, method, threads)
        return fwd, Mined(idx[:, 0], sims[:, 0], _is_exact(bwd_index))
    src_n, tgt_n = normalize(src), normalize(tgt)
    c = max(k, candidates)
    tgt_index = build_index(tgt_n, exact, nprobe=nprobe, threads=threads, normalized=True)
    s_fwd, i_fwd = search(tgt_index, src_n, c, threads=threads, normalized=True)
    src_index = build_index(src_n, exact, nprobe=nprobe, threads=threads, normalized=True)
    s_bwd, i_bwd = search(src_index, tgt_n, c, threads=threads, normalized=True)
    exact_fwd, exact_bwd = _is_exact(tgt_index), _is_exact(src_index)
    del tgt_index, src_index                 # a copy of each side: free before scoring
    r_src, r_tgt = s_fwd[:, :k].mean(1), s_bwd[:, :k].mean(1)
    fwd = _best_of_candidates(method, src_n, tgt_n, s_fwd, i_fwd, r_src, r_tgt, exact_fwd)
    bwd = (_best_of_candidates(method, tgt_n, src_n, s_bwd, i_bwd, r_tgt, r_src, exact_bwd)
           if backward else None)
    return fwd, bwd


def _is_exact(index) -> bool:
    return not hasattr(index, "nprobe")


def _best_of_candidates(method, queries, base, sims, idx, r_q, r_b, exact_search: bool) -> Mined:
    """Best candidate of each query row; rows whose candidates cannot be shown to hold the best
    (exact search only) are scored against all of BASE."""
    scores = combine(method, sims, r_q[:, None], r_b[idx])
    col = scores.argmax(1)
    rows = np.arange(len(queries))
    index, best = idx[rows, col], scores[rows, col]
    if not exact_search:
        return Mined(index, best.astype(np.float32), False)
    if sims.shape[1] < len(base):
        # the worst candidate's cosine bounds the cosine of every target outside the candidates
        unsure = np.flatnonzero(~(best > _outside_bound(method, sims[:, -1], r_q, r_b)))
        for start in range(0, len(unsure), max(1, BLOCK_FLOATS // len(base))):
            block = unsure[start:start + max(1, BLOCK_FLOATS // len(base))]
            full = combine(method, queries[block] @ base.T, r_q[block, None], r_b[None, :])
            index[block], best[block] = full.argmax(1), full.max(1)
    else:
        unsure = ()
    return Mined(index, best.astype(np.float32), True, len(unsure))


def _outside_bound(method: str, worst_cos, r_q, r_b) -> np.ndarray:
    """An upper bound of the score of any target whose cosine is at most WORST_COS: the score
    grows with the cosine and falls with the target's r, so take the smallest r of all targets.
    For the ratio, the bound needs a positive denominator; rows without one get +inf (rescored)."""
    r_min, r_max = r_b.min(), r_b.max()
    if method != "margin_ratio":
        return combine(method, worst_cos, r_q, r_min)
    den_min, den_max = (r_q + r_min) / 2, (r_q + r_max) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = np.where(worst_cos >= 0, worst_cos / den_min, worst_cos / den_max)
    return np.where(den_min > 0, bound, np.inf)
