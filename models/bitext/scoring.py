"""Scores of a bitext pair (a sentence and its supposed translation) from the two bitext models:
the bilingual sentence encoder (Kim et al. 2019, models/bitext/bilingual_encoder.py), optionally with
its MLP pair classifier (models/bitext/pair_classifier.py), and the divergence detector (Vyas et al.
2018, models/bitext/divergence.py).

Both jobs use them: the generation job's bitext filter (paracorpus/steps.py) drops non-parallel
and divergent pairs before back-translation (a pair that is not a translation only yields
paraphrases of something else), and the filter job's ``bitext_similarity`` and ``divergence``
filters (filtering/filters.py) score a run's pairs.

Only pairwise scores are used here: cosine (or the MLP's probability) and P(equivalent). CSLS and
the margin score depend on the other sentences of the corpus (their nearest neighbours), so a
pair's score would change with the batch it is decoded in; they are for mining and alignment
recovery (models/bitext/alignment.py), where the whole corpus is at hand.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


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
        from models.bitext.bilingual_encoder import load_bilingual_encoder
        from models.bitext.pair_classifier import load_pair_classifier

        self.encoder = load_bilingual_encoder(encoder_dir, device=device)
        self.mlp = load_pair_classifier(mlp_dir, device=device) if mlp_dir else None
        super().__init__(*self.encoder.langs, what=f"bilingual encoder {encoder_dir}")
        self.method = "mlp" if self.mlp else "cosine"

    def score(self, a: Sequence[str], b: Sequence[str], a_lang: str, b_lang: str) -> np.ndarray:
        from models.bitext.similarity import cosine_pairs

        src, tgt = self.orient(list(a), list(b), a_lang, b_lang)
        ea, eb = self.encoder.encode(src, self.langs[0]), self.encoder.encode(tgt, self.langs[1])
        scores = self.mlp.score(ea, eb) if self.mlp else cosine_pairs(ea, eb)
        return np.asarray(scores, dtype=np.float64)


class EquivalenceScorer(_Oriented):
    """The divergence detector's probability that the two sentences mean the same."""

    def __init__(self, model_dir: str, device: str | None = None):
        from models.bitext.divergence import load_divergence_detector

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
