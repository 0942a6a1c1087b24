"""Banned phrases of a sampling batch as device tensors, matched against every row once per step.

Each request (one constraint set) bans a list of target-token phrases (Translator.banned_phrases).
A one-piece phrase bans its token at every step; a longer phrase bans its last token whenever the
row ends with the rest of the phrase, so it can never be completed. The tables are built once per
batch on the host and sent in one transfer each; a step then finds every row's banned tokens with
tensor operations (a padded table of phrase prefixes compared with each row's last tokens), with
no per-row or per-phrase work on the host and no host round trip.

    single  (requests, S)     one-piece phrases, -1 padding
    prefix  (requests, M, L)  longer phrases without their last token, right-aligned; -1 left of a
                              shorter prefix is a wildcard, an unused slot is all NEVER
    last    (requests, M)     their last tokens, -1 for an unused slot
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

NEVER = -3          # matches no token (tokens are >= 0; the sampler pads its token table with -2)


@dataclass
class BanTable:
    single: torch.Tensor
    prefix: torch.Tensor
    last: torch.Tensor

    @property
    def prefix_len(self) -> int:
        """L: tokens a row's window must hold (0 when no phrase has more than one piece)."""
        return self.prefix.shape[2] if self.last.shape[1] else 0

    @property
    def width(self) -> int:
        """Most phrases one request has (an upper bound on a row's bans at a step)."""
        return self.single.shape[1] + self.last.shape[1]

    @classmethod
    def build(cls, phrases_per_request: list[list[tuple[int, ...]]], device) -> "BanTable":
        """The tables of a batch; PHRASES_PER_REQUEST[i] is request i's phrases (token-id tuples)."""
        singles = [[p[0] for p in phrases if len(p) == 1] for phrases in phrases_per_request]
        multis = [[p for p in phrases if len(p) > 1] for phrases in phrases_per_request]
        n = len(phrases_per_request)
        s_max = max((len(x) for x in singles), default=0)
        m_max = max((len(x) for x in multis), default=0)
        l_max = max((len(p) - 1 for x in multis for p in x), default=0)
        single = np.full((n, s_max), -1, dtype=np.int64)
        prefix = np.full((n, m_max, max(l_max, 1)), NEVER, dtype=np.int64)
        last = np.full((n, m_max), -1, dtype=np.int64)
        for i, (ones, longer) in enumerate(zip(singles, multis)):
            single[i, :len(ones)] = ones
            for j, p in enumerate(longer):
                prefix[i, j, :l_max - len(p) + 1] = -1
                prefix[i, j, l_max - len(p) + 1:] = p[:-1]
                last[i, j] = p[-1]
        move = lambda a: torch.from_numpy(a).to(device)    # noqa: E731
        return cls(move(single), move(prefix), move(last))

    def banned(self, requests: torch.Tensor, window: torch.Tensor | None) -> torch.Tensor:
        """(rows, S + M) tokens each row may not write next, -1 where none: REQUESTS is each row's
        request index, WINDOW (rows, L) its last L tokens (None before the first token is written:
        only one-piece phrases apply)."""
        single = self.single.index_select(0, requests)
        if window is None or not self.prefix_len:
            return single
        prefix = self.prefix.index_select(0, requests)                 # (rows, M, L)
        ends_with = ((prefix == -1) | (prefix == window[:, None, :])).all(-1)
        multi = torch.where(ends_with, self.last.index_select(0, requests), -1)
        return torch.cat([single, multi], dim=1)


def compact(banned: torch.Tensor, width: int) -> torch.Tensor:
    """BANNED (rows, B) with each row's bans moved left and only WIDTH columns kept (WIDTH at
    least the most bans any row has): later comparisons scale with WIDTH, not B."""
    if width >= banned.shape[1]:
        return banned
    return banned.sort(dim=1, descending=True).values[:, :width]


__all__ = ["BanTable", "compact"]
