"""The sampling engine on a real (tiny) fairseq transformer trained in this test session."""
import os

import pytest

from models.nmt.engines.fairseq_engine import SampleRequest, Translator, load_translator


def _contains(seq, phrase):
    return any(tuple(seq[i:i + len(phrase)]) == phrase for i in range(len(seq) - len(phrase) + 1))


@pytest.mark.slow
def test_banned_phrases_never_appear(fwd, sources):
    from tests.toydata import toy_bitext

    refs = [tgt for _, tgt in toy_bitext(400, seed=3)[:6]]
    requests = []
    for i, (src, ref) in enumerate(zip(sources, refs)):
        words = tuple(ref.split()[:3])
        requests.append(SampleRequest(src, f"p{i}", words, 12))
    out = fwd.sample(requests, topk=10, seed=5)
    multi_piece = 0
    for req, hyps in zip(requests, out):
        assert len(hyps) == req.num_samples
        phrases = fwd.banned_phrases(req.banned_words)
        assert phrases, "each request bans something"
        multi_piece += sum(len(p) > 1 for p in phrases)
        for h in hyps:
            for p in phrases:
                assert not _contains(h.token_ids, p), (h.pieces, p)
    assert multi_piece > 0, "some banned word spans several pieces"
    # Unconstrained sampling does produce some of those phrases, so the ban is doing the work.
    free = fwd.sample([SampleRequest(r.source, r.key, (), 12) for r in requests], topk=10, seed=5)
    hits = sum(_contains(h.token_ids, p) for r, hyps in zip(requests, free)
               for h in hyps for p in fwd.banned_phrases(r.banned_words))
    assert hits > 0


@pytest.mark.slow
def test_banned_phrases_are_worked_out_once_a_word(fwd):
    """Translator.banned_phrases keeps each word's phrases: a word seen before costs a lookup, and
    the phrases are those the tokenization spells (in order, deduplicated, unknown pieces out)."""
    from tests.toydata import toy_bitext

    words = [w for _, tgt in toy_bitext(50, seed=4) for w in tgt.split()]
    fwd._word_bans_memo.clear()
    first = [fwd.banned_phrases(tuple(words[i:i + 3])) for i in range(0, len(words), 3)]
    assert set(fwd._word_bans_memo) == set(words)
    for word in set(words):                                # each word as the tokenization spells it
        spelled = [tuple(fwd.tgt_dict.index(p) for p in seq)
                   for seq in fwd.tokenization.banned_phrases(word, fwd._vocabulary)]
        assert list(fwd._word_bans_memo[word]) == [ids for ids in spelled if ids and fwd.unk not in ids]
    assert first == [fwd.banned_phrases(tuple(words[i:i + 3])) for i in range(0, len(words), 3)]
    both = fwd.banned_phrases((words[0], words[1], words[0]))
    assert both == list(dict.fromkeys(fwd._word_bans_memo[words[0]] + fwd._word_bans_memo[words[1]]))


@pytest.mark.slow
def test_multi_piece_phrase_is_blocked_at_its_last_piece(fwd, sources):
    # Find a word the unconstrained model writes as several pieces, then ban that word.
    free = fwd.sample([SampleRequest(s, f"m{i}", (), 20) for i, s in enumerate(sources)], topk=10, seed=2)
    found = [(i, word, p) for i, hyps in enumerate(free) for h in hyps for word in h.text.split()
             for p in fwd.banned_phrases((word,)) if len(p) > 1 and _contains(h.token_ids, p)]
    assert found, "the toy model writes some word as several pieces"
    i, word, phrase = found[0]
    out = fwd.sample([SampleRequest(sources[i], f"m{i}", (word,), 20)], topk=10, seed=2)[0]
    assert len(out) == 20
    for h in out:
        for p in fwd.banned_phrases((word,)):
            assert not _contains(h.token_ids, p), (word, h.pieces)
    # Only the last piece is blocked: the phrase's first pieces may still start other words.
    assert any(_contains(h.token_ids, phrase[:-1]) for h in out)


@pytest.mark.slow
def test_same_seed_same_samples_independent_of_batching(fwd, sources):
    reqs = [SampleRequest(s, f"k{i}", (), 8) for i, s in enumerate(sources)]
    a = fwd.sample(reqs, topk=10, seed=11)
    b = fwd.sample(list(reversed(reqs)), topk=10, seed=11)[::-1]
    c = [fwd.sample([r], topk=10, seed=11)[0] for r in reqs]          # one request per batch
    texts = lambda out: [[h.text for h in hs] for hs in out]
    assert texts(a) == texts(b) == texts(c)
    assert texts(a) != texts(fwd.sample(reqs, topk=10, seed=12))


