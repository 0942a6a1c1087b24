"""Semantic-divergence detection (models/bitext/divergence.py, models/bitext/train_divergence.py) on tiny
synthetic bitext: a word-for-word substitution "language" whose correct alignment is known."""
import json
import os
import random
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import torch

from models.safety import UnsafeModelError
from models.bitext.divergence import (DivergenceConfig, embedding_cosine_scores, length_ratio_scores,
                                      load_divergence_detector, macro_f1, tokenize, train_divergence, tune_threshold,
                                      word_alignments)
from models.bitext.divergence.lexicon import (Dictionary, bilingual_dictionary, coverage, dictionary_from_counts,
                                              length_ratio, link_counts)
from models.bitext.divergence.model import InteractionModel, greedy_matching
from models.bitext.divergence.negatives import partial_divergence, synthetic_examples
from models.bitext.divergence.training import WeightMean
from common.cli import UsageError

WORDS = [f"w{i}" for i in range(30)]
TRANSLATION = {w: f"x{w[1:]}e" for w in WORDS}          # w7 -> x7e: no string is shared by the sides


def substitution_corpus(n: int, seed: int = 0, swap: float = 0.5, vocab: int = len(WORDS)
                        ) -> tuple[list[list[str]], list[list[str]]]:
    """N pairs: random source sentences of 4-9 of the first VOCAB words, the target word-for-word translated, the
    first two target words swapped in about half of the pairs (so the alignment is not just the
    diagonal)."""
    rng = random.Random(seed)
    src = [[rng.choice(WORDS[:vocab]) for _ in range(rng.randint(4, 9))] for _ in range(n)]
    tgt = [[TRANSLATION[w] for w in s] for s in src]
    for t in tgt:
        if rng.random() < swap:
            t[0], t[1] = t[1], t[0]
    return src, tgt


def true_alignments(src, tgt) -> tuple[list, list]:
    """The known word alignment of substitution_corpus pairs, in word_alignments' form (both
    directions alike): training fixtures pass it instead of running eflomal, which takes no seed."""
    links = []
    for s, t in zip(src, tgt):
        row = [(i, i) for i in range(min(len(s), len(t)))]
        if len(s) > 1 and len(t) > 1 and t[0] != TRANSLATION.get(s[0]):
            row[0], row[1] = (0, 1), (1, 0)
        links.append(row)
    return links, links


def true_dictionary() -> Dictionary:
    return Dictionary({w: {t} for w, t in TRANSLATION.items()}, {t: {w} for w, t in TRANSLATION.items()})


def test_tokenize_matches_moses_escapes_and_raw_text():
    assert tokenize("L&apos; an 2000 , c ’ est") == tokenize("l'an 2000, c'est") == \
        ["l", "'", "an", "2000", ",", "c", "'", "est"]
    assert tokenize("Austria &apos;s") == tokenize("austria's") == ["austria", "'", "s"]
    assert tokenize("a\x00b " * 10, max_tokens=3) == ["a", "b", "a"]
    assert tokenize("") == []


@pytest.mark.parametrize("aligner", ["agreement", "fast_align", "eflomal"])
def test_dictionary_from_word_alignments_has_the_known_translations(aligner):
    src, tgt = substitution_corpus(300)
    fwd, rev = word_alignments(src, tgt, seed=1, aligner=aligner)
    assert len(fwd) == len(rev) == 300
    assert all(0 <= i < len(s) and 0 <= j < len(t) for links in (fwd, rev)
               for s, t, row in zip(src, tgt, links) for i, j in row)
    counts = link_counts(src, tgt, (fwd, rev))
    d = dictionary_from_counts(counts)
    for w, t in TRANSLATION.items():
        assert t in d.src_to_tgt[w] and w in d.tgt_to_src[t]
        # the right translation is by far the most frequent link of each word
        best = max((c, b) for (a, b), c in counts.items() if a == w)[1]
        assert best == t
    strict = dictionary_from_counts(counts, min_count=10)
    assert strict.src_to_tgt == {w: {t} for w, t in TRANSLATION.items()}
    if aligner != "eflomal":          # deterministic ones: the known alignment, swaps included
        true = true_alignments(src, tgt)[0]
        assert [sorted(r) for r in fwd] == [sorted(r) for r in rev] == [sorted(r) for r in true]
    # bilingual_dictionary = align + count + keep, in one call (alignments passed: no second run)
    assert bilingual_dictionary(src, tgt, min_count=10, alignments=(fwd, rev)) == strict


def _junked(n: int, seed: int):
    """substitution_corpus pairs with about a quarter of the target words replaced by junk words
    that translate nothing, and junk added to every fifth target; and their true links."""
    rng = random.Random(seed)
    src, tgt = substitution_corpus(n, seed, vocab=10)
    truth = true_alignments(src, tgt)[0]
    for k, t in enumerate(tgt):
        junk = {pos for pos in range(len(t)) if rng.random() < 0.25}
        for pos in junk:
            t[pos] = f"junk{rng.randrange(40)}"
        truth[k] = [(i, j) for i, j in truth[k] if j not in junk]
        if k % 5 == 0:
            t.extend(f"junk{rng.randrange(40)}" for _ in range(rng.randint(1, 4)))
    return src, tgt, truth


