"""Margin loss with hardest in-batch negatives (Wieting & Gimpel 2018, ParaNMT §5).

For a batch of n pairs (s1_i, s2_i) the pool is all 2n sentences. The negative of s1_i is the pool
sentence most similar to s1_i other than s1_i and s2_i (and likewise for s2_i). Mega-batching
mines over M mini-batches at once (pool 2Mn) for harder negatives; M=1 is plain in-batch mining.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def hardest_negatives(e1: torch.Tensor, e2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices into the pool cat([e1, e2]) (size 2n) of the negative for each s1_i and each s2_i.

    One (2n x 2n) cosine matrix product and a masked argmax; the mask removes each sentence's own
    pair (both halves)."""
    n = e1.size(0)
    if n < 2:
        raise ValueError("negative mining needs at least 2 pairs in a batch")
    pool = F.normalize(torch.cat([e1, e2]).float(), dim=-1)
    sims = pool @ pool.T
    pair = torch.arange(2 * n, device=pool.device) % n
    sims.masked_fill_(pair[:, None] == pair[None, :], float("-inf"))
    best = sims.argmax(dim=1)
    return best[:n], best[n:]


def margin_loss(s1: torch.Tensor, s2: torch.Tensor, n1: torch.Tensor, n2: torch.Tensor,
                delta: float = 0.4) -> torch.Tensor:
    """mean_i [max(0, δ - cos(s1,s2) + cos(s1,n1)) + max(0, δ - cos(s1,s2) + cos(s2,n2))]."""
    pos = F.cosine_similarity(s1, s2, dim=-1)
    return (F.relu(delta - pos + F.cosine_similarity(s1, n1, dim=-1))
            + F.relu(delta - pos + F.cosine_similarity(s2, n2, dim=-1))).mean()
