"""Sentence encoders of the ParaNMT papers as torch modules.

Every encoder maps a ``Features`` batch to a (batch, out_dim) tensor:

- WORD:    average of word embeddings.
- TRIGRAM: average of character-trigram embeddings (unknown words still get trigrams).
- LSTM:    average of the hidden states of an LSTM over word embeddings.
- BLSTM:   average of the forward and backward hidden states (concatenated).
- GRAN:    gated recurrent averaging network (Wieting & Gimpel 2017): average over t of
           a_t = x_t * sigmoid(W_x x_t + W_h h_t + b), h_t the LSTM state at t.

``Combined`` joins several of them by concatenation (the paper's best, WORD+TRIGRAM) or sum.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

KINDS = ("word", "trigram", "lstm", "blstm", "gran")


@dataclass
class Features:
    """Model input for B sentences. Every sentence has at least one word and one trigram
    (an empty sentence is one <unk>), so no average divides by zero."""
    word_ids: torch.Tensor       # (B, T) long, 0-padded
    lengths: torch.Tensor        # (B,) long, words per sentence
    trigram_ids: torch.Tensor    # (N,) long, all trigrams of the batch, sentence after sentence
    trigram_offsets: torch.Tensor  # (B,) long, start of each sentence in trigram_ids

    def to(self, device) -> "Features":
        return Features(self.word_ids.to(device), self.lengths.to(device), self.trigram_ids.to(device),
                        self.trigram_offsets.to(device))


def _masked_mean(states: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    mask = (torch.arange(states.size(1), device=states.device)[None, :] < lengths[:, None]).to(states.dtype)
    return (states * mask.unsqueeze(-1)).sum(1) / lengths.clamp(min=1).unsqueeze(-1).to(states.dtype)


def _embedding(n: int, dim: int) -> nn.Embedding:
    emb = nn.Embedding(n, dim, padding_idx=0)
    nn.init.uniform_(emb.weight, -0.1, 0.1)
    with torch.no_grad():
        emb.weight[0].zero_()
    return emb


class WordAverage(nn.Module):
    def __init__(self, n_words: int, dim: int):
        super().__init__()
        self.out_dim = dim
        self.bag = nn.EmbeddingBag(n_words, dim, mode="mean", padding_idx=0)  # padding left out of the mean
        nn.init.uniform_(self.bag.weight, -0.1, 0.1)

    def forward(self, f: Features) -> torch.Tensor:
        return self.bag(f.word_ids)


class TrigramAverage(nn.Module):
    def __init__(self, n_trigrams: int, dim: int):
        super().__init__()
        self.out_dim = dim
        self.bag = nn.EmbeddingBag(n_trigrams, dim, mode="mean")
        nn.init.uniform_(self.bag.weight, -0.1, 0.1)

    def forward(self, f: Features) -> torch.Tensor:
        return self.bag(f.trigram_ids, f.trigram_offsets)


class LSTMAverage(nn.Module):
    def __init__(self, n_words: int, dim: int, hidden: int, bidirectional: bool = False):
        super().__init__()
        self.emb = _embedding(n_words, dim)
        self.rnn = nn.LSTM(dim, hidden, batch_first=True, bidirectional=bidirectional)
        self.out_dim = hidden * (2 if bidirectional else 1)

    def states(self, f: Features) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.emb(f.word_ids)
        packed = pack_padded_sequence(x, f.lengths.cpu(), batch_first=True, enforce_sorted=False)
        h, _ = self.rnn(packed)
        h, _ = pad_packed_sequence(h, batch_first=True, total_length=x.size(1))
        return x, h

    def forward(self, f: Features) -> torch.Tensor:
        return _masked_mean(self.states(f)[1], f.lengths)


class GRAN(LSTMAverage):
    """The gate needs h_t and x_t of one size, so the LSTM's hidden size is the embedding size."""

    def __init__(self, n_words: int, dim: int):
        super().__init__(n_words, dim, dim)
        self.gate_x = nn.Linear(dim, dim, bias=True)   # carries b
        self.gate_h = nn.Linear(dim, dim, bias=False)
        self.out_dim = dim

    def forward(self, f: Features) -> torch.Tensor:
        x, h = self.states(f)
        a = x * torch.sigmoid(self.gate_x(x) + self.gate_h(h))
        return _masked_mean(a, f.lengths)


class Combined(nn.Module):
    def __init__(self, parts: list[nn.Module], combine: str = "concat"):
        super().__init__()
        if combine not in ("concat", "add"):
            raise ValueError(f"combine must be concat or add, got {combine!r}")
        dims = {p.out_dim for p in parts}
        if combine == "add" and len(dims) > 1:
            raise ValueError(f"adding encoders needs equal output sizes, got {sorted(dims)}")
        self.parts = nn.ModuleList(parts)
        self.combine = combine
        self.out_dim = sum(p.out_dim for p in parts) if combine == "concat" else parts[0].out_dim

    def forward(self, f: Features) -> torch.Tensor:
        outs = [p(f) for p in self.parts]
        return torch.cat(outs, dim=-1) if self.combine == "concat" else torch.stack(outs).sum(0)


def parse_spec(spec: str) -> tuple[list[str], str]:
    """'word', 'word+trigram' (concatenation), 'word+trigram:add' -> (kinds, combine)."""
    body, _, combine = spec.strip().lower().partition(":")
    kinds = [k.strip() for k in body.split("+") if k.strip()]
    combine = combine or "concat"
    bad = [k for k in kinds if k not in KINDS]
    if not kinds or bad:
        raise ValueError(f"unknown encoder {spec!r}: use one or more of {', '.join(KINDS)} joined by '+', "
                         "optionally ':add' or ':concat'")
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"encoder {spec!r} names a part twice")
    if combine not in ("concat", "add"):
        raise ValueError(f"unknown combination {combine!r} in {spec!r}: use concat or add")
    return kinds, combine


def build_module(spec: str, n_words: int, n_trigrams: int, dim: int, hidden: int | None = None) -> nn.Module:
    """The torch module for SPEC; DIM is the embedding size, HIDDEN the LSTM size (default DIM;
    BLSTM uses DIM/2 per direction by default so every part has DIM outputs)."""
    kinds, combine = parse_spec(spec)
    parts = []
    for k in kinds:
        if k == "word":
            parts.append(WordAverage(n_words, dim))
        elif k == "trigram":
            parts.append(TrigramAverage(n_trigrams, dim))
        elif k == "lstm":
            parts.append(LSTMAverage(n_words, dim, hidden or dim))
        elif k == "blstm":
            parts.append(LSTMAverage(n_words, dim, hidden or max(1, dim // 2), bidirectional=True))
        else:
            parts.append(GRAN(n_words, dim))
    return parts[0] if len(parts) == 1 else Combined(parts, combine)


def is_order_sensitive(spec: str) -> bool:
    """Scrambling only matters to recurrent encoders; averages ignore word order."""
    return any(k in ("lstm", "blstm", "gran") for k in parse_spec(spec)[0])
