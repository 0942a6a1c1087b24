"""The sampler (models/nmt/decoding/sampler.py: a tree of shared prefixes on the device, one read-back per
step) against the plainest sampler that could be written: one row at a time, fairseq's own full
forward pass over the whole prefix at every step, its banned tokens found by comparing its last
tokens with each phrase in Python, top k, then Gumbel-max with the same noise. Same tokens, same
scores."""
import pytest
import torch

from models.nmt.decoding.device_random import gumbel, row_seed
from models.nmt.engines.fairseq_engine import SampleRequest

pytestmark = pytest.mark.slow      # the tiny NMT models are trained once per session


def _banned(phrases, history):
    out = set()
    for p in phrases:
        if len(p) == 1 or (len(history) >= len(p) - 1 and tuple(history[len(history) - len(p) + 1:]) == p[:-1]):
            out.add(p[-1])
    return out


@torch.inference_mode()
def _reference_row(t, request, sample, topk, seed, min_len):
    src_ids = t._ids(t.src_dict, request.source, "src")
    src = torch.tensor([src_ids])
    limit = t._max_len(len(src_ids))
    phrases = t.banned_phrases(request.banned_words) if request.banned_words else []
    seeds = torch.tensor([row_seed(seed, request.key, sample)])
    never = [i for i in {t.tgt_dict.pad(), t.tgt_dict.unk(), t.tgt_dict.bos()} if i != t.eos]
    tokens, total = [], 0.0
    for step in range(limit + 1):
        prev = torch.tensor([[t.eos] + tokens])
        lp = t.model.get_normalized_probs(t.model(src, torch.tensor([len(src_ids)]), prev), log_probs=True)
        lp = lp[0, -1].float().clone()
        lp[never] = float("-inf")
        if step < min_len:
            lp[t.eos] = float("-inf")
        if step >= limit:                                     # forced to end, at its true probability
            eos = float(lp[t.eos])
            lp[:] = float("-inf")
            lp[t.eos] = 0.0 if eos == float("-inf") else eos
        for tok in _banned(phrases, tokens):
            lp[tok] = float("-inf")
        vals, idx = lp.topk(min(topk, len(lp)))
        choice = int((vals + gumbel(seeds, step, len(vals))[0]).argmax())
        total += float(vals[choice])
        if int(idx[choice]) == t.eos:
            return tuple(tokens), -total / (step + 1)
        tokens.append(int(idx[choice]))
    raise AssertionError("the length limit forces </s>")


def test_the_sampler_draws_what_a_row_by_row_sampler_draws(fwd):
    from tests.toydata import toy_bitext

    pairs = toy_bitext(300, seed=21)[:4]
    requests = []
    for i, (src, ref) in enumerate(pairs):
        words = ref.split()
        requests += [SampleRequest(src, f"q{i}", (), 4),
                     SampleRequest(src, f"q{i}:1", tuple(words[:2]), 4),
                     SampleRequest(src, f"q{i}:2", tuple(words[2:5]), 4)]
    multi = sum(len(p) > 1 for r in requests for p in fwd.banned_phrases(r.banned_words))
    assert multi > 5, "the bans include phrases of several pieces"
    for topk, seed, min_len in ((10, 3, 1), (4, 8, 3)):
        got = fwd.sample(requests, topk=topk, seed=seed, min_len=min_len)
        for request, hyps in zip(requests, got):
            want = sorted(_reference_row(fwd, request, s, topk, seed, min_len) for s in range(request.num_samples))
            have = sorted((h.token_ids, h.nll) for h in hyps)
            assert [ids for ids, _ in have] == [ids for ids, _ in want], request
            assert [nll for _, nll in have] == pytest.approx([nll for _, nll in want], abs=1e-4)