def test_agreement_aligner_is_deterministic_and_chunking_keeps_the_links(monkeypatch):
    """The same pairs give the same links in a fresh process with other thread counts, and pairs
    cut into many chunks give the links of one chunk (the chunks' tables add up right)."""
    import models.bitext.word_align as wa

    src, tgt, _ = _junked(300, seed=3)
    src, tgt = src + [[], ["x"]], tgt + [["y"], []]                   # empty sides: no links, kept in place
    whole = wa.agreement_align(src, tgt)
    assert whole[0][-2:] == [[], []] and whole[1][-2:] == [[], []]
    monkeypatch.setattr(wa, "CHUNK_ELEMENTS", 500)
    assert len(wa._chunks(*[[np.arange(len(x)) for x in side] for side in (src, tgt)])) > 5
    assert wa.agreement_align(src, tgt) == whole
    code = ("import json, sys; sys.path.insert(0, '.'); from tests.test_divergence import _junked; "
            "from models.bitext.word_align import agreement_align; s, t, _ = _junked(300, seed=3); "
            "print(json.dumps(agreement_align(s + [[], ['x']], t + [['y'], []])))")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for threads in ("1", "2"):
        env = {**os.environ, "OMP_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, env=env,
                              timeout=300, check=True)
        fwd, rev = json.loads(done.stdout)
        assert [[tuple(x) for x in r] for r in fwd] == whole[0] and [[tuple(x) for x in r] for r in rev] == whole[1]


def test_agreement_aligns_more_precisely_than_each_direction_alone():
    """Agreement training exists to drop links only one direction believes in: on pairs with junk
    words that translate nothing, its links are more precise than fast_align's (both directions'
    links, as the dictionary counts them), with recall kept."""
    from models.bitext.word_align import agreement_align, fast_align, symmetrize

    src, tgt, truth = _junked(600, seed=5)

    def precision_recall(fwd, rev):
        links = [set(symmetrize(f, r)) for f, r in zip(fwd, rev)]
        hit = sum(len(a & set(t)) for a, t in zip(links, truth))
        return hit / sum(map(len, links)), hit / sum(len(t) for t in truth)

    p_agree, r_agree = precision_recall(*agreement_align(src, tgt))
    p_fast, r_fast = precision_recall(*fast_align(src, tgt))
    assert p_agree > p_fast + 0.02 and r_agree >= r_fast - 0.02, (p_agree, r_agree, p_fast, r_fast)


def test_coverage_and_length_ratio():
    d = {"a": {"A"}, "b": {"B", "BB"}}
    assert coverage(["a", "b", "c", "a"], ["A", "BB"], d) == 0.75
    assert coverage(["a", "b"], {"X"}, d) == 0.0
    assert coverage([], ["A"], d) == 0.0
    assert length_ratio([1, 2, 3, 4], [1, 2]) == 2.0 and length_ratio([], [1]) == float("inf")


def _noisy_corpus(n: int, seed: int):
    """Pairs whose targets have some words replaced by untranslatable junk and random lengths, so
    that many cross pairs fail the length or the coverage rule (and a small vocabulary, so that
    many pass); one pair is duplicated."""
    rng = random.Random(seed)
    src, tgt = substitution_corpus(n, seed, vocab=6)
    for k, t in enumerate(tgt):
        for pos in range(len(t)):
            if rng.random() < 0.3:
                t[pos] = f"junk{rng.randrange(50)}"
        if k % 7 == 0:
            t.extend(f"junk{rng.randrange(50)}" for _ in range(rng.randint(1, 8)))
    pairs = list(zip(src, tgt))
    pairs.append(pairs[3])                                  # a duplicated pair
    pairs += [(["w5"], ["x5e"]), (["w0", "w1"], ["x0e", "x1e"])]     # few or no partners of a fitting length
    return pairs


def test_every_synthetic_negative_follows_the_rules():
    pairs = _noisy_corpus(60, seed=4)
    d = true_dictionary()
    ex = synthetic_examples(pairs, d, negatives_per_positive=5, seed=1, max_tries=3000)
    true_pairs = {(tuple(s), tuple(t)) for s, t in pairs}
    # positives: every corpus pair, in order, each followed by its negatives
    assert [(s, t) for s, t, y in ex if y == 1] == [(list(s), list(t)) for s, t in pairs]
    groups, negs = [], None
    for s, t, y in ex:
        if y == 1:
            negs = []
            groups.append((s, negs))
        else:
            assert s == groups[-1][0]                        # a negative keeps its positive's source
            negs.append(t)
    n_negatives = 0
    for i, (s, negatives) in enumerate(groups):
        for t in negatives:
            n_negatives += 1
            assert (tuple(s), tuple(t)) not in true_pairs
            assert length_ratio(s, t) <= 2.0
            assert coverage(s, t, d.src_to_tgt) >= 0.5 and coverage(t, s, d.tgt_to_src) >= 0.5
        # 1:5 where possible: every eligible target sentence was found when there are fewer than 5
        eligible = {j for j, (_, t) in enumerate(pairs) if j != i and (tuple(s), tuple(t)) not in true_pairs
                    and length_ratio(s, t) <= 2 and coverage(s, t, d.src_to_tgt) >= 0.5
                    and coverage(t, s, d.tgt_to_src) >= 0.5}
        assert len(negatives) == min(5, len(eligible))
    assert n_negatives > 2 * len(pairs)                      # the rules leave plenty of negatives
    assert ex.stats["negatives"] == n_negatives and ex.stats["positives"] == len(pairs)
    assert ex.stats["short_positives"] == sum(len(n) < 5 for _, n in groups) > 0
    assert sum(len(n) == 5 for _, n in groups) > len(pairs) / 2
    # seeded: the same seed gives the same data, another seed other negatives
    assert synthetic_examples(pairs, d, seed=1, max_tries=3000) == ex
    assert synthetic_examples(pairs, d, seed=2, max_tries=3000) != ex


