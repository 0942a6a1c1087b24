"""Scores of a bitext pair (a sentence and its supposed translation) from the two bitext models:
the bilingual sentence encoder (Kim et al. 2019, models/bilingual_encoder.py), optionally with
its MLP pair classifier (models/pair_classifier.py), and the divergence detector (Vyas et al.
2018, models/divergence.py).

Both jobs use it: the generation job's bitext filter drops non-parallel and divergent pairs
before back-translation (a pair that is not a translation only yields paraphrases of something
else), and the filter job's ``bitext_similarity`` and ``divergence`` filters score a run's pairs.

Only pairwise scores are used here: cosine (or the MLP's probability) and P(equivalent). CSLS and
the margin score depend on the other sentences of the corpus (their nearest neighbours), so a
pair's score would change with the batch it is decoded in; they are for mining and alignment
recovery (models/alignment_recovery.py), where the whole corpus is at hand.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

SIMILARITY = "bitext_similarity"        # score column / reject reason: cosine or MLP probability
EQUIVALENCE = "equivalence"             # score column: the divergence detector's P(equivalent)
DIVERGENT = "divergent"                 # reject reason of the generation job's bitext filter


class _Oriented:
    """A two-language model called with (texts of lang A, texts of lang B) in either order."""

    def __init__(self, src_lang: str, tgt_lang: str, what: str):
        self.langs, self.what = (src_lang, tgt_lang), what

    def orient(self, a: Sequence[str], b: Sequence[str], a_lang: str, b_lang: str):
        """(model-source texts, model-target texts) for texts A in A_LANG and B in B_LANG."""
        if (a_lang, b_lang) == self.langs:
            return a, b
        if (b_lang, a_lang) == self.langs:
            return b, a
        raise ValueError(f"the {self.what} is for {self.langs[0]}-{self.langs[1]}, not {a_lang}-{b_lang}")


class SimilarityScorer(_Oriented):
    """Cosine of the two sentences' bilingual embeddings, or with an MLP the probability that the
    pair is parallel (the paper's best scorer for corpus filtering)."""

    def __init__(self, encoder_dir: str, mlp_dir: str | None = None, device: str | None = None):
        from models.bilingual_encoder import load_bilingual_encoder
        from models.pair_classifier import load_pair_classifier

        self.encoder = load_bilingual_encoder(encoder_dir, device=device)
        self.mlp = load_pair_classifier(mlp_dir, device=device) if mlp_dir else None
        super().__init__(*self.encoder.langs, what=f"bilingual encoder {encoder_dir}")
        self.method = "mlp" if self.mlp else "cosine"

    def score(self, a: Sequence[str], b: Sequence[str], a_lang: str, b_lang: str) -> np.ndarray:
        from models.similarity import cosine_pairs

        src, tgt = self.orient(list(a), list(b), a_lang, b_lang)
        ea, eb = self.encoder.encode(src, self.langs[0]), self.encoder.encode(tgt, self.langs[1])
        scores = self.mlp.score(ea, eb) if self.mlp else cosine_pairs(ea, eb)
        return np.asarray(scores, dtype=np.float64)


class EquivalenceScorer(_Oriented):
    """The divergence detector's probability that the two sentences mean the same."""

    def __init__(self, model_dir: str, device: str | None = None):
        from models.divergence import load_divergence_detector

        self.detector = load_divergence_detector(model_dir, device=device)
        super().__init__(self.detector.cfg.src_lang, self.detector.cfg.tgt_lang,
                         what=f"divergence detector {model_dir}")

    @property
    def threshold(self) -> float:
        """The threshold tuned on development data when the model was trained."""
        return self.detector.threshold

    def score(self, a: Sequence[str], b: Sequence[str], a_lang: str, b_lang: str) -> np.ndarray:
        src, tgt = self.orient(list(a), list(b), a_lang, b_lang)
        return np.asarray(self.detector.score(src, tgt), dtype=np.float64)


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
        if self.min_similarity is not None and not self.encoder:
            raise ValueError("--bitext_min_similarity needs --bitext_encoder")
        if self.min_equivalence is not None and not self.divergence:
            raise ValueError("--min_equivalence needs --divergence_model")
        if self.min_equivalence is not None and not 0.0 <= self.min_equivalence <= 1.0:
            raise ValueError(f"--min_equivalence is a probability: between 0 and 1, not {self.min_equivalence}")


class BitextFilter:
    """Loaded models of a BitextFilterConfig; ``decide`` gives each pair's reject reason and detail
    (None for a kept pair). SHA256 ({"bitext_encoder" | "bitext_mlp" | "divergence": {file:
    sha256}}, what the driver recorded in the run's manifest) makes every file be checked before
    it is loaded, as the NMT models are."""

    def __init__(self, cfg: BitextFilterConfig, device: str | None = None, sha256: dict | None = None):
        from models.model_dir import verified_model_dir

        def local(path, name):
            return verified_model_dir(path, sha256[name]) if path and sha256 and name in sha256 else path

        self.cfg = cfg
        encoder, mlp = local(cfg.encoder, "bitext_encoder"), local(cfg.mlp, "bitext_mlp")
        self.similarity = SimilarityScorer(encoder, mlp, device) if cfg.encoder else None
        self.equivalence = EquivalenceScorer(local(cfg.divergence, "divergence"), device) if cfg.divergence else None
        self.min_equivalence = (cfg.min_equivalence if cfg.min_equivalence is not None
                                else self.equivalence.threshold if self.equivalence else None)

    def decide(self, sources: Sequence[str], targets: Sequence[str], src_lang: str,
               tgt_lang: str) -> list[tuple[str, str] | None]:
        out: list[tuple[str, str] | None] = [None] * len(sources)
        if not sources:
            return out
        if self.similarity is not None:
            sims = self.similarity.score(sources, targets, src_lang, tgt_lang)
            for i, s in enumerate(sims):
                if s < self.cfg.min_similarity:
                    out[i] = (SIMILARITY, f"{self.similarity.method} {s:.4f} < {self.cfg.min_similarity}")
        if self.equivalence is not None:
            keep = [i for i, o in enumerate(out) if o is None]
            if keep:
                probs = self.equivalence.score([sources[i] for i in keep], [targets[i] for i in keep],
                                               src_lang, tgt_lang)
                for i, p in zip(keep, probs):
                    if p < self.min_equivalence:
                        out[i] = (DIVERGENT, f"P(equivalent) {p:.4f} < {self.min_equivalence:.4f}")
        return out
