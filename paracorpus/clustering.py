"""Levenshtein k-means over paraphrase candidates (ParaBank 2, Hu et al. 2019, §2.3).

Candidates and the reference are lowercased, stripped of punctuation and segmented. There are k
free clusters plus a reference cluster (id 0) whose centre is the reference and is never
re-centred. Free centres start at the farthest candidates (farthest-first traversal from the
reference) and move to their cluster's medoid. The best-scoring candidate of each non-empty free
cluster is selected, the selections are ranked by score (lower = better, NLL-like), and the top n
are kept. Candidates close to the reference fall into its cluster and are never output: that is
where the diversity comes from.

The distance is the token-level Levenshtein distance, computed once per source as a full matrix
with rapidfuzz; k-means then runs on that matrix with numpy only.
"""
from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field

import numpy as np
from rapidfuzz.distance import Levenshtein
from rapidfuzz.process import cdist

__all__ = ["ClusterResult", "cluster_candidates", "distance_matrix", "encode_tokens",
           "normalize_for_clustering", "token_distance"]


class _PunctuationTable(dict):
    """str.translate table: Unicode punctuation (category P*) -> space, everything else kept.

    Filled lazily (one unicodedata lookup per distinct code point ever seen): building it for
    all 1.1M code points up front would cost ~0.4 s at import."""

    def __missing__(self, code: int) -> str:
        ch = chr(code)
        value = " " if unicodedata.category(ch)[0] == "P" else ch
        self[code] = value
        return value


_PUNCT = _PunctuationTable()


_ASCII_PUNCT = bytes.maketrans(
    bytes(c for c in range(128) if unicodedata.category(chr(c))[0] == "P"),
    b" " * sum(unicodedata.category(chr(c))[0] == "P" for c in range(128)))


def _strip_punctuation(text: str) -> str:
    if text.isascii():   # bytes.translate: a 256-byte table, ~10x faster than str.translate
        return text.encode("ascii").translate(_ASCII_PUNCT).decode("ascii")
    return text.translate(_PUNCT)


def normalize_for_clustering(text: str, segment=None) -> tuple:
    """Lowercased, punctuation-free token sequence.

    Punctuation (Unicode category P*) becomes a space, so "well-known" -> ("well", "known") and
    "Hello,world" -> ("hello", "world"); symbols (S*: $ + = ...) are kept; whitespace runs
    collapse. With ``segment`` (a callable str -> list[str], e.g. sentencepiece
    ``encode(text, out_type=str)``) the normalised text is segmented and its pieces (empty ones
    dropped) are the tokens; otherwise the whitespace tokens.
    """
    text = " ".join(_strip_punctuation(text.lower()).split())
    if segment is not None:
        return tuple(p for p in segment(text) if p)
    return tuple(text.split())


def _normalize_many(texts: list[str], segment=None) -> list[tuple]:
    """normalize_for_clustering over a list, lowercasing and stripping all texts in one call."""
    joined = "\n".join(texts)
    if joined.count("\n") != len(texts) - 1:    # a text with its own newline: one at a time
        return [normalize_for_clustering(t, segment) for t in texts]
    lines = _strip_punctuation(joined.lower()).split("\n")
    if segment is not None:
        return [tuple(p for p in segment(" ".join(line.split())) if p) for line in lines]
    return [tuple(line.split()) for line in lines]


_CHARS: list[str] = []


def _code_chars(count: int) -> list[str]:
    """The first `count` token codes: chr(0), chr(1), ... skipping the surrogate range."""
    if count > len(_CHARS):
        if count > 0x110000 - 0x800:   # pragma: no cover - over a million distinct tokens
            raise ValueError("too many distinct tokens to encode")
        _CHARS.extend(chr(i if i < 0xD800 else i + 0x800)
                      for i in range(len(_CHARS), max(count, 2 * len(_CHARS), 1024)))
    return _CHARS


def encode_tokens(seqs: list[tuple]) -> list[str]:
    """Map every distinct token to one character, so each token sequence becomes a string.

    rapidfuzz's Levenshtein over strings equals the token-level distance once tokens are single
    characters, and strings take its fast paths (bit-parallel, SIMD across choices in cdist),
    whereas tuples of tokens are hashed element by element on every call (~4x slower here).
    Codes are assigned from 0 in order of first appearance: up to 256 distinct tokens (the usual
    case for the candidates of one source) the strings are 1-byte (latin-1) Python strings, which
    rapidfuzz handles as uint8 - about 3x faster than 2- or 4-byte characters such as a
    private-use range. Surrogate code points are skipped.
    """
    vocab = dict.fromkeys(tok for seq in seqs for tok in seq)   # insertion order = first use
    codes = dict(zip(vocab, _code_chars(len(vocab))))
    get = codes.__getitem__
    return ["".join(map(get, seq)) for seq in seqs]


def token_distance(a, b) -> int:
    """Token-level Levenshtein distance between two token sequences (rapidfuzz, no fast path)."""
    return int(Levenshtein.distance(list(a), list(b)))


def _cdist(strings: list[str]) -> np.ndarray:
    # A copy for `choices`: with the very same list object rapidfuzz takes its symmetric
    # (half-matrix) path, which skips the SIMD multi-string kernel and is ~3x slower.
    return cdist(strings, list(strings), scorer=Levenshtein.distance, dtype=np.int32, workers=1)


def distance_matrix(seqs: list[tuple]) -> np.ndarray:
    """Full pairwise token-level Levenshtein matrix (int32, symmetric, zero diagonal)."""
    return _cdist(encode_tokens(seqs))


