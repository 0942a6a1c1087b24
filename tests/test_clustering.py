"""Levenshtein k-means candidate clustering (paracorpus/clustering.py, ParaBank 2 §2.3)."""
import math
import random

import numpy as np
import pytest
from rapidfuzz.distance import Levenshtein

from paracorpus.clustering import (ClusterResult, _farthest_first, _medoids, _normalize_many,
                                   cluster_candidates, distance_matrix, encode_tokens,
                                   normalize_for_clustering, token_distance)


def brute_levenshtein(a, b) -> int:
    """Textbook dynamic programme over token sequences (reference for the fast path)."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def random_source(rng: random.Random, num_candidates: int, vocab_size: int = 40):
    vocab = [f"w{i}" for i in range(vocab_size)]
    ref = [rng.choice(vocab) for _ in range(10)]
    cands = []
    for _ in range(num_candidates):
        words = list(ref)
        for _ in range(rng.randint(0, 6)):
            pos = rng.randrange(len(words))
            op = rng.random()
            if op < 0.5:
                words[pos] = rng.choice(vocab)
            elif op < 0.75:
                words.insert(pos, rng.choice(vocab))
            elif len(words) > 3:
                del words[pos]
        text = " ".join(words)
        if rng.random() < 0.3:
            text = text.capitalize() + rng.choice([".", "!", " ?", ","])
        cands.append(text)
    scores = [rng.uniform(0.5, 4.0) for _ in cands]
    return " ".join(ref), cands, scores


# --- normalisation -------------------------------------------------------------------------

def test_case_and_punctuation_variants_share_a_normalised_form():
    forms = {normalize_for_clustering(t) for t in [
        "Hello, World!", "hello world", "HELLO world.", "  hello   ,world ", "«Hello» — world…",
        "hello (world)", "Hello; world?!"]}
    assert forms == {("hello", "world")}


def test_normalisation_details():
    assert normalize_for_clustering("Well-known, isn't it?") == ("well", "known", "isn", "t", "it")
    assert normalize_for_clustering("Straße ÉTÉ") == ("straße", "été")
    # Symbols (category S*) are not punctuation and stay.
    assert normalize_for_clustering("1 + 1 = $2") == ("1", "+", "1", "=", "$2")
    assert normalize_for_clustering("") == ()
    assert normalize_for_clustering(" ... !!! ") == ()


def test_segment_gets_normalised_text_and_its_pieces_are_the_tokens():
    seen = []

    def segment(text):
        seen.append(text)
        return ["\u2581" + w[:2] for w in text.split()] + [""]

    assert normalize_for_clustering("Hello,   WORLD!", segment) == ("\u2581he", "\u2581wo")
    assert seen == ["hello world"]


@pytest.mark.parametrize("segment", [None, lambda s: list(s.replace(" ", "\u2581"))])
def test_batch_normalisation_equals_single(segment):
    rng = random.Random(3)
    alphabet = list("abcXYZ  ,.!?-'«»—…éÉßİ$+\t") + ["\u3001", "\u00a0"]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20))) for _ in range(300)]
    assert _normalize_many(texts, segment) == [normalize_for_clustering(t, segment) for t in texts]
    with_newline = ["a\nb", "C, d"]
    assert _normalize_many(with_newline, segment) == [normalize_for_clustering(t, segment)
                                                      for t in with_newline]


# --- distances -----------------------------------------------------------------------------

@pytest.mark.parametrize("vocab_size", [5, 400])   # 400 > 256: 2-byte strings in rapidfuzz
def test_fast_distance_matrix_equals_token_level_levenshtein(vocab_size):
    rng = random.Random(vocab_size)
    vocab = [f"tok{i}" for i in range(vocab_size)]
    seqs = [tuple(rng.choice(vocab) for _ in range(rng.randint(0, 30))) for _ in range(40)]
    if vocab_size > 256:
        seqs.append(tuple(vocab))                  # every token used at least once
    d = distance_matrix(seqs)
    assert d.dtype == np.int32 and d.shape == (len(seqs), len(seqs))
    for i, a in enumerate(seqs):
        for j, b in enumerate(seqs):
            expected = brute_levenshtein(a, b)
            assert d[i, j] == expected
            assert Levenshtein.distance(list(a), list(b)) == expected
            if j == i + 1:
                assert token_distance(a, b) == expected


def test_multi_character_tokens_count_as_one_edit():
    # Character-level distance would be 6 ("abc" vs "xyz"); at token level it is one substitution.
    assert distance_matrix([("abc", "d"), ("xyz", "d")])[0, 1] == 1


def test_encoding_is_one_character_per_token_and_injective():
    seqs = [("a", "b", "a"), ("b", "c"), (), ("c", "c", "a", "d")]
    enc = encode_tokens(seqs)
    assert [len(e) for e in enc] == [3, 2, 0, 4]
    assert enc[0][0] == enc[0][2] != enc[0][1] and enc[1][0] == enc[0][1]
    assert all(ord(ch) < 256 for e in enc for ch in e)        # few tokens: 1-byte fast path
    many = encode_tokens([tuple(range(70000))])[0]
    assert len(set(many)) == 70000
    assert not any(0xD800 <= ord(ch) <= 0xDFFF for ch in many)


# --- initialisation and update -------------------------------------------------------------

def test_farthest_first_initialisation_hand_made():
    ref = "r1 r2 r3 r4 r5 r6"
    cands = ["r1 r2 r3 r4 r5 r6 x",    # d(ref)=1
             "a b c d e f",            # d(ref)=6  <- first centre (ties with #3, lower index)
             "r1 r2 r3 p q r",         # d(ref)=3
             "a b c d e g",            # d(ref)=6, but 1 from #1
             "r1 r2 z"]                # d(ref)=4  <- second (min dist to {ref, #1} = 4)
    # Third centre: min distance to {ref, #1, #4}: #0 -> 1, #2 -> 3, #3 -> 1: so #2.
    dist = distance_matrix([normalize_for_clustering(t) for t in [ref] + cands])
    assert _farthest_first(dist, 3) == [0, 2, 5, 3]
    res = cluster_candidates(ref, cands, [1.0] * 5, k=3, max_iter=0)
    assert res.centres == {1: 1, 2: 4, 3: 2}
    # Nearest centre, ties to the lower cluster id: #0 -> reference, #3 -> cluster of #1.
    assert res.cluster_of == [0, 1, 3, 1, 2]
    # k larger than the number of distinct candidates: stops when only the reference's
    # duplicate (distance 0) is left.
    dist2 = distance_matrix([("a",), ("b",), ("a",), ("c",)])
    assert _farthest_first(dist2, 7) == [0, 1, 3]


def test_medoid_update_hand_made():
    # Points on a line at 0, 1, 2, 10 (cluster 1) and 20, 21 (cluster 2); |x - y| distances.
    xs = np.array([0, 1, 2, 10, 20, 21], dtype=np.float64)
    pd = np.abs(xs[:, None] - xs[None, :])
    assign = np.array([1, 1, 1, 1, 2, 2])
    # Sums in cluster 1: 13, 11, 11, 27 -> tie between points 1 and 2, the lower index wins.
    # Centres are indices into the matrix with the reference at 0, hence the +1.
    assert _medoids(pd, assign, [0, 4, 5]) == [0, 2, 5]
    # An empty free cluster keeps its centre; the reference centre never moves.
    assert _medoids(pd, np.array([0, 0, 0, 1, 1, 1]), [0, 4, 6, 2]) == [0, 5, 6, 2]


def test_medoid_update_end_to_end():
    ref = "r1 r2 r3 r4 r5 r6 r7 r8"
    cands = ["a b c d x y",      # farthest from the reference: the initial centre
             "a b c d",
             "a b c x",
             "a b y d",
             "z b c d"]
    res = cluster_candidates(ref, cands, [1.0, 2.0, 3.0, 4.0, 5.0], k=1)
    assert res.cluster_of == [1, 1, 1, 1, 1]
    assert res.centres == {1: 1}            # "a b c d" is 1 edit from every other member
    assert res.iterations >= 1
    assert res.selected == [0]              # best score of the cluster, not its centre


def test_reference_centre_is_never_recentred():
    # Everything near the reference: its cluster holds them all, its centre stays the reference
    # (a re-centred cluster 0 would move to "w1 w2 w3 w4" and capture the far candidate below).
    ref = "w1 w2 w3 w4 w5 w6"
    cands = ["w1 w2 w3 w4", "w1 w2 w3 w4 w5", "w1 w2 w3 w4 x", "w1 w2 w3 w4 y", "q q"]
    res = cluster_candidates(ref, cands, [0.1, 0.2, 0.3, 0.4, 0.5], k=1)
    assert res.cluster_of == [0, 0, 0, 0, 1]
    assert res.selected == [4]


def test_medoid_update_keeps_the_reference_centre():
    # Cluster 0 = {a, b, c} (candidates 0-2) whose medoid is b; a re-centred cluster 0 would
    # move off the reference (index 0 of the full matrix). Cluster 1 = {d, e} moves to d.
    d = np.array([[0, 1, 2, 9, 9],
                  [1, 0, 1, 9, 9],
                  [2, 1, 0, 9, 9],
                  [9, 9, 9, 0, 1],
                  [9, 9, 9, 1, 0]], dtype=float)
    new = _medoids(d, np.array([0, 0, 0, 1, 1]), [0, 5])
    assert new == [0, 4]                      # +1: matrix index 0 is the reference


# --- selection -----------------------------------------------------------------------------

def test_reference_cluster_never_contributes():
    ref = "The cat sat on the mat."
    cands = ["the cat sat on the mat", "THE CAT, SAT ON THE MAT!", "a dog lay on a rug",
             "the cat sat on a mat", "dogs and cats fight often here"]
    scores = [-100.0, -50.0, 2.0, 1.0, 3.0]
    res = cluster_candidates(ref, cands, scores, k=7, n=5)
    assert res.cluster_of[0] == res.cluster_of[1] == 0
    assert 0 not in res.selected and 1 not in res.selected
    assert 0 not in res.selected_clusters
    assert all(res.cluster_of[i] != 0 for i in res.selected)


def test_all_candidates_identical_to_reference():
    res = cluster_candidates("Hello world.", ["hello world", "Hello, world!", "HELLO WORLD"],
                             [0.1, 0.2, 0.3])
    assert res.selected == [] and res.cluster_of == [0, 0, 0]
    assert res.cluster_sizes == {0: 3} and res.centres == {}


def test_no_candidates_and_bad_input():
    res = cluster_candidates("anything", [], [])
    assert res == ClusterResult([], [], {})
    with pytest.raises(ValueError):
        cluster_candidates("ref", ["a", "b"], [1.0])


@pytest.mark.parametrize("seed", range(6))
def test_selection_invariants(seed):
    rng = random.Random(seed)
    ref, cands, scores = random_source(rng, 150)
    n = rng.choice([1, 3, 5, 10])
    k = rng.choice([1, 3, 7, 12])
    res = cluster_candidates(ref, cands, scores, k=k, n=n)
    assert len(res.cluster_of) == len(cands)
    assert 1 <= len(res.selected) <= min(n, k)
    sel_scores = [scores[i] for i in res.selected]
    assert sel_scores == sorted(sel_scores)
    clusters = [res.cluster_of[i] for i in res.selected]
    assert clusters == res.selected_clusters
    assert len(set(clusters)) == len(clusters) and 0 not in clusters
    assert set(res.cluster_of) <= set(range(k + 1))
    assert sum(res.cluster_sizes.values()) == len(cands)
    assert res.cluster_sizes == {c: res.cluster_of.count(c) for c in set(res.cluster_of)}
    for i, c in zip(res.selected, clusters):        # each selection is its cluster's best
        assert scores[i] == min(scores[j] for j in range(len(cands)) if res.cluster_of[j] == c)
    # Every non-empty free cluster has a selection when n allows it.
    free = {c for c in res.cluster_of if c != 0}
    assert len(res.selected) == min(n, len(free))
    # Final centres are members of their own clusters and assignments are to the nearest centre.
    norm = [normalize_for_clustering(t) for t in cands]
    ref_n = normalize_for_clustering(ref)
    for c, i in res.centres.items():
        assert res.cluster_of[i] == c
    centre_seqs = [ref_n] + [norm[res.centres[c]] for c in sorted(res.centres)]
    for j in rng.sample(range(len(cands)), 20):
        d = [brute_levenshtein(norm[j], s) for s in centre_seqs]
        assert res.cluster_of[j] == d.index(min(d))


def test_determinism():
    rng = random.Random(11)
    ref, cands, scores = random_source(rng, 120)
    first = cluster_candidates(ref, cands, scores)
    for _ in range(3):
        assert cluster_candidates(ref, list(cands), list(scores)) == first


def test_duplicates_share_a_cluster_and_only_the_best_is_selectable():
    ref = "one two three four five"
    cands = ["alpha beta gamma", "Alpha, beta gamma!", "ALPHA BETA GAMMA", "one two three four five six"]
    scores = [3.0, 1.0, 1.0, 0.5]
    res = cluster_candidates(ref, cands, scores, k=3, n=5)
    assert res.cluster_of[0] == res.cluster_of[1] == res.cluster_of[2] != 0
    assert res.cluster_sizes[res.cluster_of[0]] == 3
    assert res.num_distinct == 2
    assert 1 in res.selected and 0 not in res.selected and 2 not in res.selected  # tie: lower index


def test_fewer_distinct_candidates_than_k():
    ref = "a b c d e f g h"
    cands = ["p q r", "x y z w", "p q r", "m n"]
    res = cluster_candidates(ref, cands, [0.3, 0.2, 0.1, 0.4], k=7, n=5)
    assert res.num_distinct == 3 and len(res.centres) == 3
    assert sorted(res.selected) == [1, 2, 3]          # one per distinct form, the best duplicate
    assert res.selected == [2, 1, 3]                  # ranked by score


def test_non_finite_scores_rank_worst():
    ref = "r r r r r r"
    cands = ["a b c", "d e f", "g h i", "j k l", "m n o"]   # mutually far: one cluster each
    scores = [float("nan"), 1.0, float("inf"), float("-inf"), 0.5]
    res = cluster_candidates(ref, cands, scores, k=5, n=5)
    assert len(set(res.cluster_of)) == 5
    assert res.selected == [4, 1, 0, 2, 3]              # finite first; non-finite by index
    # Within one cluster a finite score beats NaN even at a higher index.
    res2 = cluster_candidates(ref, ["a b c", "a b c d"], [float("nan"), 2.0], k=1)
    assert res2.cluster_of == [1, 1] and res2.selected == [1]
    res3 = cluster_candidates(ref, ["a b c", "x y z"], [float("nan")] * 2, k=2, n=1)
    assert res3.selected == [0]


def test_zero_k_or_n_selects_nothing():
    ref, cands, scores = random_source(random.Random(5), 30)
    assert cluster_candidates(ref, cands, scores, k=0).selected == []
    assert set(cluster_candidates(ref, cands, scores, k=0).cluster_of) == {0}
    assert cluster_candidates(ref, cands, scores, n=0).selected == []


def test_segment_is_used_for_distances():
    # With a character segmenter "abcd" vs "abce" are close (1 piece differs); as whole words
    # they would differ by one token as well, so check a case where the two views disagree.
    seg = lambda s: list(s.replace(" ", "\u2581"))       # noqa: E731
    ref = "zzzzzzzz"
    cands = ["abcdefgh", "abcdefgx", "qwertyui"]
    by_char = cluster_candidates(ref, cands, [1.0, 2.0, 3.0], k=2, segment=seg)
    # Char level: #1 is one edit from #0, so it joins #0's cluster; #2 gets the other cluster.
    assert by_char.cluster_of[0] == by_char.cluster_of[1] != by_char.cluster_of[2]
    by_word = cluster_candidates(ref, cands, [1.0, 2.0, 3.0], k=2)
    # Word level all three are single distinct tokens at distance 1 from everything: the
    # reference (cluster 0) wins every tie except for the two chosen centres.
    assert by_word.cluster_of == [1, 2, 0]
    assert normalize_for_clustering("Ab, c", seg) == ("a", "b", "\u2581", "c")


def test_scores_may_be_numpy():
    ref, cands, scores = random_source(random.Random(8), 40)
    a = cluster_candidates(ref, cands, scores)
    b = cluster_candidates(ref, cands, np.asarray(scores, dtype=np.float32).astype(np.float64))
    assert a == b
    assert cluster_candidates(ref, cands, np.asarray(scores, dtype=np.float32)) == \
        cluster_candidates(ref, cands, [float(x) for x in np.asarray(scores, dtype=np.float32)])
    with_nan = np.asarray(scores)
    with_nan[0] = np.nan
    assert cluster_candidates(ref, cands, with_nan) == cluster_candidates(ref, cands, list(with_nan))


# --- hand-made candidate sets (first version of this file) ---------------------------------

def test_reference_copies_with_the_best_scores_are_not_selected():
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
    assert sum(r.cluster_sizes.values()) == 150 and max(r.cluster_sizes) <= 7 and len(r.cluster_sizes) <= 8
    assert 0 not in {r.cluster_of[i] for i in r.selected}
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
