"""models/nmt/decoding/prefix_decoder.py against fairseq's own decoder, on a tiny model trained in this session."""
import copy

import pytest
import torch

from models.nmt.engines.fairseq_engine import SampleRequest
from models.nmt.decoding import prefix_decoder as prefix_decoder_module
from models.nmt.decoding.prefix_decoder import FairseqPrefixDecoder, PrefixDecoder, prefix_decoder, unsupported_reason

pytestmark = pytest.mark.slow    # every test needs the tiny NMT models (trained once per session)


@pytest.fixture(scope="module")
def sources(sources):
    return sources[:5]                     # the shared fixture's first five (tests/conftest.py)


@pytest.mark.parametrize("fused,max_batch", [(False, None), (True, None), (True, 2)],
                         ids=["explicit", "fused_attention", "fused_in_slices"])
@torch.inference_mode()
def test_features_match_fairseq_full_forward_through_splits_and_deaths(fwd, sources, fused, max_batch,
                                                                       monkeypatch):
    """Both attention paths: the explicit products (the CPU's) and the fused kernel (a GPU's
    default, run here on the CPU), also cut into slices as a GPU's grid limit makes it for more
    than 65,535 nodes (here 2)."""
    if max_batch:
        monkeypatch.setattr(prefix_decoder_module, "_FUSED_MAX_BATCH", max_batch)
    model = fwd.model
    src_tokens, src_lengths = fwd._collate_src([fwd._ids(fwd.src_dict, s, "src") for s in sources])
    enc = model.encoder.forward_torchscript({"src_tokens": src_tokens, "src_lengths": src_lengths})
    dec = PrefixDecoder(model.decoder, enc, max_len=12, fused_attention=fused)
    assert dec.fused is fused
    gen = torch.Generator().manual_seed(0)
    prefixes = torch.full((len(sources), 1), fwd.eos, dtype=torch.long)
    node_src = torch.arange(len(sources))
    splits = deaths = 0
    for step in range(8):
        got = dec.step(prefixes)
        # Reference: fairseq's decoder over the whole prefixes, no incremental state.
        want, _ = model.decoder(prefixes, encoder_out=model.encoder.reorder_encoder_out(enc, node_src),
                                features_only=True)
        torch.testing.assert_close(got, want[:, -1, :], atol=1e-4, rtol=1e-4)
        # Next nodes: each node has 0-3 children (sorted by parent, as the sampler makes them).
        n_children = torch.randint(0, 4, (len(prefixes),), generator=gen)
        n_children[0] = max(int(n_children[0]), 1)                      # never empty
        splits += int((n_children > 1).sum())
        deaths += int((n_children == 0).sum())
        parent = torch.repeat_interleave(torch.arange(len(prefixes)), n_children)
        new_tok = torch.randint(4, len(fwd.tgt_dict), (len(parent),), generator=gen)
        prefixes = torch.cat([prefixes[parent], new_tok[:, None]], dim=1)
        node_src = node_src[parent]
        dec.reorder(parent)
    assert splits and deaths, "the walk exercised both splits and deaths"


@torch.inference_mode()
def test_fused_attention_launches_fewer_kernels_a_step(fwd, sources):
    """On a GPU a step's time follows its kernel launches: each fused attention replaces the
    products, the mask and the softmax (at least three operations a layer fewer)."""
    from models.nmt.decoding.round_trips import computing_ops, count_device_ops

    model = fwd.model
    src_tokens, src_lengths = fwd._collate_src([fwd._ids(fwd.src_dict, s, "src") for s in sources])
    enc = model.encoder.forward_torchscript({"src_tokens": src_tokens, "src_lengths": src_lengths})
    ops, features = {}, {}
    for fused in (False, True):
        dec = PrefixDecoder(model.decoder, enc, max_len=12, fused_attention=fused)
        prefixes = torch.full((len(sources), 1), fwd.eos, dtype=torch.long)
        dec.step(prefixes)
        parent = torch.arange(len(sources)).repeat_interleave(2)                 # every node splits
        dec.reorder(parent)
        prefixes = torch.cat([prefixes[parent], torch.arange(4, 4 + len(parent))[:, None]], dim=1)
        with count_device_ops() as counted:
            features[fused] = dec.step(prefixes)
        ops[fused] = computing_ops(counted)
    torch.testing.assert_close(features[True], features[False], atol=1e-5, rtol=1e-5)
    assert ops[True] <= ops[False] - 3 * len(model.decoder.layers), ops


def test_sampling_is_the_same_with_fairseqs_decoder(fwd, sources):
    refs = [s.split()[:2] for s in sources]
    reqs = [SampleRequest(s, f"f{i}", tuple(r), 10) for i, (s, r) in enumerate(zip(sources, refs))]
    reqs += [SampleRequest(s, f"g{i}", (), 10) for i, s in enumerate(sources)]
    fast = fwd.sample(reqs, topk=10, seed=7)
    try:
        fwd.fast_decoder = False
        reference = fwd.sample(reqs, topk=10, seed=7)
    finally:
        fwd.fast_decoder = True
    assert [[h.token_ids for h in hs] for hs in fast] == [[h.token_ids for h in hs] for hs in reference]
    for hs, rs in zip(fast, reference):
        for h, r in zip(hs, rs):
            assert h.nll == pytest.approx(r.nll, abs=1e-4)


def test_unsupported_configuration_falls_back_to_fairseq(fwd):
    assert unsupported_reason(fwd.model.decoder) is None
    model = copy.deepcopy(fwd.model)
    model.decoder.layers[0].attn_ln = torch.nn.LayerNorm(8)          # a NormFormer option
    assert "attn_ln" in unsupported_reason(model.decoder)
    src = torch.tensor([[5, 6, fwd.eos]])
    enc = model.encoder.forward_torchscript({"src_tokens": src, "src_lengths": torch.tensor([3])})
    assert isinstance(prefix_decoder(model, enc, 10), FairseqPrefixDecoder)
    assert isinstance(prefix_decoder(fwd.model, enc, 10), PrefixDecoder)