def test_synthetic_sampling_stops_after_max_tries():
    pairs = [(["w1", "w2"], ["x1e", "x2e"]), (["w3"] * 9, ["x3e"])]       # the only cross pairs fail
    ex = synthetic_examples(pairs, true_dictionary(), max_tries=7)
    assert [y for *_, y in ex] == [1, 1] and ex.stats == {"positives": 2, "negatives": 0, "short_positives": 2,
                                                          "tries": 14, "negatives_per_positive": 5,
                                                          "partial_negatives": 0}


def _changed_span(before, after):
    """(removed, inserted): what lies between the longest common start and end of two lists."""
    p = 0
    while p < min(len(before), len(after)) and before[p] == after[p]:
        p += 1
    q = 0
    while q < min(len(before), len(after)) - p and before[-1 - q] == after[-1 - q]:
        q += 1
    return before[p:len(before) - q], after[p:len(after) - q]


def test_a_partial_divergence_changes_one_span_of_one_side():
    """Delete, replace or add a span of 30-60% of one side's words, from the donor's same side;
    trailing punctuation stays; a side too short is left alone (None)."""
    src = ["w1", "w2", "w3", "w4", "w5", "w6", "w7", "w8", "w9", "w10", "."]
    tgt = ["x1", "x2", "x3", "x4", "x5", "x6", "x7", "x8", "?", "!"]
    donor = (["a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8", "a9", "."], ["b1", "b2", "b3", "b4", "b5", "b6", "."])
    rng = random.Random(0)
    ops = Counter()
    for _ in range(300):
        out = partial_divergence(src, tgt, donor, rng)
        assert out is not None
        side = 0 if out[1] == tuple(tgt) else 1
        assert out[1 - side] == tuple((src, tgt)[1 - side])             # the other side untouched
        words, tail = list((src, tgt)[side]), [".", "?", "!"]
        n_tail = 1 if side == 0 else 2
        changed = list(out[side])
        assert changed[-n_tail:] == words[-n_tail:] and changed != words  # punctuation kept, words changed
        removed, inserted = _changed_span(words[:-n_tail], changed[:-n_tail])
        n = len(words) - n_tail
        donor_words = " " + " ".join(donor[side][:-1]) + " "
        assert not inserted or f" {' '.join(inserted)} " in donor_words  # a contiguous span of the donor
        assert not set(inserted) & set(tail)
        if removed:
            assert 2 <= len(removed) and 0.3 * n - 1 <= len(removed) <= 0.6 * n + 1
            ops["replace" if inserted else "delete"] += 1
        else:
            assert changed[:len(inserted)] == inserted or changed[-n_tail - len(inserted):-n_tail] == inserted
            ops["add"] += 1
    assert min(ops[o] for o in ("delete", "replace", "add")) > 50, ops
    short = (["w1", "w2", "w3", "."], ["x1", "x2", "x3", "!"])
    assert all(partial_divergence(*short, donor, random.Random(k)) is None for k in range(20))


def test_partial_negatives_follow_each_positive_and_leave_the_cross_pairs_as_they_were():
    pairs = _noisy_corpus(60, seed=4)
    d = true_dictionary()
    plain = synthetic_examples(pairs, d, seed=1, max_tries=3000)
    ex = synthetic_examples(pairs, d, seed=1, max_tries=3000, partial_negatives=2)
    true_pairs = {(tuple(s), tuple(t)) for s, t in pairs}

    def groups(examples):                                   # each positive with the negatives after it
        out = []
        for e in examples:
            if e[2] == 1:
                out.append([])
            out[-1].append(e)
        return out

    partial = 0
    for mine, before in zip(groups(ex), groups(plain), strict=True):
        assert mine[:len(before)] == before                 # the same cross pairs, in the same order
        (src, tgt, _), extra = mine[0], mine[len(before):]
        assert len(extra) <= 2
        for s, t, y in extra:
            assert y == 0 and (tuple(s), tuple(t)) not in true_pairs
            assert (s == src) != (t == tgt)                 # exactly one side changed
        partial += len(extra)
    assert partial == ex.stats["partial_negatives"] > len(pairs)   # most positives are long enough for 2
    assert ex.stats["negatives"] == plain.stats["negatives"] + partial
    assert synthetic_examples(pairs, d, seed=1, max_tries=3000, partial_negatives=2) == ex
    with pytest.raises(ValueError):
        synthetic_examples(pairs, d, partial_negatives=-1)
    with pytest.raises(ValueError, match="partial_negatives"):
        DivergenceConfig(partial_negatives=11).validate()