@pytest.mark.slow
def test_sample_nll_equals_forced_decoding_score(fwd, sources):
    hyps = fwd.sample([SampleRequest(s, f"s{i}", (), 2) for i, s in enumerate(sources)], topk=10, seed=1)
    flat = [(s, h) for s, hs in zip(sources, hyps) for h in hs if h.text]
    scores = fwd.score([s for s, _ in flat], [h.text for _, h in flat])
    checked = 0
    for (s, h), nll in zip(flat, scores):
        if fwd.pieces(h.text) == list(h.pieces):      # detokenise/retokenise round trip holds
            assert nll == pytest.approx(h.nll, abs=1e-3)
            checked += 1
    assert checked >= len(flat) // 2 > 0


def _reference_nll(t, source: str, target: str) -> float:
    """fairseq's own route, one pair at a time (no padding): full forward, normalised probabilities."""
    import torch

    src = torch.tensor([t._ids(t.src_dict, source, "src")])
    tgt = torch.tensor([t._ids(t.tgt_dict, target, "tgt")])
    prev = torch.cat([torch.tensor([[t.eos]]), tgt[:, :-1]], dim=1)
    with torch.inference_mode():
        lprobs = t.model.get_normalized_probs(t.model(src, torch.tensor([src.shape[1]]), prev), log_probs=True)
    return -float(lprobs.float().gather(-1, tgt[..., None]).mean())


@pytest.mark.slow
def test_score_equals_fairseq_forward_with_padding_and_blocks(bwd, sources, monkeypatch):
    import models.nmt.engines.fairseq_engine as nmt

    # Candidates of very different lengths in one batch (padded), and blocks of 7 positions so
    # the projection runs in several blocks with a short last one.
    english = ["A dog .", "Two men are walking down a long street next to a big red car in the city ."] * 3
    foreign = [sources[i % len(sources)] for i in range(len(english))]
    monkeypatch.setattr(nmt, "_LOGIT_ROWS", 7)
    got = bwd.score(english, foreign)
    want = [_reference_nll(bwd, e, f) for e, f in zip(english, foreign)]
    assert got == pytest.approx(want, abs=1e-5)
    assert len(set(round(x, 4) for x in got)) > 1


@pytest.mark.slow
def test_scorer_ids_are_fairseq_dictionary_ids_each_text_encoded_once(bwd, monkeypatch):
    texts = ["A dog .", "☃ ⚙ unseen ǂ pieces", "A dog .", "", "A dog ."]
    want = [[bwd.src_dict.index(p) for p in bwd.tokenization.encode(t, "src")] + [bwd.src_dict.eos()]
            for t in texts]
    assert bwd.src_dict.unk() in want[1]                     # unknown pieces become <unk>, as fairseq maps them
    calls = []
    encode = bwd.tokenization.encode
    monkeypatch.setattr(bwd.tokenization, "encode", lambda text, side: calls.append(text) or encode(text, side))
    assert bwd._ids_of(bwd.src_dict, texts, "src") == want
    assert sorted(calls) == sorted(set(texts))               # each distinct text once


@pytest.mark.slow
def test_length_batches_in_a_given_order_keep_the_budget(fwd):
    lengths = [5, 30, 7, 12, 30, 3, 18, 9, 25, 4]
    order = [9, 5, 0, 2, 7, 3, 6, 8, 1, 4][::-1]           # any order, e.g. the scorer's 2-D one
    batches = list(fwd._length_batches(lengths, rows_per_item=2, budget=300, order=order))
    assert [i for b in batches for i in b] == order           # each item once, in the given order
    for b in batches:
        longest = max(lengths[i] for i in b)
        assert len(b) == 1 or len(b) * 2 * (longest + fwd._max_len(longest)) <= 300
    assert len(batches) > 2


@pytest.mark.slow
def test_beam_search_is_fairseq_nbest(fwd, bwd, sources):
    out = fwd.beam_search(sources, beam=4, nbest=3)
    assert all(len(hs) == 3 for hs in out)
    for hs in out:
        assert [h.nll for h in hs] == sorted(h.nll for h in hs)     # fairseq ranks by normalised score
    # A learned model scores its own 1-best better than a scrambled sentence.
    best = [hs[0].text for hs in out]
    scrambled = [" ".join(reversed(t.split())) for t in best]
    good = fwd.score(sources, best)
    bad = fwd.score(sources, scrambled)
    assert sum(g < b for g, b in zip(good, bad)) >= len(sources) - 1
    # The backward (dual) model explains a source better from its own translation than from
    # another source's translation.
    matched = bwd.score(best, sources)
    shifted = bwd.score(best[1:] + best[:1], sources)
    assert sum(m < x for m, x in zip(matched, shifted)) > len(sources) / 2
    assert sum(matched) < sum(shifted)


def test_missing_model_dir_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing model.json"):
        Translator(str(tmp_path))


