"""Banned phrases of a sampling batch as device tensors: each row's banned tokens, found a step at a
time from a small state the row carries, without per-row or per-phrase work on the host and with no
host round trip.

Each request (one constraint set) bans a list of target-token phrases (Translator.banned_phrases).
A one-piece phrase bans its token at every step; a longer phrase bans its last token whenever the
row ends with the rest of the phrase (its prefix), so it can never be completed.

The prefixes of each request form a trie (request i's root is node i + 1; every node a prefix of
a prefix, every complete prefix emitting its phrases' last tokens). A row's state holds, for each d = 1..L
(L the longest prefix), the trie node its last d tokens lead to from its request's root, or DEAD
when they lead nowhere: writing a token moves every column one deeper (a sorted-key lookup of the
(node, token) edge) and restarts column 0 at the root. The row's banned tokens are then what its
L nodes emit. A step costs (rows x L) lookups, whatever the number of phrases: the earlier padded
table compared every row with every phrase of its request, (rows x 165 x 13) values a step with
ParaBank 2's constraint sets (docs/benchmarks.md, "Constrained sampling on a CPU").

    single      (requests, S)   one-piece phrases, -1 padding
    edge_key    (edges,)        parent * vocab + token, sorted (searchsorted finds a child)
    edge_child  (edges,)        the child of each edge
    emits       (nodes, E)      last tokens a node's complete prefix bans, -1 padding
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

DEAD = 0            # the node of a suffix that is no prefix: no edges, emits nothing


@dataclass
class BanTable:
    single: torch.Tensor
    edge_key: torch.Tensor
    edge_child: torch.Tensor
    emits: torch.Tensor
    depth: int          # L: the longest prefix (0 when no phrase has more than one piece)
    vocab: int

    @property
    def width(self) -> int:
        """Columns of banned(): an upper bound on a row's bans at a step."""
        return self.single.shape[1] + self.depth * self.emits.shape[1]

    @classmethod
    def build(cls, phrases_per_request: list[list[tuple[int, ...]]], vocab: int, device) -> "BanTable":
        """The tables of a batch; PHRASES_PER_REQUEST[i] is request i's phrases (token-id tuples
        below VOCAB)."""
        return cls.from_packs([[PhrasePack.of(phrases)] for phrases in phrases_per_request], vocab, device)

    @classmethod
    def from_packs(cls, packs_per_request: list[list["PhrasePack"]], vocab: int, device) -> "BanTable":
        """The tables of a batch whose request i bans the phrases of PACKS_PER_REQUEST[i] (each
        word's phrases packed once, Translator.banned_packs): the host work is numpy over whole
        arrays, with one Python step per (request, word), not per phrase or token (102,000
        phrases of 2,000 requests: docs/benchmarks.md, "Constrained sampling on a CPU")."""
        n = len(packs_per_request)
        owner = [i for i, packs in enumerate(packs_per_request) for _ in packs]
        packs = [p for ps in packs_per_request for p in ps]
        ones = _cat([p.single for p in packs])
        length = _cat([p.lengths for p in packs])
        flat = _cat([p.flat for p in packs])
        for tokens in (ones, flat):
            if len(tokens) and not 0 <= tokens.min() <= tokens.max() < vocab:      # keys would collide
                raise ValueError(f"banned phrase tokens must lie in [0, {vocab})")
        # One-piece phrases: each request's distinct tokens, left-aligned in its row.
        one_key = np.unique(np.repeat(owner, [len(p.single) for p in packs]).astype(np.int64) * vocab + ones)
        one_req, one_token = one_key // vocab, one_key % vocab
        column = np.arange(len(one_key)) - np.searchsorted(one_req, one_req)
        single = np.full((n, int(column.max()) + 1 if len(column) else 0), -1, dtype=np.int64)
        single[one_req, column] = one_token
        # The multi-piece phrases as a padded array, one row each, with its request's root.
        depth = int(length.max()) - 1 if len(length) else 0
        padded = np.full((len(length), depth + 1), -1, dtype=np.int64)
        padded[np.arange(depth + 1) < length[:, None]] = flat
        node = np.repeat(owner, [len(p.lengths) for p in packs]).astype(np.int64) + 1
        # Trie nodes a depth at a time: the distinct (parent node, token) edges of the phrases still
        # that long get the next node ids (DEAD is 0, the roots 1..n), in key order: sorted edges.
        keys, children, next_node = [], [], n + 1
        for d in range(depth):
            longer = length - 1 > d
            key = node[longer] * vocab + padded[longer, d]
            unique, inverse = np.unique(key, return_inverse=True)
            node[longer] = next_node + inverse
            keys.append(unique)
            children.append(np.arange(next_node, next_node + len(unique)))
            next_node += len(unique)
        edge_key = np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64)
        order = np.argsort(edge_key, kind="stable")
        edge_child = (np.concatenate(children) if children else np.zeros(0, dtype=np.int64))[order]
        # A node's complete prefix bans its phrases' last tokens: one column each.
        emit_key = np.unique(node * vocab + padded[np.arange(len(length)), length - 1])   # by node, then token
        emit_node, emit_token = emit_key // vocab, emit_key % vocab
        column = np.arange(len(emit_key)) - np.searchsorted(emit_node, emit_node)
        emits = np.full((next_node, int(column.max()) + 1 if len(column) else 0), -1, dtype=np.int64)
        emits[emit_node, column] = emit_token
        move = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)    # noqa: E731
        return cls(move(single), move(edge_key[order]), move(edge_child), move(emits), depth, vocab)

    def start(self, rows: int, device) -> torch.Tensor | None:
        """The state of ROWS rows before their first token (every column DEAD); None without
        multi-piece phrases."""
        return torch.full((rows, self.depth), DEAD, dtype=torch.long, device=device) if self.depth else None

    def advance(self, state: torch.Tensor | None, requests: torch.Tensor, token: torch.Tensor):
        """STATE after each row (of request REQUESTS) writes TOKEN."""
        if state is None:
            return None
        # Column d of the new state extends column d - 1 of the old; column 0 starts at the root.
        parent = torch.cat([(requests + 1)[:, None], state[:, :-1]], dim=1)
        key = parent * self.vocab + token[:, None]
        at = torch.searchsorted(self.edge_key, key).clamp_(max=self.edge_key.numel() - 1)
        found = self.edge_key[at] == key
        return torch.where(found, self.edge_child[at], DEAD)

    def banned(self, requests: torch.Tensor, state: torch.Tensor | None) -> torch.Tensor:
        """(rows, width) tokens each row may not write next, -1 where none: REQUESTS is each row's
        request index, STATE its state (None: only one-piece phrases apply)."""
        single = self.single.index_select(0, requests)
        if state is None:
            return single
        multi = self.emits.index_select(0, state.reshape(-1)).view(state.shape[0], -1)
        return torch.cat([single, multi], dim=1)


@dataclass(frozen=True)
class PhrasePack:
    """Phrases (one word's, usually) as arrays: SINGLE the one-piece phrases' tokens; FLAT the
    multi-piece phrases' tokens end to end, LENGTHS their lengths."""
    single: np.ndarray
    flat: np.ndarray
    lengths: np.ndarray

    @classmethod
    def of(cls, phrases) -> "PhrasePack":
        multi = [p for p in phrases if len(p) > 1]
        return cls(np.array([p[0] for p in phrases if len(p) == 1], dtype=np.int64),
                   np.array([t for p in multi for t in p], dtype=np.int64),
                   np.array([len(p) for p in multi], dtype=np.int64))

    def __bool__(self) -> bool:
        return bool(len(self.single) or len(self.lengths))


def _cat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)


def compact(banned: torch.Tensor, width: int) -> torch.Tensor:
    """BANNED (rows, B) with each row's bans moved left and only WIDTH columns kept (WIDTH at
    least the most bans any row has): later comparisons scale with WIDTH, not B."""
    if width >= banned.shape[1]:
        return banned
    return banned.sort(dim=1, descending=True).values[:, :width]


__all__ = ["BanTable", "PhrasePack", "compact"]