def greedy_reference(sim: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """One pair at a time: the best remaining pair, then drop its row and column."""
    out = np.zeros_like(valid)
    s = np.where(valid, sim, -np.inf)
    while np.isfinite(s).any():
        i, j = np.unravel_index(np.argmax(s), s.shape)
        out[i, j] = True
        s[i, :] = s[:, j] = -np.inf
    return out


def test_greedy_matching_equals_one_at_a_time_greedy():
    g = torch.Generator().manual_seed(0)
    sim = torch.rand(6, 7, 5, generator=g)
    lens1, lens2 = [7, 3, 5, 1, 7, 6], [5, 5, 2, 4, 1, 3]
    valid = torch.zeros(6, 7, 5, dtype=torch.bool)
    for b, (a, c) in enumerate(zip(lens1, lens2)):
        valid[b, :a, :c] = True
    got = greedy_matching(sim, valid)
    for b in range(6):
        assert np.array_equal(got[b].numpy(), greedy_reference(sim[b].numpy(), valid[b].numpy()))
        assert int(got[b].sum()) == min(lens1[b], lens2[b])


@pytest.mark.slow
def test_interaction_model_shape_and_padding_does_not_change_outputs():
    torch.manual_seed(0)
    model = InteractionModel(20, 25, dim=8, hidden=6, channels=(4, 5, 6), dense=7).eval()
    lens_s, lens_t = torch.tensor([3, 9, 1, 6]), torch.tensor([5, 2, 4, 11])
    s_ids = torch.randint(2, 20, (4, 9))
    t_ids = torch.randint(2, 25, (4, 11))
    same = (torch.rand(4, 9, 11) < 0.2).float()
    with torch.no_grad():
        batched = model(s_ids, lens_s, t_ids, lens_t, same)
        assert batched.shape == (4, 2)
        # garbage in the padding (ids, same-string flags) changes nothing
        s2, t2, same2 = s_ids.clone(), t_ids.clone(), same.clone()
        for b in range(4):
            s2[b, lens_s[b]:] = 7
            t2[b, lens_t[b]:] = 3
            same2[b, lens_s[b]:, :] = 1
            same2[b, :, lens_t[b]:] = 1
        assert torch.allclose(model(s2, lens_s, t2, lens_t, same2), batched, atol=1e-5)
        # each pair alone (no padding at all) gives what it got in the padded batch
        for b in range(4):
            ls, lt = int(lens_s[b]), int(lens_t[b])
            alone = model(s_ids[b:b + 1, :ls], lens_s[b:b + 1], t_ids[b:b + 1, :lt], lens_t[b:b + 1],
                          same[b:b + 1, :ls, :lt])
            assert torch.allclose(alone, batched[b:b + 1], atol=1e-5)
    # initial vectors are copied into the tables
    vec = np.random.default_rng(0).normal(size=(20, 8)).astype(np.float32)
    m2 = InteractionModel(20, 25, dim=8, hidden=6, channels=(4,), src_vectors=vec, freeze_embeddings=True)
    assert np.allclose(m2.src_embed.weight.detach().numpy(), vec) and not m2.src_embed.weight.requires_grad


def test_macro_f1_and_tune_threshold_by_hand():
    # class 1: tp 2, 3 predicted, 3 true -> 2/3; class 0: tp 1, 2 predicted, 2 true -> 1/2
    assert macro_f1([1, 0, 0, 1, 1], [1, 1, 0, 0, 1]) == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert macro_f1([1, 1], [1, 1]) == 1.0
    assert macro_f1([1, 1, 1], [1, 0, 0]) == pytest.approx((2 * 1 / 4 + 0) / 2)
    assert tune_threshold([0.9, 0.8, 0.3, 0.2], [1, 1, 0, 0]) == (pytest.approx(0.55), 1.0)
    # not separable: 0.225 -> preds 0,1,1,1: F1 (0.8 + 2/3) / 2; 0.6 ties with it, the lower wins
    th, f = tune_threshold([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1])
    assert th == pytest.approx(0.225) and f == pytest.approx((0.8 + 2 / 3) / 2)
    with pytest.raises(ValueError):
        tune_threshold([0.1], [1, 0])


def test_baselines():
    assert np.allclose(length_ratio_scores([["a"] * 4, ["a"], []], [["b"] * 2, ["b"], ["c"]]), [0.5, 1.0, 0.0])
    from common.text import Vocabulary
    from models.bitext.divergence import BilingualEmbeddings

    sv, tv = Vocabulary(["<pad>", "<unk>", "a", "b"]), Vocabulary(["<pad>", "<unk>", "A", "B"])
    e = BilingualEmbeddings(sv, tv, np.array([[0, 0], [0, 0], [1, 0], [0, 1]], np.float32),
                            np.array([[0, 0], [0, 0], [1, 0], [0, 1]], np.float32))
    got = embedding_cosine_scores([["a"], ["a", "b"], ["zz"]], [["A"], ["B"], ["A"]], e)
    assert np.allclose(got, [1.0, np.sqrt(0.5), 0.0])


class Payload:
    """Stands for any pickled object: unpickling it would run code (here, os.getcwd)."""

    def __reduce__(self):
        return (os.getcwd, ())


TINY = dict(dim=16, hidden=12, channels=(8, 8), dense=16, dropout=0.0, epochs=4, batch_size=16, lr=3e-3,
            device="cpu", progress=False, max_tries=400, members=1)


def untrained_detector(**settings):
    """(source sentences, target sentences, an untrained TINY detector with SETTINGS over their words)."""
    from collections import Counter

    from common.text import Vocabulary
    from models.bitext.divergence import DivergenceDetector

    torch.manual_seed(0)
    src, tgt = substitution_corpus(12, seed=4)
    return src, tgt, DivergenceDetector(Vocabulary.build(Counter(w for s in src for w in s)),
                                        Vocabulary.build(Counter(w for t in tgt for w in t)),
                                        DivergenceConfig(**{**TINY, **settings}))


def test_confident_scores_keep_their_order():
    """A confident model's P(equivalent) must not round to exactly 1.0 (float32 softmax does from a
    logit gap of about 17): tied scores lose their ranking."""
    src, tgt, det = untrained_detector(dropout=0.0)
    with torch.no_grad():
        det.model.head[-1].bias.copy_(torch.tensor([-10.0, 10.0]))
        logits = det.logits(src, tgt).double()
    gap = (logits[:, 1] - logits[:, 0]).numpy()
    assert gap.min() > 18                     # float32 rounds P to 1.0 above about 17
    scores = det.score_tokens(src, tgt)
    assert np.all(scores < 1.0) and len(np.unique(scores)) == len(np.unique(gap)) > len(src) // 2
    assert np.array_equal(np.argsort(scores, kind="stable"), np.argsort(gap, kind="stable"))


@pytest.fixture(scope="module")
def trained():
    torch.set_num_threads(1)
    src, tgt = substitution_corpus(250, seed=1, vocab=12)    # small vocabulary: many overlapping cross pairs
    src.insert(7, [])                                          # an empty side: dropped before aligning
    tgt.insert(7, ["x1e"])
    return train_divergence(src, tgt, DivergenceConfig(**TINY), alignments=true_alignments(src, tgt),
                            log=lambda m: None)


@pytest.mark.slow
def test_training_separates_translations_from_synthetic_negatives(trained):
    det = trained.detector
    assert trained.report["pairs"] == 250
    assert trained.report["synthetic"]["negatives"] >= 4 * trained.report["synthetic"]["positives"]
    # unseen pairs of the same language and negatives made from them the same way
    src, tgt = substitution_corpus(60, seed=99, vocab=12)
    ex = synthetic_examples(list(zip(src, tgt)), trained.dictionary, negatives_per_positive=1, seed=3)
    labels = np.array([y for *_, y in ex])
    scores = det.score_tokens([s for s, _, _ in ex], [t for _, t, _ in ex])
    pos, neg = scores[labels == 1], scores[labels == 0]
    auc = (pos[:, None] > neg[None, :]).mean()
    balanced = ((pos >= 0.5).mean() + (neg < 0.5).mean()) / 2
    assert auc > 0.9 and balanced > 0.75, (auc, balanced)


@pytest.mark.slow
def test_save_load_round_trip_and_refusals(trained, tmp_path):
    det = trained.detector
    det.threshold = 0.37
    out = str(tmp_path / "div")
    det.save(out)
    assert sorted(os.listdir(out)) == ["config.json", "src_words.json", "tgt_words.json", "weights.pt"]
    back = load_divergence_detector(out, device="cpu")
    src, tgt = substitution_corpus(20, seed=5)
    s_txt, t_txt = [" ".join(s) for s in src], [" ".join(t) for t in tgt[::-1]]
    assert np.array_equal(back.score(s_txt, t_txt), det.score(s_txt, t_txt))
    assert back.threshold == 0.37 and back.cfg.partial_negatives == det.cfg.partial_negatives == 1
    assert np.array_equal(back.divergent(s_txt, t_txt), det.score(s_txt, t_txt) < 0.37)
    # a detector saved before partial negatives existed was trained without them
    import json
    cfg = json.load(open(os.path.join(out, "config.json")))
    del cfg["model"]["partial_negatives"]
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"))
    assert load_divergence_detector(out, device="cpu").cfg.partial_negatives == 0
    assert back.cfg.average_epochs == det.cfg.average_epochs == 1          # so was weight averaging
    del cfg["model"]["average_epochs"]
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"))
    assert load_divergence_detector(out, device="cpu").cfg.average_epochs == 0
    del cfg["model"]["members"]                                   # and as one member (weights of one model)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"))
    assert load_divergence_detector(out, device="cpu").cfg.members == 1 == det.cfg.members
    odd = back.score(["", "w1 w2", "W1 , w2 !"], ["x1e", "", "x1e , x2e !"])          # empty sides, punctuation
    assert odd.shape == (3,) and np.all((odd >= 0) & (odd <= 1)) and back.score([], []).shape == (0,)

    # a pickled object instead of tensors is refused, never unpickled
    torch.save({"weights": Payload()}, os.path.join(out, "weights.pt"))
    with pytest.raises(UnsafeModelError):
        load_divergence_detector(out)
    torch.save({"not_a_tensor": [1, 2]}, os.path.join(out, "weights.pt"))
    with pytest.raises(UnsafeModelError):
        load_divergence_detector(out)
    # a config with wrong types is refused before any model is built
    det.save(out)
    cfg_path = os.path.join(out, "config.json")
    cfg = json.load(open(cfg_path))
    cfg["model"]["hidden"] = "12; import os"
    json.dump(cfg, open(cfg_path, "w"))
    with pytest.raises(UsageError):
        load_divergence_detector(out)
    os.remove(cfg_path)
    with pytest.raises(FileNotFoundError):
        load_divergence_detector(out)


@pytest.mark.slow
def test_command_line_trains_tunes_and_refuses_to_overwrite(tmp_path, capsys):
    from models.bitext.train_divergence import main, run

    src, tgt = substitution_corpus(120, seed=2)
    (tmp_path / "c.en").write_text("".join(" ".join(s) + "\n" for s in src))
    (tmp_path / "c.fr").write_text("".join(" ".join(t) + "\n" for t in tgt))
    dev_src, dev_tgt = substitution_corpus(20, seed=3)
    rows = [f"{' '.join(s)}\t{' '.join(t)}\t1\t1.0\n" for s, t in zip(dev_src, dev_tgt)]
    rows += [f"{' '.join(s)}\t{' '.join(t)}\t0\t1.0\n" for s, t in zip(dev_src, dev_tgt[1:] + dev_tgt[:1])]
    (tmp_path / "dev.tsv").write_text("english\tfrench\tlabel\tagreement\n" + "".join(rows))
    out = str(tmp_path / "model")
    args = ["--src", str(tmp_path / "c.en"), "--tgt", str(tmp_path / "c.fr"), "--src_lang", "en", "--tgt_lang", "fr",
            "--output", out, "--dev", str(tmp_path / "dev.tsv"), "--epochs", "1", "--dim", "8", "--hidden", "8",
            "--channels", "4,4", "--batch_size", "16", "--device", "cpu", "--no_progress"]
    report = run(args)
    assert report["dev"]["pairs"] == 40 and 0 <= report["dev"]["macro_f1"] <= 1
    det = load_divergence_detector(out)
    assert det.cfg.members == 2 and [m["seed"] for m in report["members"]] == [1, 1001]    # the default: two
    assert det.threshold == report["dev"]["threshold"] and det.cfg.src_lang == "en"
    assert main(args) == 2                                          # exists: refused without --overwrite
    assert "--overwrite" in capsys.readouterr().err
    missing = [str(tmp_path / "missing.en") if a == str(tmp_path / "c.en") else a for a in args]
    assert main(missing + ["--overwrite"]) == 2 and "missing.en" in capsys.readouterr().err
    assert main(args + ["--overwrite", "--members", "0"]) == 2 and "members" in capsys.readouterr().err
    report = run(args + ["--overwrite", "--members", "2", "--partial_negatives", "1"])
    assert [m["seed"] for m in report["members"]] == [1, 1001]
    assert 100 <= report["synthetic"]["partial_negatives"] <= 120       # one a positive of 4+ words
    assert load_divergence_detector(out).cfg.members == 2 and load_divergence_detector(out).cfg.partial_negatives == 1
    assert main(args + ["--overwrite", "--partial_negatives", "11"]) == 2 and "partial_negatives" in capsys.readouterr().err
    assert main(args + ["--overwrite", "--average_epochs", "2"]) == 2 and "average_epochs" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_divergence_scores_a_labelled_tsv_of_any_name(trained, tmp_path):
    import subprocess
    import sys

    model = str(tmp_path / "det")
    trained.detector.save(model)
    src, tgt = substitution_corpus(24, seed=8, vocab=12)
    rows = [f"{' '.join(s)}\t{' '.join(t)}\t1\t1.0\n" for s, t in zip(src, tgt)]
    rows += [f"{' '.join(s)}\t{' '.join(t)}\t0\t1.0\n" for s, t in zip(src, tgt[3:] + tgt[:3])]
    labels = tmp_path / "my labels.tsv"                           # no .dev.tsv in the name
    labels.write_text("english\tfrench\tlabel\tagreement\n" + "".join(rows))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "bench/bench_divergence.py", "--model", model, "--dev", str(labels),
                           "--folds", "2", "--repeats", "1", "--bootstrap", "20"],
                          capture_output=True, text=True, cwd=root, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "my labels (48)" in done.stdout
    bad = subprocess.run([sys.executable, "bench/bench_divergence.py", "--model", model, "--dev", str(tmp_path / "no")],
                         capture_output=True, text=True, cwd=root, timeout=300)
    assert bad.returncode == 2 and "--dev" in bad.stderr


