"""Levenshtein k-means over paraphrase candidates (ParaBank 2, Hu et al. 2019, §2.3).

Candidates and the reference are lowercased, stripped of punctuation and segmented. There are k
free clusters plus a reference cluster whose centre is the reference and is never re-centred;
free centres start at the farthest candidates (farthest-first traversal from the reference) and
move to their cluster's medoid. The best-scoring candidate of each non-empty free cluster is
selected, the selections are ranked by score, and the top n are kept. Candidates close to the
reference fall into its cluster and are never output: that is where the diversity comes from.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
from rapidfuzz.distance import Levenshtein
from rapidfuzz.process import cdist

_PRIVATE_USE = 0xF0000   # supplementary private-use plane: 65k token codes that never clash
# Punctuation and symbols become spaces (\w keeps letters and digits of every script).
_NON_WORD = re.compile(r"[^\w\s]|_")


def normalize_for_clustering(text: str, segment=None) -> tuple:
    """Lowercased, punctuation-free token sequence (sentencepiece pieces if `segment` is given)."""
    text = " ".join(_NON_WORD.sub(" ", text.lower()).split())
    if segment is not None:
        return tuple(p for p in segment(text) if p.strip("\u2581"))
    return tuple(text.split())


def _encode(seqs: list[tuple]) -> list[str]:
    """Map each distinct token to one character so rapidfuzz's string Levenshtein (fast, C++)
    computes the token-level edit distance."""
    codes: dict = {}
    out = []
    for seq in seqs:
        out.append("".join(chr(_PRIVATE_USE + codes.setdefault(tok, len(codes)) % 0xFFFE) for tok in seq))
    if len(codes) > 0xFFFE:  # pragma: no cover - a 65k-token candidate set would need lists
        raise ValueError("too many distinct tokens to cluster")
    return out


def distance_matrix(seqs: list[tuple]) -> np.ndarray:
    strings = _encode(seqs)
    return cdist(strings, strings, scorer=Levenshtein.distance, dtype=np.int32, workers=1)


@dataclass(frozen=True)
class ClusterResult:
    selected: list[int]                  # candidate indices, best first, at most n
    cluster_of: list[int]                # cluster id per candidate; 0 = reference cluster
    cluster_sizes: dict = field(default_factory=dict)   # cluster id -> number of candidates
    iterations: int = 0


def _score_key(score: float) -> float:
    return score if math.isfinite(score) else math.inf


def cluster_candidates(reference: str, candidates: list[str], scores: list[float], k: int = 7,
                       n: int = 5, max_iter: int = 10, segment=None) -> ClusterResult:
    if len(candidates) != len(scores):
        raise ValueError("one score per candidate")
    if not candidates:
        return ClusterResult([], [], {})
    norm = [normalize_for_clustering(c, segment) for c in candidates]
    ref = normalize_for_clustering(reference, segment)
    # Duplicates (after normalisation) cluster as one point, represented by their best member.
    groups: dict[tuple, list[int]] = {}
    for i, seq in enumerate(norm):
        groups.setdefault(seq, []).append(i)
    uniq = list(groups)
    best_of = [min(groups[s], key=lambda i: (_score_key(scores[i]), i)) for s in uniq]
    m = len(uniq)
    dist = distance_matrix([ref] + uniq).astype(np.int64)   # row/col 0 is the reference
    k = min(k, m)

    # Farthest-first initialisation: the reference is the first, fixed centre.
    centres = [0]
    nearest = dist[0, 1:].copy()
    for _ in range(k):
        cand = int(np.argmax(nearest))          # lowest index among ties
        if nearest[cand] == 0:
            break                               # everything left coincides with a centre
        centres.append(cand + 1)
        nearest = np.minimum(nearest, dist[cand + 1, 1:])

    assign = None
    it = 0
    for it in range(1, max_iter + 1):
        d = dist[np.array(centres)][:, 1:]      # centres x points
        new_assign = np.argmin(d, axis=0)       # lowest cluster id wins ties (reference = 0)
        if assign is not None and np.array_equal(new_assign, assign):
            break
        assign = new_assign
        for c in range(1, len(centres)):        # cluster 0 (the reference) is never re-centred
            members = np.flatnonzero(assign == c) + 1
            if len(members):
                sub = dist[np.ix_(members, members)].sum(1)
                centres[c] = int(members[int(np.argmin(sub))])

    cluster_of_uniq = assign.tolist()
    cluster_of = [0] * len(candidates)
    for u, seq in enumerate(uniq):
        for i in groups[seq]:
            cluster_of[i] = cluster_of_uniq[u]
    sizes: dict[int, int] = {}
    for c in cluster_of:
        sizes[c] = sizes.get(c, 0) + 1
    winners = {}
    for u, c in enumerate(cluster_of_uniq):
        if c == 0:
            continue
        i = best_of[u]
        if c not in winners or (_score_key(scores[i]), i) < (_score_key(scores[winners[c]]), winners[c]):
            winners[c] = i
    ranked = sorted(winners.values(), key=lambda i: (_score_key(scores[i]), i))
    return ClusterResult(ranked[:n], cluster_of, sizes, it)
