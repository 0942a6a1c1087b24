"""models/nmt/decoding/onednn.py: oneDNN products with prepacked weights give F.linear's results."""
import copy

import torch

from models.nmt.decoding.onednn import Linear, pack_linears


def test_packed_linear_equals_f_linear():
    gen = torch.Generator().manual_seed(1)
    weight, bias = torch.randn(40, 16, generator=gen), torch.randn(40, generator=gen)
    x = torch.randn(7, 3, 16, generator=gen)
    for relu in (False, True):
        want = torch.nn.functional.linear(x, weight, bias)
        want = want.relu() if relu else want
        lin = Linear(weight, bias, relu=relu)
        assert lin.packed is not None, "this torch build has oneDNN"
        torch.testing.assert_close(lin(x), want, atol=1e-5, rtol=1e-5)
        assert bool((lin(x) >= 0).all()) if relu else bool((lin(x) < 0).any())
    assert Linear(weight, None)(x).shape == (7, 3, 40)
    # A non-contiguous input (fairseq passes transposed activations) gives the same numbers.
    xt = torch.randn(3, 7, 16, generator=gen).transpose(0, 1)
    torch.testing.assert_close(Linear(weight, bias)(xt), torch.nn.functional.linear(xt, weight, bias))


def test_unpacked_linear_with_relu_equals_f_linear():
    """Where oneDNN does not take the weight (a GPU, or here float64) the product and its ReLU
    run as one fused op: the same numbers as F.linear then ReLU."""
    gen = torch.Generator().manual_seed(2)
    weight, bias = torch.randn(40, 16, generator=gen).double(), torch.randn(40, generator=gen).double()
    x = torch.randn(7, 3, 16, generator=gen).double()
    for relu in (False, True):
        lin = Linear(weight, bias, relu=relu)
        assert lin.packed is None
        want = torch.nn.functional.linear(x, weight, bias)
        torch.testing.assert_close(lin(x), want.relu() if relu else want)
        assert lin(x).shape == (7, 3, 40)
    assert bool((want < 0).any()), "the ReLU had something to do"


def test_pack_linears_keeps_outputs_and_survives_deepcopy():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).eval()
    x = torch.randn(5, 16)
    with torch.inference_mode():
        want = model(x)
        assert pack_linears(model) == 2
        assert pack_linears(model) == 0                       # already packed: not wrapped twice
        torch.testing.assert_close(model(x), want, atol=1e-5, rtol=1e-5)
        twin = copy.deepcopy(model)
        torch.testing.assert_close(twin(x), want, atol=1e-5, rtol=1e-5)
        # The copy has its own parameters: changing its bias changes only the copy's outputs.
        twin[2].bias.add_(1.0)
        torch.testing.assert_close(twin(x), want + 1.0, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model(x), want, atol=1e-5, rtol=1e-5)