@pytest.mark.slow
def test_two_trainings_with_the_same_seed_give_the_same_detector(tmp_path):
    """The aligner is deterministic and everything after it seeded: the same data and --seed give the
    same threshold and the same scores (with eflomal they did not: it seeds itself)."""
    from models.bitext.train_divergence import run

    src, tgt = substitution_corpus(150, seed=6, vocab=14)
    (tmp_path / "c.en").write_text("".join(" ".join(s) + "\n" for s in src))
    (tmp_path / "c.fr").write_text("".join(" ".join(t) + "\n" for t in tgt))
    dev_src, dev_tgt = substitution_corpus(30, seed=7, vocab=14)
    rows = [f"{' '.join(s)}\t{' '.join(t)}\t1\t1.0\n" for s, t in zip(dev_src, dev_tgt)]
    rows += [f"{' '.join(s)}\t{' '.join(t)}\t0\t1.0\n" for s, t in zip(dev_src, dev_tgt[2:] + dev_tgt[:2])]
    (tmp_path / "dev.tsv").write_text("english\tfrench\tlabel\tagreement\n" + "".join(rows))
    texts = ([" ".join(s) for s in dev_src], [" ".join(t) for t in dev_tgt[::-1]])

    def train(name, seed):
        run(["--src", str(tmp_path / "c.en"), "--tgt", str(tmp_path / "c.fr"), "--src_lang", "en", "--tgt_lang", "fr",
             "--output", str(tmp_path / name), "--dev", str(tmp_path / "dev.tsv"), "--epochs", "1", "--dim", "8",
             "--hidden", "8", "--channels", "4,4", "--batch_size", "16", "--device", "cpu", "--threads", "1",
             "--seed", str(seed), "--no_progress"])
        det = load_divergence_detector(str(tmp_path / name), device="cpu")
        return det.threshold, det.score(*texts)

    (th1, s1), (th2, s2), (th3, s3) = train("a", 3), train("b", 3), train("c", 4)
    assert th1 == th2 and np.array_equal(s1, s2)
    assert not np.array_equal(s1, s3)                      # the seed does matter


