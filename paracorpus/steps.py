"""The generation job's steps (the shape is common/steps.py), in the order a pair meets them:

    CleanStep         "clean"          normalise, check encodability and lengths (paracorpus/cleaning.py)
    (deduplication, a global grouping: transforms/cleaning.py)
    SimilarityStep    "bitext_filter"  bilingual-embedding cosine (or MLP probability) >= a minimum
    EquivalenceStep   "bitext_filter"  the divergence detector's P(equivalent) >= a minimum
    PieceLimitStep    "segment"        sentencepiece pieces per side <= what the models take
    DualXentStep      "dual_xent"      dual conditional cross-entropy <= a maximum (ParaBank 2)
    ParaphraseStep    "generate"       sample or beam-search, dual-score, cluster, select: the rows

Items are record dicts (cleaning) and CleanPairs (the rest). The steps after deduplication run
inside a work unit (paracorpus/units.py), built once per worker by :func:`decoding_steps`.
"""
from __future__ import annotations

import math

from dataclasses import dataclass

import numpy as np

from common.steps import Rejected, Rule, ScoringStep, Step, StepResult
from paracorpus.cleaning import CleaningConfig, CleanPair, Rejection, clean_pair
from paracorpus.config import GenerationConfig
from paracorpus.paraphrasing import paraphrase_batch, timed


class _Timed:
    """A step whose apply() adds its wall time to the counter ms_<NAME> (paraphrasing.timed)."""

    def apply(self, items: list) -> StepResult:
        spent: dict = {}
        with timed(spent, self.NAME):
            out = super().apply(items)
        out.counters.update(spent)
        return out


class CleanStep(Step):
    """Record dicts in, cleaned record dicts (source and reference rewritten) out."""
    NAME = "clean"

    def __init__(self, cfg: CleaningConfig):
        super().__init__()
        self.cfg = cfg

    def apply(self, items: list) -> StepResult:
        out = StepResult()
        for rec in items:
            cleaned = clean_pair(rec["source"], rec["reference"], self.cfg)
            if isinstance(cleaned, Rejection):
                out.rejects.append(Rejected(rec, self.NAME, cleaned.reason, cleaned.detail))
            else:
                out.kept.append({**rec, "source": cleaned[0], "reference": cleaned[1]})
        return out


# ---------------------------------------------------------------------------- the bitext filter
@dataclass(frozen=True)
class BitextFilterConfig:
    """The generation job's bitext filter: which models, which thresholds (what the config hash
    covers, with the models' fingerprints)."""
    encoder: str | None = None             # bilingual encoder directory
    mlp: str | None = None                 # its MLP pair classifier (scores become probabilities)
    min_similarity: float | None = None    # reject below this cosine / probability
    divergence: str | None = None          # divergence detector directory
    min_equivalence: float | None = None   # reject below this P(equivalent); None: the model's threshold

    @property
    def enabled(self) -> bool:
        return bool(self.encoder or self.divergence)

    def check(self) -> None:
        if self.mlp and not self.encoder:
            raise ValueError("--bitext_mlp needs --bitext_encoder (the MLP scores the encoder's embeddings)")
        if self.encoder and self.min_similarity is None:
            raise ValueError("--bitext_encoder needs --bitext_min_similarity (the cosine, or with --bitext_mlp "
                             "the probability, below which a pair is rejected)")
        if self.min_similarity is not None and not math.isfinite(self.min_similarity):
            raise ValueError(f"--bitext_min_similarity must be a number, not {self.min_similarity}")
        if self.min_similarity is not None and not self.encoder:
            raise ValueError("--bitext_min_similarity needs --bitext_encoder")
        if self.min_equivalence is not None and not self.divergence:
            raise ValueError("--min_equivalence needs --divergence_model")
        if self.min_equivalence is not None and not 0.0 <= self.min_equivalence <= 1.0:
            raise ValueError(f"--min_equivalence is a probability: between 0 and 1, not {self.min_equivalence}")


class _BitextStep(_Timed, ScoringStep):
    """Scores (source, reference) with a models.bitext.scoring scorer; LANGS: the languages of
    the two sides, in that order (the scorer may have been trained the other way round)."""
    NAME = "bitext_filter"

    def __init__(self, scorer, langs: tuple[str, str], minimum: float):
        super().__init__([Rule(next(iter(self.SCORES)), "high", min=minimum)])
        self.scorer, self.langs = scorer, langs

    def score(self, batch):
        values = self.scorer.score([p.source for p in batch], [p.reference for p in batch], *self.langs)
        return {next(iter(self.SCORES)): np.asarray(values, dtype=np.float64)}


class SimilarityStep(_BitextStep):
    SCORES = {"bitext_similarity": "high"}

    def detail(self, score, op, value, bound):
        return f"{self.scorer.method} {value:.4f} {op} {bound:g}"


class EquivalenceStep(_BitextStep):
    SCORES = {"equivalence": "high"}
    REASONS = {"equivalence": "divergent"}

    def detail(self, score, op, value, bound):
        return f"P(equivalent) {value:.4f} {op} {bound:.4f}"


