"""ParaBank 2 Levenshtein clustering on hand-made candidate sets."""
import math
import random

import numpy as np
import pytest
from rapidfuzz.distance import Levenshtein

from paracorpus.clustering import cluster_candidates, distance_matrix, normalize_for_clustering


def test_normalisation_lowercases_and_strips_punctuation():
    assert normalize_for_clustering("A man, riding a BIKE!") == ("a", "man", "riding", "a", "bike")
    assert normalize_for_clustering("A man riding a bike .") == normalize_for_clustering("a man, riding a bike")
    pieces = normalize_for_clustering("Dogs run.", segment=lambda t: ["\u2581dog", "s", "\u2581run"])
    assert pieces == ("\u2581dog", "s", "\u2581run")


def test_token_distance_equals_rapidfuzz_on_token_lists():
    rng = random.Random(0)
    vocab = ["a", "b", "c", "dog", "cat", "the"]
    seqs = [tuple(rng.choice(vocab) for _ in range(rng.randint(0, 8))) for _ in range(25)]
    d = distance_matrix(seqs)
    for i in range(len(seqs)):
        for j in range(len(seqs)):
            assert d[i, j] == Levenshtein.distance(list(seqs[i]), list(seqs[j]))


def test_reference_cluster_never_contributes():
    ref = "A man is riding a bike ."
    cands = ["a man is riding a bike", "A man, riding a bike.", "A dog sleeps on the warm grass .",
             "Two women are playing chess in a quiet park ."]
    scores = [0.1, 0.2, 2.0, 3.0]           # the reference copies score best
    r = cluster_candidates(ref, cands, scores, k=2, n=5)
    assert r.cluster_of[0] == 0 and r.cluster_of[1] == 0
    assert r.selected == [2, 3]
    assert all(r.cluster_of[i] != 0 for i in r.selected)


def test_at_most_n_ranked_distinct_clusters():
    rng = random.Random(1)
    words = "a man woman dog is are sitting running on in the park street beach red blue".split()
    ref = "a man is sitting in the park"
    cands = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) for _ in range(150)]
    scores = [rng.uniform(0, 4) for _ in cands]
    r = cluster_candidates(ref, cands, scores, k=7, n=5)
    assert len(r.selected) == 5
    assert [scores[i] for i in r.selected] == sorted(scores[i] for i in r.selected)
    assert len({r.cluster_of[i] for i in r.selected}) == 5
    for i in r.selected:                     # best of its cluster
        c = r.cluster_of[i]
        assert scores[i] == min(s for s, cc in zip(scores, r.cluster_of) if cc == c)
    assert sum(r.cluster_sizes.values()) == 150 and max(r.cluster_sizes) <= 7
    assert r == cluster_candidates(ref, cands, scores, k=7, n=5)    # deterministic


def test_farthest_first_centres_and_medoids():
    ref = "a b c d"
    # Two groups far from the reference and from each other, one point near the reference.
    cands = ["x y z w v", "x y z w", "x y z w v u", "p q", "p q r", "a b c"]
    r = cluster_candidates(ref, cands, [1.0, 0.5, 2.0, 1.5, 0.7, 0.1], k=2, n=5)
    assert r.cluster_of[5] == 0                    # next to the reference
    assert len({r.cluster_of[i] for i in (0, 1, 2)}) == 1
    assert len({r.cluster_of[i] for i in (3, 4)}) == 1
    assert r.cluster_of[0] != r.cluster_of[3]
    assert r.selected == [1, 4]                    # best of each free cluster, ranked


def test_edge_cases():
    assert cluster_candidates("a b", [], []).selected == []
    assert cluster_candidates("a b", ["A b.", "a B"], [1.0, 2.0]).selected == []   # all = reference
    r = cluster_candidates("a b", ["c d", "c d", "e f g"], [2.0, 1.0, 3.0], k=7)
    assert r.selected == [1, 2]                    # duplicates: the better copy represents them
    r = cluster_candidates("a", ["b c", "d e f"], [math.nan, 1.0], k=7)
    assert r.selected == [1, 0]                    # NaN ranks last
    with pytest.raises(ValueError):
        cluster_candidates("a", ["b"], [])


def test_distance_matrix_is_symmetric_int():
    d = distance_matrix([("a",), ("a", "b"), ()])
    assert d.dtype == np.int32 and (d == d.T).all() and d[2, 1] == 2