@dataclass(frozen=True)
class ClusterResult:
    selected: list[int]                  # candidate indices, best score first, at most n
    cluster_of: list[int]                # cluster id per candidate; 0 = reference cluster
    cluster_sizes: dict = field(default_factory=dict)    # cluster id -> number of candidates (non-empty only)
    selected_clusters: list[int] = field(default_factory=list)   # cluster id of each selected candidate
    centres: dict = field(default_factory=dict)   # free cluster id -> candidate index of its final centre (medoid)
    iterations: int = 0                  # medoid update steps performed
    num_distinct: int = 0                # distinct normalised candidates that were clustered


def _score_keys(scores) -> np.ndarray:
    """Scores as float64 with NaN and +-inf mapped to +inf (worst)."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    return np.where(np.isfinite(s), s, np.inf)


def _farthest_first(dist: np.ndarray, k: int) -> list[int]:
    """Indices (into dist, 0 = reference) of the reference followed by up to k free centres.

    The first free centre is the point farthest from the reference, each next one the point
    whose distance to its nearest chosen centre (reference included) is largest; ties go to the
    lowest index. Stops early when every remaining point coincides with a centre."""
    centres = [0]
    nearest = dist[0, 1:].copy()
    for _ in range(k):
        p = int(np.argmax(nearest))              # argmax returns the first (lowest) index of ties
        if nearest[p] <= 0:
            break
        centres.append(p + 1)
        np.minimum(nearest, dist[p + 1, 1:], out=nearest)
    return centres


def _assign(dist: np.ndarray, centres: list[int]) -> np.ndarray:
    """Cluster id (position in `centres`) of every point; ties -> lowest id (the reference, 0)."""
    return np.argmin(dist[centres, 1:], axis=0)


def _medoids(points_dist: np.ndarray, assign: np.ndarray, centres: list[int]) -> list[int]:
    """New centres: each non-empty free cluster's medoid (the member with the smallest sum of
    distances to the other members, ties -> lowest index); empty clusters keep their centre;
    the reference centre (cluster 0) never moves."""
    m = len(assign)
    n_clusters = len(centres)
    onehot = np.zeros((m, n_clusters))
    onehot[np.arange(m), assign] = 1.0
    # Sum of distances from every point to every cluster's members; exact in float64 (BLAS).
    within = (points_dist @ onehot)[np.arange(m), assign]
    key = within * m + np.arange(m)              # (sum, index): lowest sum, then lowest index
    best = np.full(n_clusters, np.inf)
    np.minimum.at(best, assign, key)
    new = list(centres)
    for c in range(1, n_clusters):
        if best[c] < np.inf:
            new[c] = int(best[c]) % m + 1        # +1: dist row/col 0 is the reference
    return new


def cluster_candidates(reference: str, candidates: list[str], scores: list[float], k: int = 7,
                       n: int = 5, max_iter: int = 10, segment=None) -> ClusterResult:
    """Cluster `candidates` around `reference`; select the best of each free cluster (see module doc).

    Candidates equal after normalisation are clustered as one point (represented by their
    best-scoring member, which is the only one that can be selected) and all share its cluster
    id. NaN and infinite scores rank worst; remaining ties go to the lowest candidate index.
    """
    if len(candidates) != len(scores):
        raise ValueError(f"{len(candidates)} candidates but {len(scores)} scores")
    if not candidates:
        return ClusterResult([], [], {})
    keys = _score_keys(scores)
    key_list = keys.tolist()

    # Normalise and encode the reference (position 0) and all candidates together, then dedupe
    # by encoded form; `best_of[u]` is the best-scoring original of distinct form u.
    encoded = encode_tokens(_normalize_many([reference, *candidates], segment))
    index_of: dict[str, int] = {}
    uniq: list[str] = [encoded[0]]                # position 0 of the matrix: the reference
    best_of: list[int] = []
    uniq_of = []
    for i, enc in enumerate(encoded[1:]):
        u = index_of.get(enc)
        if u is None:
            u = index_of[enc] = len(best_of)
            uniq.append(enc)
            best_of.append(i)
        elif key_list[i] < key_list[best_of[u]]:  # strict: lowest index wins ties
            best_of[u] = i
        uniq_of.append(u)
    m = len(best_of)

    dist = _cdist(uniq)                           # row/col 0: reference; u + 1: distinct form u
    centres = _farthest_first(dist, max(0, min(k, m)))
    assign = _assign(dist, centres)
    iterations = 0
    if len(centres) > 1:
        points_dist = dist[1:, 1:].astype(np.float64)
        for _ in range(max_iter):
            new_centres = _medoids(points_dist, assign, centres)
            iterations += 1
            if new_centres == centres:
                break
            centres = new_centres
            new_assign = _assign(dist, centres)
            if np.array_equal(new_assign, assign):
                break
            assign = new_assign

    uniq_cluster = assign.tolist()
    cluster_of = [uniq_cluster[u] for u in uniq_of]
    counts = np.bincount(np.asarray(cluster_of, dtype=np.int64), minlength=len(centres))
    sizes = {c: int(s) for c, s in enumerate(counts.tolist()) if s}

    # Best candidate of every non-empty free cluster, then rank by (score, index).
    winners: dict[int, int] = {}
    for u, c in enumerate(uniq_cluster):
        if c == 0:
            continue                              # the reference cluster never contributes
        i = best_of[u]
        w = winners.get(c)
        if w is None or (key_list[i], i) < (key_list[w], w):
            winners[c] = i
    ranked = sorted(winners.items(), key=lambda cw: (key_list[cw[1]], cw[1]))[:max(0, n)]
    return ClusterResult(
        selected=[i for _, i in ranked],
        cluster_of=cluster_of,
        cluster_sizes=sizes,
        selected_clusters=[c for c, _ in ranked],
        centres={c: best_of[centres[c] - 1] for c in range(1, len(centres))},
        iterations=iterations,
        num_distinct=m,
    )
