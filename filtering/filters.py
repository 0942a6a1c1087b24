"""The filters: each a scoring step (common/steps.py: SCORES {score column: direction}, score()
over a batch, setup(), fit()) over a PairBatch of generation rows. Thresholds come from the
config (filtering/config.py). A score without thresholds is computed and written but rejects
nothing. A null score (e.g. no backward model, an unparsable sentence) never rejects.

Filters that need a model trained on the data (KenLM, classifier) implement ``fit``: the driver
calls it once on a sample before the pipeline; it returns the parameters (model paths) that
workers load in ``setup``.
"""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from common.steps import DIRECTIONS, ScoringStep
from filtering import text_scores as ts
from common import storage

__all__ = ["DIRECTIONS", "FILTERS", "Filter", "PairBatch"]


class PairBatch:
    """Rows of the generation output seen by the filters; tokens are computed once and shared.

    Tokens come in two forms: ``ref_ids`` / ``para_ids`` (ts.TokenColumn: flat int32 token ids and
    row offsets, one vocabulary for both sides, what the token-level filters compute on with numpy)
    and ``ref_tokens`` / ``para_tokens`` (a list of token lists per row, for the other filters)."""

    def __init__(self, table: pa.Table | pa.RecordBatch):
        self.table = table
        self._reference_column = table.column("reference")
        self._paraphrase_column = table.column("paraphrase")
        self._cache: dict = {}

    def __len__(self) -> int:
        return self.table.num_rows

    def cached(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    @property
    def reference(self) -> list[str]:
        return self.cached("reference", lambda: [s or "" for s in self._reference_column.to_pylist()])

    @property
    def paraphrase(self) -> list[str]:
        return self.cached("paraphrase", lambda: [s or "" for s in self._paraphrase_column.to_pylist()])

    def _token_ids(self) -> tuple[ts.TokenColumn, ts.TokenColumn]:
        return self.cached("token_ids", lambda: tuple(ts.tokenize_columns(self._reference_column,
                                                                          self._paraphrase_column)))

    @property
    def ref_ids(self) -> ts.TokenColumn:
        return self._token_ids()[0]

    @property
    def para_ids(self) -> ts.TokenColumn:
        return self._token_ids()[1]

    @property
    def ref_lengths(self) -> np.ndarray:
        return self.cached("ref_lengths", lambda: self.ref_ids.lengths)

    @property
    def para_lengths(self) -> np.ndarray:
        return self.cached("para_lengths", lambda: self.para_ids.lengths)

    @property
    def ref_tokens(self) -> list[list[str]]:
        return self.cached("ref_tokens", lambda: self.ref_ids.token_lists())

    @property
    def para_tokens(self) -> list[list[str]]:
        return self.cached("para_tokens", lambda: self.para_ids.token_lists())

    def ngram_matches(self, max_n: int) -> list[np.ndarray]:
        """Per row, the n-grams reference and paraphrase share (clipped counts), for n = 1..MAX_N."""
        counts = self._cache.get("ngram_matches", [])
        if len(counts) < max_n:                 # every order comes from one pass
            counts = ts.ngram_match_counts(self.ref_ids, self.para_ids, max_n)
            self._cache["ngram_matches"] = counts
        return counts[:max_n]

    def column(self, name: str) -> list:
        if name not in self.table.schema.names:
            raise KeyError(f"input has no column {name!r}")
        return self.table.column(name).to_pylist()


class Filter(ScoringStep):
    """A filter of the filter job: a scoring step (common/steps.py) over a PairBatch. Its
    thresholds come from the job's config (filtering/config.py), which decides for every row."""


def _floats(values) -> np.ndarray:
    return np.array([math.nan if v is None else float(v) for v in values], dtype=np.float64)


# ------------------------------------------------------------------ text-only filters

class LengthFilter(Filter):
    """Tokens in the reference and in the paraphrase (Wieting et al. 2017 bin by translation length)."""
    NAME = "length"
    SCORES = {"reference_length": "between", "paraphrase_length": "between"}

    def score(self, batch):
        return {"reference_length": batch.ref_lengths.astype(np.float64),
                "paraphrase_length": batch.para_lengths.astype(np.float64)}


class LengthRatioFilter(Filter):
    """Longer side's tokens / shorter side's tokens (1.0 for equal lengths, inf with an empty side)."""
    NAME = "length_ratio"
    SCORES = {"length_ratio": "low"}

    def score(self, batch):
        return {"length_ratio": ts.length_ratio_batch(batch.ref_lengths, batch.para_lengths)}


_NGRAM_NAMES = {1: "unigram", 2: "bigram", 3: "trigram", 4: "fourgram"}


class NgramOverlapFilter(Filter):
    """Shared n-grams / n-grams of the shorter side, for each n in ``n`` (default 1, 2, 3)."""
    NAME = "ngram_overlap"
    PARAMS = {"n": [1, 2, 3]}

    def check_params(self):
        n = self.params["n"]
        if not isinstance(n, list) or not n or any(k not in _NGRAM_NAMES for k in n):
            raise ValueError(f"filter 'ngram_overlap': n must be a list of orders from 1 to 4, got {n!r}")

    @property
    def scores(self):
        return {f"{_NGRAM_NAMES[k]}_overlap": "between" for k in self.params["n"]}

    def score(self, batch):
        orders = self.params["n"]
        matches = batch.ngram_matches(max(orders))
        return {f"{_NGRAM_NAMES[k]}_overlap": ts.ngram_overlap_batch(batch.ref_lengths, batch.para_lengths,
                                                                     matches[k - 1], k)
                for k in orders}


class BleuFilter(Filter):
    """Smoothed sentence BLEU of the paraphrase against the reference (Nakov et al. 2012) and
    1 - BLEU, the ParaBank 2 diversity score."""
    NAME = "bleu"
    SCORES = {"sentence_bleu": "between", "one_minus_bleu": "between"}

    def score(self, batch):
        b = ts.sentence_bleu_batch(batch.para_lengths, batch.ref_lengths, batch.ngram_matches(4), max_n=4)
        return {"sentence_bleu": b, "one_minus_bleu": 1.0 - b}


class BagOfPiecesFilter(Filter):
    """Intersection over union of lower-cased sentencepiece pieces without punctuation (ParaBank 2).
    ``spm_model``: the generation models' spm.model (default: taken from the run manifest)."""
    NAME = "bag_of_pieces"
    SCORES = {"pieces_iou": "between"}
    PARAMS = {"spm_model": None}

    def check_params(self):
        pass   # resolved by the job from the manifest when None; checked in setup

    def setup(self):
        from common.text import load_sentencepiece

        if not self.params["spm_model"]:
            raise ValueError("filter 'bag_of_pieces' needs spm_model (no generation manifest names one)")
        self._sp = load_sentencepiece(storage.local_copy(self.params["spm_model"]), "sentencepiece model (spm_model)")

    def score(self, batch):
        sp = self._sp
        return {"pieces_iou": np.array([ts.bag_of_pieces_similarity(sp.encode(r.lower(), out_type=str),
                                                                    sp.encode(p.lower(), out_type=str))
                                        for r, p in zip(batch.reference, batch.paraphrase)])}


class TranslationCostFilter(Filter):
    """Forward NLL per token of the paraphrase given the source, from the generation output."""
    NAME = "translation_cost"
    SCORES = {"translation_cost": "low"}

    def score(self, batch):
        return {"translation_cost": _floats(batch.column("forward_nll"))}


# ------------------------------------------------------------------ model-based filters

class LanguageModelFilter(Filter):
    """Perplexity of the paraphrase under a 3-gram KenLM model of held-out references (lower is
    more fluent). ``model``: an ARPA/binary KenLM file; without one, ``fit`` estimates an
    interpolated Kneser-Ney model on the fit sample's references (filtering/lm.py)."""
    NAME = "lm_perplexity"
    SCORES = {"lm_perplexity": "low"}
    PARAMS = {"model": None, "order": 3}

    def check_params(self):
        if not isinstance(self.params["order"], int) or not 1 <= self.params["order"] <= 5:
            raise ValueError("filter 'lm_perplexity': order must be an integer from 1 to 5")

    def needs_fit(self):
        return not self.params["model"]

    def fit(self, sample, workdir, log=print):
        if self.params["model"]:
            return {}
        import os

        from filtering.lm import write_arpa

        path = os.path.join(workdir, "lm.arpa")
        refs = sorted(set(s for s in sample.column("reference").to_pylist() if s))
        write_arpa((ts.tokenize(s) for s in refs), path, self.params["order"])
        log(f"  lm_perplexity: {self.params['order']}-gram Kneser-Ney on {len(refs)} references -> {path}")
        return {"model": path}

    def setup(self):
        import kenlm

        self._lm = kenlm.Model(storage.local_copy(self.params["model"]))

    def score(self, batch):
        lm = self._lm
        return {"lm_perplexity": np.array([lm.perplexity(" ".join(t)) for t in batch.para_tokens])}


class ClassifierFilter(Filter):
    """P(reference) of the paraphrase under a reference-vs-back-translation classifier (Wieting et al.
    2017): ``variants`` word (word averaging) and/or lstm; trained in ``fit`` on the fit sample's
    references (label 1) and paraphrases (label 0) unless ``models`` are given."""
    NAME = "classifier"
    PARAMS = {"variants": ["word", "lstm"], "models": None, "epochs": 3, "dim": 100}

    def check_params(self):
        v = self.params["variants"]
        if not isinstance(v, list) or not v or any(x not in ("word", "lstm") for x in v):
            raise ValueError(f"filter 'classifier': variants must be a list of word/lstm, got {v!r}")

    @property
    def scores(self):
        return {f"p_reference_{v}": "high" for v in self.params["variants"]}

    def needs_fit(self):
        return not self.params["models"]

    def fit(self, sample, workdir, log=print):
        if self.params["models"]:
            return {}
        import os

        from filtering.classifier import train_classifier

        refs = sample.column("reference").to_pylist()
        paras = sample.column("paraphrase").to_pylist()
        models = {}
        for v in self.params["variants"]:
            path = os.path.join(workdir, f"classifier-{v}")
            acc = train_classifier(refs, paras, v, path, epochs=self.params["epochs"], dim=self.params["dim"])
            log(f"  classifier ({v}): held-out balanced accuracy {acc:.3f} -> {path}")
            models[v] = path
        return {"models": models}

    def setup(self):
        from filtering.classifier import load_classifier

        self._models = {v: load_classifier(storage.local_copy(self.params["models"][v]))
                        for v in self.params["variants"]}

    def score(self, batch):
        return {f"p_reference_{v}": m.p_reference(batch.paraphrase) for v, m in self._models.items()}


class ParaphraseScoreFilter(Filter):
    """Cosine of reference and paraphrase under an encoder of the embedding job (ParaNMT keeps [0.4, 1])."""
    NAME = "paraphrase_score"
    SCORES = {"paraphrase_score": "between"}
    PARAMS = {"model": None}

    def check_params(self):
        if not self.params["model"]:
            raise ValueError("filter 'paraphrase_score' needs model: an encoder directory (python -m embeddings.train)")

    def setup(self):
        from models.sentence.sentence_encoder import load_encoder

        self._enc = load_encoder(storage.local_copy(self.params["model"]))

    def score(self, batch):
        return {"paraphrase_score": self._enc.similarity(batch.reference, batch.paraphrase).astype(np.float64)}


class TreeEditFilter(Filter):
    """Tree edit distance (APTED, unit costs) between the top ``levels`` levels of the constituency
    parses of reference and paraphrase (ParaBank 2 diversity). Parser: link-grammar."""
    NAME = "tree_edit"
    SCORES = {"tree_edit_distance": "between"}
    PARAMS = {"levels": 3}

    def check_params(self):
        if not isinstance(self.params["levels"], int) or self.params["levels"] < 1:
            raise ValueError("filter 'tree_edit': levels must be an integer >= 1")

    def setup(self):
        from filtering.syntax import Parser

        self._parser = Parser()

    def score(self, batch):
        from filtering.syntax import top_levels, tree_edit_distance

        out = []
        for r, p in zip(batch.reference, batch.paraphrase):
            tr, tp = self._parser.parse(r), self._parser.parse(p)
            if tr is None or tp is None:
                out.append(math.nan)
            else:
                lv = self.params["levels"]
                out.append(float(tree_edit_distance(top_levels(tr, lv), top_levels(tp, lv))))
        return {"tree_edit_distance": np.array(out, dtype=np.float64)}


class _BitextFilter(Filter):
    """Base of the filters that score the foreign source against the English reference and the
    paraphrase with a bitext model (models/bitext/scoring.py); the rows' src_lang / tgt_lang say
    which language each side is in."""
    PREFIX = ""

    @property
    def scores(self):
        return {f"{self.PREFIX}_reference": "high", f"{self.PREFIX}_paraphrase": "high"}

    def score(self, batch):
        table = batch.table
        for column in ("source", "src_lang", "tgt_lang"):
            if column not in table.column_names:
                raise ValueError(f"filter {self.NAME!r} needs the generation rows' {column!r} column")
        source = [s or "" for s in table.column("source").to_pylist()]
        pairs = list(zip(table.column("src_lang").to_pylist(), table.column("tgt_lang").to_pylist()))
        out = {}
        for side, texts in (("reference", batch.reference), ("paraphrase", batch.paraphrase)):
            values = np.full(len(batch), np.nan)
            for src_lang, tgt_lang in set(pairs):    # a file holds one language pair; several work too
                idx = [i for i, p in enumerate(pairs) if p == (src_lang, tgt_lang)]
                values[idx] = self._scorer.score([source[i] for i in idx], [texts[i] for i in idx],
                                                 src_lang, tgt_lang)
            out[f"{self.PREFIX}_{side}"] = values
        return out


class BitextSimilarityFilter(_BitextFilter):
    """Cosine of bilingual sentence embeddings (Kim et al. 2019) of source and reference, and of
    source and paraphrase (is the paraphrase still a translation of the source?); with ``mlp``,
    the MLP's probability that the pair is parallel instead."""
    NAME = "bitext_similarity"
    PREFIX = "bitext_similarity"
    PARAMS = {"encoder": None, "mlp": None}

    def check_params(self):
        if not self.params["encoder"]:
            raise ValueError("filter 'bitext_similarity' needs encoder: a bilingual encoder directory "
                             "(paragen-train-bilingual)")

    def setup(self):
        from models.bitext.scoring import SimilarityScorer

        self._scorer = SimilarityScorer(self.params["encoder"], self.params["mlp"])


class DivergenceFilter(_BitextFilter):
    """P(equivalent) of source and reference, and of source and paraphrase, from the semantic
    divergence detector (Vyas et al. 2018)."""
    NAME = "divergence"
    PREFIX = "equivalence"
    PARAMS = {"model": None}

    def check_params(self):
        if not self.params["model"]:
            raise ValueError("filter 'divergence' needs model: a divergence detector directory "
                             "(paragen-train-divergence)")

    def setup(self):
        from models.bitext.scoring import EquivalenceScorer

        self._scorer = EquivalenceScorer(self.params["model"])


FILTERS: dict[str, type[Filter]] = {f.NAME: f for f in (
    LengthFilter, LengthRatioFilter, NgramOverlapFilter, BleuFilter, BagOfPiecesFilter, TranslationCostFilter,
    LanguageModelFilter, ClassifierFilter, ParaphraseScoreFilter, TreeEditFilter, BitextSimilarityFilter,
    DivergenceFilter)}