@pytest.mark.slow
def test_an_ensemble_averages_members_that_single_trainings_reproduce(tmp_path):
    """--members K: member 0 is the detector that --seed alone trains, member k trains from seed +
    1000 k on the same alignments, dictionary and vectors; the detector's P(equivalent) is the
    members' mean, the threshold is tuned on that mean, and the saved ensemble (fixed word vectors
    stored once) loads to the same scores."""
    from dataclasses import replace

    from models.bitext.divergence.model import InteractionEnsemble, member_seed

    torch.set_num_threads(1)
    src, tgt = substitution_corpus(160, seed=11, vocab=12)
    links = true_alignments(src, tgt)
    dev_src, dev_tgt = substitution_corpus(20, seed=12, vocab=12)
    dev = [(" ".join(s), " ".join(t), 1) for s, t in zip(dev_src, dev_tgt)]
    dev += [(" ".join(s), " ".join(t), 0) for s, t in zip(dev_src, dev_tgt[3:] + dev_tgt[:3])]
    cfg = DivergenceConfig(**{**TINY, "epochs": 2, "seed": 5})
    quiet = lambda m: None  # noqa: E731
    ens = train_divergence(src, tgt, replace(cfg, members=3), dev, alignments=links, log=quiet)
    det = ens.detector
    assert isinstance(det.model, InteractionEnsemble) and len(det.model.members) == 3
    assert [m["seed"] for m in ens.report["members"]] == [5, 1005, 2005] == [member_seed(5, k) for k in range(3)]

    texts = ([s for s, _, _ in dev], [t for _, t, _ in dev])
    alone = train_divergence(src, tgt, cfg, alignments=links, log=quiet).detector
    as_single = det.member_detectors()
    assert [d.cfg.seed for d in as_single] == [5, 1005, 2005] and {d.cfg.members for d in as_single} == {1}
    member_scores = np.array([d.score(*texts) for d in as_single])
    assert np.array_equal(member_scores[0], alone.score(*texts))
    assert not np.array_equal(member_scores[0], member_scores[1])        # the seeds differ
    mean = det.score(*texts)
    np.testing.assert_allclose(mean, member_scores.mean(0), rtol=1e-6)      # float32 logits, summed apart
    assert (det.threshold, ens.report["dev"]["macro_f1"]) == tune_threshold(mean, [y for *_, y in dev])

    out = tmp_path / "ens"
    det.save(str(out))
    from models.safety import load_tensor_file

    state = load_tensor_file(str(out / "weights.pt"))     # the fixed tables are stored once, not per member
    assert {state[f"members.{k}.src_embed.weight"].data_ptr() for k in range(3)} == \
        {state["members.0.src_embed.weight"].data_ptr()}
    assert not torch.equal(state["members.0.head.4.bias"], state["members.1.head.4.bias"])
    back = load_divergence_detector(str(out), device="cpu")
    assert back.cfg.members == 3 and back.threshold == det.threshold
    assert np.array_equal(back.score(*texts), mean)
    # the bench pools an ensemble's members with a single detector's: 3 + 1 members
    alone.save(str(tmp_path / "one"))
    (tmp_path / "dev.tsv").write_text("english\tfrench\tlabel\n" + "".join(f"{a}\t{b}\t{y}\n" for a, b, y in dev))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "bench/bench_divergence_ensemble.py", str(out), str(tmp_path / "one"),
                           "--dev", str(tmp_path / "dev.tsv")], capture_output=True, text=True, cwd=root, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "4 members" in done.stdout and "| dev.tsv |" in done.stdout

    cfg_path = out / "config.json"
    raw = json.loads(cfg_path.read_text())
    for bad in (0, 99, "3"):
        cfg_path.write_text(json.dumps({**raw, "model": {**raw["model"], "members": bad}}))
        with pytest.raises(UsageError, match="members"):
            load_divergence_detector(str(out), device="cpu")
    cfg_path.write_text(json.dumps({**raw, "model": {**raw["model"], "members": 2}}))
    with pytest.raises(UsageError, match="weights.pt does not fit"):          # 3 members' weights, 2 said
        load_divergence_detector(str(out), device="cpu")


