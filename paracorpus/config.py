"""Generation settings and the paper presets.

``parabank2`` follows Hu et al. 2019 (S=5 constraint sets x N=30 top-k samples, k=10; dual score
threshold 3.5; 7+1 clusters; top 5 kept). ``parabank2-cpu`` keeps every mechanism but samples
fewer candidates (S=3, N=10) so a 2-core machine finishes in minutes. ``paranmt`` follows
Wieting & Gimpel 2018 (beam 12, 1-best, no constraints, no clustering). ``wieting2017`` is the
2017 paper's beam 50 with k-best candidates, clustered for diversity.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass

MODES = ("sample", "beam")


@dataclass(frozen=True)
class GenerationConfig:
    mode: str = "sample"
    num_sets: int = 5                 # S: constraint sets per pair
    num_samples: int = 30             # N: top-k samples per set
    topk: int = 10
    max_banned_words: int = 3         # words per constraint set
    beam: int = 12
    nbest: int = 1
    clusters: int = 7                 # k free clusters (+1 reference cluster)
    keep: int = 5                     # n paraphrases kept per pair
    score_threshold: float | None = 3.5      # drop candidates whose combined score is above
    dual_xent_threshold: float | None = None  # optional pair filter before generation
    seed: int = 1
    batch_pairs: int = 64             # pairs per decoding call: larger batches decode faster
    num_output_shards: int = 8
    # Pieces per side: cleaning bounds characters and whitespace tokens, but one 19 KB "word" of
    # random letters is ~9,000 pieces, which costs gigabytes in attention; such pairs are rejected.
    max_pieces: int = 250

    def __post_init__(self):
        errors = []
        if self.mode not in MODES:
            errors.append(f"mode must be one of {MODES}, not {self.mode!r}")
        for name in ("num_sets", "num_samples", "topk", "beam", "nbest", "clusters", "keep",
                     "batch_pairs", "num_output_shards", "max_banned_words", "max_pieces"):
            if getattr(self, name) < 1:
                errors.append(f"{name} must be >= 1 (got {getattr(self, name)})")
        for name in ("score_threshold", "dual_xent_threshold"):
            value = getattr(self, name)
            if value is not None and math.isnan(value):
                errors.append(f"{name} must be a number (negative: off), not nan")
        if self.nbest > self.beam:
            errors.append(f"nbest ({self.nbest}) cannot exceed beam ({self.beam})")
        if errors:
            raise ValueError("invalid generation config: " + "; ".join(errors))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


PRESETS: dict[str, GenerationConfig] = {
    "parabank2": GenerationConfig(mode="sample", num_sets=5, num_samples=30, topk=10, clusters=7,
                                  keep=5, score_threshold=3.5, dual_xent_threshold=3.5),
    "parabank2-cpu": GenerationConfig(mode="sample", num_sets=3, num_samples=10, topk=10, clusters=7,
                                      keep=5, score_threshold=3.5, dual_xent_threshold=3.5),
    "paranmt": GenerationConfig(mode="beam", beam=12, nbest=1, score_threshold=None),
    "wieting2017": GenerationConfig(mode="beam", beam=50, nbest=10, keep=5, score_threshold=None),
}


def config_hash(cfg: GenerationConfig, extra: dict) -> str:
    """Hash of everything that decides the output rows: settings and model fingerprints."""
    payload = json.dumps({"config": cfg.to_dict(), **extra}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