def bitext_steps(cfg: BitextFilterConfig, langs: tuple[str, str], device: str | None = None,
                 sha256: dict | None = None) -> list[Step]:
    """The bitext filter's steps with their models loaded: similarity first, then (on what it
    kept) equivalence. SHA256 ({"bitext_encoder" | "bitext_mlp" | "divergence": {file: sha256}},
    what the driver recorded in the run's manifest) makes every file be checked before it is
    loaded, as the NMT models are."""
    from models.bitext.scoring import EquivalenceScorer, SimilarityScorer
    from models.safety import verified_model_dir

    def local(path, name):
        return verified_model_dir(path, sha256[name]) if path and sha256 and name in sha256 else path

    steps: list[Step] = []
    if cfg.encoder:
        scorer = SimilarityScorer(local(cfg.encoder, "bitext_encoder"), local(cfg.mlp, "bitext_mlp"), device)
        scorer.orient([], [], *langs)            # a language the model does not know fails here, not mid-run
        steps.append(SimilarityStep(scorer, langs, cfg.min_similarity))
    if cfg.divergence:
        scorer = EquivalenceScorer(local(cfg.divergence, "divergence"), device)
        scorer.orient([], [], *langs)
        minimum = cfg.min_equivalence if cfg.min_equivalence is not None else scorer.threshold
        steps.append(EquivalenceStep(scorer, langs, minimum))
    return steps


# ---------------------------------------------------------------------------- decoding
class PieceLimitStep(_Timed, ScoringStep):
    """Pieces per side as the models see them: the source is read by the forward model and
    written by the backward one, the reference the other way round, and the two models may
    segment differently (each has its own tokenization), so a side's count is the largest of
    the models'. LIMITS (source, reference) from paracorpus.paraphrasing.piece_limits."""
    NAME = "segment"
    SCORES = {"source_pieces": "low", "reference_pieces": "low"}
    REASONS = {"source_pieces": "too_many_pieces_src", "reference_pieces": "too_many_pieces_tgt"}

    def __init__(self, forward, limits: tuple[int, int], backward=None):
        super().__init__([Rule("source_pieces", "low", max=limits[0]), Rule("reference_pieces", "low", max=limits[1])])
        self.forward, self.backward = forward, backward

    def _count(self, text: str, side: str) -> int:
        counts = [len(self.forward.source_pieces(text) if side == "src" else self.forward.target_pieces(text))]
        if self.backward is not None:      # the backward model reads the reference, writes the source
            counts.append(len(self.backward.target_pieces(text) if side == "src" else self.backward.source_pieces(text)))
        return max(counts)

    def score(self, batch):
        return {"source_pieces": np.array([self._count(p.source, "src") for p in batch], dtype=np.float64),
                "reference_pieces": np.array([self._count(p.reference, "tgt") for p in batch], dtype=np.float64)}

    def detail(self, score, op, value, bound):
        return f"{value:.0f} pieces {op} {bound:g}"


class DualXentStep(_Timed, ScoringStep):
    """Mean of the forward model's per-token NLL of the reference and the backward model's of the
    source (Junczys-Dowmunt 2018, as ParaBank 2 filters its bitext)."""
    NAME = "dual_xent"
    SCORES = {"dual_xent": "low"}

    def __init__(self, forward, backward, maximum: float):
        super().__init__([Rule("dual_xent", "low", max=maximum)])
        self.forward, self.backward = forward, backward

    def score(self, batch):
        f = self.forward.score([p.source for p in batch], [p.reference for p in batch])
        b = self.backward.score([p.reference for p in batch], [p.source for p in batch])
        return {"dual_xent": 0.5 * (np.asarray(f, dtype=np.float64) + np.asarray(b, dtype=np.float64))}

    def detail(self, score, op, value, bound):
        return f"{value:.3f} {op} {bound:g}"


class ParaphraseStep(Step):
    """CleanPairs in, paraphrase rows out (nothing kept: the rows are the output)."""
    NAME = "generate"

    def __init__(self, forward, backward, cfg: GenerationConfig, config_hash: str):
        super().__init__()
        self.forward, self.backward, self.cfg, self.config_hash = forward, backward, cfg, config_hash

    def apply(self, items: list) -> StepResult:
        out = StepResult()
        found: dict = {}
        out.rows, out.rejects = paraphrase_batch(items, self.forward, self.backward, self.cfg, self.config_hash,
                                                 found)
        out.counters.update(found)
        out.counters["pairs_generated"] += len(items)
        return out


def decoding_steps(forward, backward, cfg: GenerationConfig, config_hash: str, limits: tuple[int, int],
                   bitext: list[Step] = ()) -> list[Step]:
    """What a work unit runs on its pairs, in order: the bitext filter's steps (BITEXT, from
    :func:`bitext_steps`), the piece limits, the dual cross-entropy filter (with a backward model
    and a threshold), paraphrasing."""
    steps = [*bitext, PieceLimitStep(forward, limits, backward)]
    if cfg.dual_xent_threshold is not None and backward is not None:
        steps.append(DualXentStep(forward, backward, cfg.dual_xent_threshold))
    steps.append(ParaphraseStep(forward, backward, cfg, config_hash))
    return steps


__all__ = ["BitextFilterConfig", "CleanPair", "CleanStep", "DualXentStep", "EquivalenceStep", "ParaphraseStep",
           "PieceLimitStep", "SimilarityStep", "bitext_steps", "decoding_steps"]
