"""A detector's sizes and training settings (DivergenceConfig), saved with it in config.json and
checked when it is made or read back (validate)."""
from __future__ import annotations

from dataclasses import dataclass

from models.bitext.divergence.lexicon import ALIGNERS, MAX_TOKENS

MAX_MEMBERS = 16            # an ensemble's detectors (each one a training and a pass when scoring)
MAX_PARTIAL_NEGATIVES = 10   # partial divergences made of each positive


@dataclass
class DivergenceConfig:
    """Model sizes and training settings (saved with the model)."""
    src_lang: str = "en"
    tgt_lang: str = "fr"
    dim: int = 200
    hidden: int = 64                      # larger models fit the synthetic data better, not the
    channels: tuple = (16, 32, 64, 64)    # development sets, and are slower
    dense: int = 128
    focus_weight: float = 0.1
    dropout: float = 0.1
    max_tokens: int = MAX_TOKENS          # per side when scoring
    max_train_tokens: int = 50            # positives longer than this (either side) are not trained on
    embeddings: str = "svd"               # svd (alignment counts) | random (learned end to end)
    freeze_embeddings: bool = True       # svd vectors stay fixed (fine-tuning them did worse on dev data)
    aligner: str = "fast_align"           # word alignments: fast_align | agreement (deterministic) | eflomal
    min_count: int = 1                    # dictionary: times a word pair must be aligned
    negatives_per_positive: int = 5
    partial_negatives: int = 1            # partial divergences of each positive (partial_divergence):
                                          # commoncrawl F1 76.8 -> 80.6 over 5 seeds (docs/benchmarks.md)
    max_length_ratio: float = 2.0
    min_coverage: float = 0.5
    max_tries: int = 200
    members: int = 2                      # detectors trained from seeds seed, seed + 1000, ...; P averaged
                                          # (2: commoncrawl F1 >= 80 in 5 seeds of 5, 1: in 2; docs/benchmarks.md)
    epochs: int = 2
    average_epochs: int = 1               # the weights kept: their mean over every step of the last N epochs
                                          # (stochastic weight averaging); 0 = the last step's (docs/benchmarks.md)
    batch_size: int = 32
    lr: float = 1e-3
    seed: int = 1
    device: str | None = None
    progress: bool = True

    def validate(self) -> None:
        for name in ("dim", "hidden", "dense", "max_tokens", "max_train_tokens", "epochs", "batch_size", "min_count"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 1 <= self.members <= MAX_MEMBERS:
            raise ValueError(f"members must be between 1 and {MAX_MEMBERS}, got {self.members}")
        if not self.channels or any(int(c) < 1 for c in self.channels):
            raise ValueError(f"channels must be positive integers, got {self.channels}")
        if self.aligner not in ALIGNERS:
            raise ValueError(f"aligner must be one of {', '.join(ALIGNERS)}, not {self.aligner!r}")
        if self.embeddings not in ("svd", "random"):
            raise ValueError(f"embeddings must be svd or random, got {self.embeddings!r}")
        if self.embeddings == "random" and self.freeze_embeddings:
            raise ValueError("random embeddings must be trained: freeze_embeddings needs embeddings=svd")
        if not (0 <= self.focus_weight <= 1 and 0 <= self.dropout < 1 and 0 <= self.min_coverage <= 1):
            raise ValueError("focus_weight and min_coverage must be in [0, 1], dropout in [0, 1)")
        if not (self.lr > 0 and self.max_length_ratio >= 1 and self.negatives_per_positive >= 1):
            raise ValueError("lr must be > 0, max_length_ratio >= 1, negatives_per_positive >= 1")
        if not 0 <= self.average_epochs <= self.epochs:
            raise ValueError(f"average_epochs must be between 0 and epochs ({self.epochs}), got {self.average_epochs}")
        if not 0 <= self.partial_negatives <= MAX_PARTIAL_NEGATIVES:
            raise ValueError(f"partial_negatives must be between 0 and {MAX_PARTIAL_NEGATIVES}, "
                             f"got {self.partial_negatives}")
