"""models/nmt/decoding/topk.py: the blocked top-k gives torch.topk's values and indices."""
import pytest
import torch

from models.nmt.decoding.topk import block_size, topk_rows


@pytest.mark.parametrize("width", [8008, 8000, 8011, 3000])
@pytest.mark.parametrize("k", [1, 10, 17])
def test_same_as_torch_topk(width, k):
    gen = torch.Generator().manual_seed(width + k)
    x = torch.log_softmax(torch.randn(37, width, generator=gen) * 4, dim=-1)
    x[:, :3] = float("-inf")                                   # masked tokens, as the sampler's
    x[5, 1000:1400] += 30.0                                    # one row's top k all in one stretch
    x[6] = float("-inf")
    x[6, width - 1] = -0.5                                     # only the last column is possible
    vals, idx = topk_rows(x, k)
    want_vals, want_idx = x.topk(k, dim=-1)
    assert torch.equal(vals, want_vals)
    finite = torch.isfinite(want_vals)                         # indices of -inf ties are arbitrary
    assert torch.equal(idx[finite], want_idx[finite])
    assert torch.equal(x.gather(1, idx), vals)                 # every index points at its value


def test_block_size_divides_when_it_can():
    assert 8008 % block_size(8008) == 0
    assert block_size(8008) != 8008
    assert block_size(30011) > 1                               # a prime: short last block instead


def test_small_rows_use_torch_topk():
    x = torch.randn(4, 50)
    assert torch.equal(topk_rows(x, 5)[1], x.topk(5)[1])
