"""Exact row-wise top-k over a large vocabulary, faster than ``torch.topk`` on the CPU for small k.

``torch.topk`` over 8,000 columns costs about as much as the log-softmax before it. Cutting each row into blocks, the k blocks with the largest maxima
contain the row's top k: those k maxima are k values at least as large as the k-th largest block
maximum, so the row's k-th largest value is too, and every value that large lies in a block whose
maximum is that large. One max-reduction over the row, a top-k over the block maxima and a top-k
over the k chosen blocks replace the full top-k (``python bench/bench_generation.py``, section
"Top-k", measures it). Values and their order are exactly
``torch.topk``'s; only the indices of tied values may differ.
"""
from __future__ import annotations

import torch

BLOCK = 100


def block_size(width: int, target: int = BLOCK) -> int:
    """A block size near `target` that divides `width` if there is one (no short last block to
    handle: e.g. 8,008 = 77 x 104)."""
    for delta in range(target // 2):
        for size in (target - delta, target + delta):
            if width % size == 0:
                return size
    return target


def topk_rows(x: torch.Tensor, k: int, block: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of the k largest values of each row of a 2-D tensor, largest first."""
    _, v = x.shape
    block = block or block_size(v)
    full = v // block
    # Worth it only when the chosen blocks are a small part of the row.
    if x.device.type != "cpu" or 4 * k * block > v:
        return x.topk(k, dim=-1)
    maxima = x[:, :full * block].unflatten(1, (full, block)).amax(-1)
    tail = v - full * block
    if tail:                                  # the last, shorter block
        maxima = torch.cat([maxima, x[:, full * block:].amax(-1, keepdim=True)], 1)
    blocks = maxima.topk(k, dim=-1, sorted=False).indices
    cols = (blocks[..., None] * block + torch.arange(block, device=x.device)).flatten(1)
    if tail:
        beyond = cols >= v                    # columns of the short block past the row's end
        cand = x.gather(1, cols.clamp(max=v - 1)).masked_fill_(beyond, float("-inf"))
    else:
        cand = x.gather(1, cols)
    vals, at = cand.topk(k, dim=-1)
    return vals, cols.gather(1, at)