@pytest.mark.slow
def test_precision_is_validated(tiny_nmt_models):
    from models.nmt.engines.fairseq_engine import resolve_precision

    assert resolve_precision("auto", "cpu") == "fp32"
    assert resolve_precision("auto", "cuda") == "fp32"          # fastest measured on an H100 (benchmarks.md)
    assert resolve_precision("auto", "cuda", (7, 5)) == "fp32"  # no TF32 before Ampere
    assert resolve_precision("auto", "cuda", (8, 0)) == "tf32" and resolve_precision("auto", "cuda", (9, 0)) == "tf32"
    assert resolve_precision("auto", "cpu", None) == "fp32"
    assert resolve_precision("bf16", "cuda") == "bf16"
    with pytest.raises(ValueError, match="needs a GPU"):
        resolve_precision("fp16", "cpu")
    assert resolve_precision("tf32", "cuda") == "tf32"
    with pytest.raises(ValueError, match="tensor-core format"):
        resolve_precision("tf32", "cpu")
    with pytest.raises(ValueError, match="precision must be one of"):
        Translator(os.path.join(tiny_nmt_models, "cs-en"), device="cpu", precision="int4")


def test_tf32_is_on_for_a_tf32_engine_s_calls_only():
    """torch's TF32 switch is per process: a tf32 engine turns it on around its own calls and puts
    back what was there, also when the call fails, so an fp32 engine beside it stays exact."""
    import torch

    from models.nmt.engines.fairseq_engine import tf32_matmuls

    flag = torch.backends.cuda.matmul
    assert flag.allow_tf32 is False                          # torch's default
    with tf32_matmuls(True):
        assert flag.allow_tf32 is True
        with tf32_matmuls(False):
            assert flag.allow_tf32 is True                   # an fp32 call nested inside changes nothing
    assert flag.allow_tf32 is False
    with pytest.raises(RuntimeError, match="boom"), tf32_matmuls(True):
        raise RuntimeError("boom")
    assert flag.allow_tf32 is False


@pytest.mark.slow
def test_bf16_keeps_bans_and_scores_close_to_fp32(tiny_nmt_models, fwd, sources):
    t16 = load_translator(os.path.join(tiny_nmt_models, "cs-en"), device="cpu", precision="bf16")
    words = ("a", "the")
    out = t16.sample([SampleRequest(s, f"h{i}", words, 6) for i, s in enumerate(sources)], topk=10, seed=4)
    phrases = t16.banned_phrases(words)
    flat = [(s, h) for s, hs in zip(sources, out) for h in hs if h.text]
    assert len(flat) > 10
    for _, h in flat:
        assert not any(_contains(h.token_ids, p) for p in phrases)
    # bf16 weights change scores only a little: rescore the bf16 samples in fp32.
    fp32 = fwd.score([s for s, _ in flat], [h.text for _, h in flat])
    same_tokens = [(h.nll, ref) for (_, h), ref in zip(flat, fp32) if fwd.pieces(h.text) == list(h.pieces)]
    assert same_tokens
    assert max(abs(a - b) for a, b in same_tokens) < 0.15


@pytest.mark.slow
def test_zero_samples_gives_no_hypotheses(fwd, sources):
    out = fwd.sample([SampleRequest(sources[0], "z", (), 0), SampleRequest(sources[1], "y", (), 2)], seed=1)
    assert out[0] == [] and len(out[1]) == 2
    assert fwd.sample([SampleRequest(sources[0], "z", (), 0)], seed=1) == [[]]


def test_warm_up_leaves_nothing_a_unit_would_see(fwd, bwd, sources):
    """The job warms each engine up before its first unit (transforms/units.py): the samples and
    scores that follow are those of a fresh engine, and its budgets and memos are untouched."""
    reqs = [SampleRequest(s, f"w{i}", tuple(s.split()[:1]), 4) for i, s in enumerate(sources[:3])]
    english = [h.text for hs in fwd.sample(reqs, topk=10, seed=5) for h in hs]
    before = [[h.token_ids for h in hs] for hs in fwd.sample(reqs, topk=10, seed=5)]
    scores = bwd.score(english, [sources[0]] * len(english))
    state = (fwd.batch_tokens, fwd.sample_batch_tokens, dict(fwd._word_bans_memo), dict(fwd._word_packs_memo))
    assert fwd.warm_up("sample") > 0 and fwd.warm_up("beam") > 0 and bwd.warm_up("sample") > 0
    assert [[h.token_ids for h in hs] for hs in fwd.sample(reqs, topk=10, seed=5)] == before
    assert bwd.score(english, [sources[0]] * len(english)) == scores
    assert state == (fwd.batch_tokens, fwd.sample_batch_tokens, dict(fwd._word_bans_memo), dict(fwd._word_packs_memo))
