"""Linear layers through oneDNN with prepacked weights, on the CPU.

PyTorch's fp32 ``F.linear`` goes through MKL, which on AMD CPUs runs at a fraction of the AVX-512
rate; oneDNN dispatches on the CPU's instruction set. On this machine's EPYC the NMT models'
products run faster through oneDNN (`python bench/bench_generation.py`, "matrix products": the
output projection 1.5-2.6x, the small feed-forward products 0.8-1.2x).
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F


def _onednn_pack(weight: torch.Tensor):
    """The weight prepacked for oneDNN's matrix product, or None where that is not available."""
    if weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16):
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight, None)
    except (AttributeError, RuntimeError):                 # a torch build without oneDNN
        return None


class Linear:
    """``x @ W.T + b`` (optionally then ReLU) with the weight prepacked for oneDNN on the CPU.
    The packed path is checked against ``F.linear`` once; any difference beyond rounding, or a
    build without the op, falls back to ``F.linear``."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool = False):
        self.weight, self.bias, self.relu = weight, bias, relu
        self.packed = _onednn_pack(weight)
        if self.packed is not None:
            probe = torch.randn(3, weight.shape[1], generator=torch.Generator().manual_seed(0)).to(weight.dtype)
            try:
                ok = torch.allclose(self._onednn(probe).float(), self._reference(probe).float(),
                                    atol=1e-2 if weight.dtype == torch.bfloat16 else 1e-4, rtol=1e-3)
            except RuntimeError:
                ok = False
            if not ok:
                self.packed = None

    def _onednn(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "relu" if self.relu else "none", [], "")

    def _reference(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        return F.relu(y) if self.relu else y

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            if self.relu and self.bias is not None:
                # The product and its ReLU in one kernel where the library fuses them (cuBLASLt's
                # epilogue on a GPU): one launch fewer a feed-forward layer and step.
                flat = x.reshape(-1, x.shape[-1])
                return torch._addmm_activation(self.bias, flat, self.weight.t()).reshape(*x.shape[:-1], -1)
            return self._reference(x)
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        return self._onednn(flat).reshape(*x.shape[:-1], -1)

    def __deepcopy__(self, memo):
        # The packed weight is an opaque oneDNN tensor that cannot be copied: pack the copy anew.
        return Linear(copy.deepcopy(self.weight, memo), copy.deepcopy(self.bias, memo), self.relu)


def linear_of(module: torch.nn.Linear) -> Linear:
    """The module's packed product: the one :func:`pack_linears` installed, else a new one."""
    installed = module.__dict__.get("forward")
    return installed if isinstance(installed, Linear) else Linear(module.weight, module.bias)


def pack_linears(model: torch.nn.Module) -> int:
    """Route every ``nn.Linear`` of a CPU model through :class:`Linear` (its forward, in place);
    returns how many were packed. For inference: the packed weights are a snapshot, so the
    weights must not change afterwards. Modules that read a weight directly (e.g. fairseq's fused
    attention path in training-style full forwards) keep using ``F.linear`` there."""
    packed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and not isinstance(module.__dict__.get("forward"), Linear):
            lin = linear_of(module)
            if lin.packed is not None:
                module.forward = lin
                packed += 1
    return packed
