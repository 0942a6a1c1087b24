"""An ensemble's members combined as fairseq's ``EnsembleModel`` and ``SequenceScorer`` combine them:
at every position, the log of the mean of the members' probabilities (``logsumexp`` of their
log-probabilities minus ``log M``), not the mean of their log-probabilities."""
from __future__ import annotations

import math

import torch


def mean_probability(log_probs: torch.Tensor) -> torch.Tensor:
    """log of the mean of the members' probabilities (dimension 0 holds the members)."""
    return torch.logsumexp(log_probs, dim=0) - math.log(log_probs.shape[0])


class EnsembleDecoder:
    """The prefix decoders (models/nmt/decoding/prefix_decoder.py) of an ensemble's members driven together:
    one tree of nodes, each member's state reordered alike, next-token log-probabilities combined.
    Features are one tensor per member (their sizes may differ); `log_probs` takes a row slice."""

    def __init__(self, decoders: list):
        self.decoders = decoders

    def step(self, prefixes: torch.Tensor) -> "Features":
        return Features([d.step(prefixes) for d in self.decoders])

    def reorder(self, parent: torch.Tensor, width: int | None = None) -> None:
        for d in self.decoders:
            d.reorder(parent, width)

    def log_probs(self, features: "Features", part: slice) -> torch.Tensor:
        members = [torch.log_softmax(d.logits(f[part]).float(), dim=-1) for d, f in zip(self.decoders, features.parts)]
        return members[0] if len(members) == 1 else mean_probability(torch.stack(members))


class Features:
    """Each member's decoder features of the same nodes; len() and shape[0] are the nodes."""

    def __init__(self, parts: list):
        self.parts = parts
        self.shape, self.device = parts[0].shape, parts[0].device

    def __len__(self):
        return self.shape[0]


__all__ = ["EnsembleDecoder", "Features", "mean_probability"]