def test_weight_mean_is_the_mean_of_every_step_and_leaves_fixed_tables_alone():
    torch.manual_seed(0)
    model = InteractionModel(20, 20, dim=6, hidden=4, channels=(4,), dense=4, freeze_embeddings=True)
    table = model.src_embed.weight.detach().clone()
    mean = WeightMean(model)
    assert all(p.requires_grad for p in mean.params) and all(p is not model.src_embed.weight for p in mean.params)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    ids, lens = torch.tensor([[1, 2, 3], [4, 5, 0]]), torch.tensor([3, 2])
    seen = []
    for step in range(5):
        opt.zero_grad()
        model(ids, lens, ids, lens).logsumexp(-1).sum().backward()
        opt.step()
        mean.add()
        seen.append([p.detach().clone() for p in mean.params])
    assert mean.steps == 5 and not torch.equal(seen[0][0], seen[-1][0])     # the weights did move
    mean.copy_to_model()
    for k, p in enumerate(mean.params):
        torch.testing.assert_close(p.detach(), torch.stack([w[k] for w in seen]).mean(0))
    assert torch.equal(model.src_embed.weight, table)


@pytest.mark.slow
def test_weight_averaging_keeps_the_last_epochs_mean_and_not_the_training_path():
    """average_epochs changes only which weights are kept: the training itself (its losses, hence
    every step's weights) is the same with 0 and 1, the kept weights are not, and the report
    says over how many steps they were averaged."""
    from dataclasses import replace

    torch.set_num_threads(1)
    src, tgt = substitution_corpus(120, seed=13, vocab=12)
    links = true_alignments(src, tgt)
    cfg = DivergenceConfig(**{**TINY, "epochs": 2, "seed": 3})
    quiet = lambda m: None  # noqa: E731
    last = train_divergence(src, tgt, replace(cfg, average_epochs=0), alignments=links, log=quiet)
    mean = train_divergence(src, tgt, replace(cfg, average_epochs=1), alignments=links, log=quiet)
    both = train_divergence(src, tgt, replace(cfg, average_epochs=2), alignments=links, log=quiet)
    losses = [[e["loss"] for e in t.report["epochs"]] for t in (last, mean, both)]
    assert losses[0] == losses[1] == losses[2]
    examples = mean.report["synthetic"]["positives"] + mean.report["synthetic"]["negatives"]
    steps = mean.report["averaged_steps"]
    assert "averaged_steps" not in last.report and both.report["averaged_steps"] == 2 * steps
    assert examples / cfg.batch_size * 0.9 < steps < examples / cfg.batch_size * 1.1     # one epoch of batches
    texts = ([" ".join(s) for s in src[:20]], [" ".join(t) for t in tgt[:20]])
    scores = [t.detector.score(*texts) for t in (last, mean, both)]
    assert not np.array_equal(scores[0], scores[1]) and not np.array_equal(scores[1], scores[2])
    with pytest.raises(ValueError, match="average_epochs"):
        replace(cfg, average_epochs=3).validate()


def test_an_ensembles_confident_scores_keep_their_order():
    """The mean of members' P(equivalent) is taken in float64 (log-mean-exp): pairs every member
    is sure of still rank, as with one model."""
    src, tgt, det = untrained_detector(members=2)
    with torch.no_grad():
        for m in det.model.members:
            m.head[-1].bias.copy_(torch.tensor([-10.0, 10.0]))
        gaps = [(lambda z: (z[:, 1] - z[:, 0]).numpy())(m(*det.batch(src, tgt)).double())
                for m in det.model.members]
    assert min(g.min() for g in gaps) > 18
    scores = det.score_tokens(src, tgt)
    assert np.all(scores < 1.0) and len(np.unique(scores)) > len(src) // 2
    expected = np.mean([1 / (1 + np.exp(-g)) for g in gaps], 0)          # float64 throughout
    np.testing.assert_allclose(1 - scores, 1 - expected, rtol=1e-6)
