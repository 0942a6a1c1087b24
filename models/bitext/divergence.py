"""Semantic divergences in parallel text without annotations (Vyas, Niu & Carpuat 2018).

    det = load_divergence_detector("runs/divergence-en-fr")
    p = det.score(["can you help him , sir ?"], ["pouvez-vous l'aider , monsieur ?"])   # P(equivalent)
    det.divergent(english, french)            # bool array: P(equivalent) < the tuned threshold

No divergence labels are needed to train. A parallel corpus gives the positives (its pairs, taken
as equivalent); the negatives are cross pairs (e_i, f_j), i != j, that look like translations on
the surface: length ratio at most 2, and at least half of the words of EACH side have a
translation in the other side according to a bilingual dictionary made from word alignments
(both directions, every aligned word pair as in the authors' code, SemDiverge). The aligner is
fast_align's model (models/bitext/word_align.py), which has no randomness, so a training is
reproducible with its seed; eflomal (``aligner="eflomal"``) aligns from samplers that seed
themselves and cannot be reproduced. ``aligner="agreement"`` (both directions trained together)
aligns as well as eflomal but gave a worse detector on subtitles: its dictionary is a quarter of
fast_align's, and the negatives and word vectors made from it suffer (docs/benchmarks.md). Five
negatives per positive, sampled with a seeded generator, and (``partial_negatives``, default 1) a
partial divergence of the positive itself: a span of one side deleted, replaced or added
(:func:`partial_divergence`, after Briakou & Carpuat 2020). The cross pairs alone teach only
"unrelated"; the labelled divergences are mostly a clause missing or added on one side, and with
one partial negative a positive the detector's commoncrawl F1 rose from 76.8 to 80.6 (mean of 5
seeds; ROC AUC 0.873 -> 0.907), opensubs level (69.2 -> 68.8, AUC 0.747 -> 0.758); two per
positive did worse on commoncrawl (75.3).

The weights kept are the mean of the weights after every step of the last epoch
(``average_epochs``, stochastic weight averaging with the constant learning rate): the last step's
are one noisy point of the path. Over 5 seeds the commoncrawl ROC AUC spread 0.893-0.917 instead
of 0.877-0.960 and the opensubs AUC rose 0.758 -> 0.785, the F1 means level (docs/benchmarks.md).

A detector is an ensemble (``DivergenceConfig.members``, default 2): the interaction model trained
from several seeds on the same dictionary and vectors, P(equivalent) the mean of the members'. One
seed's dev figures spread widely; two members with weight averaging reached commoncrawl macro F1
>= 80 and ROC AUC >= 0.919 in every one of five seeds (one member: F1 >= 80 in two, AUC 0.893-0.917)
and kept opensubs level (docs/benchmarks.md), at twice the cost of training and scoring one;
``members=1`` is the cheaper detector.

The classifier is He & Lin's (2016) pairwise word-interaction model, as Vyas et al. use it:
bilingual word embeddings -> one BiLSTM (shared by both languages) -> a similarity cube (cosine,
scaled L2 distance and scaled dot product of the forward, backward, concatenated and summed
states of every word pair) -> a focus layer (a greedy one-to-one matching of the strongest
interactions keeps weight 1, the rest gets 0.1) -> a small deep CNN (conv + max-pool blocks, a
global max-pool, dense layers) -> P(equivalent). One channel is added to the cube: whether the
two words are the same string: names and numbers are often out of vocabulary, and a copied name
is evidence of a translation that no embedding can give for an unknown word.

Embeddings: two tables (one per language) in one space, initialised from the parallel data:
the English x French matrix of alignment-link counts (both directions), square-rooted and
factored by a truncated SVD, English words = U sqrt(S), French words = V sqrt(S), rows
normalised (see :func:`svd_embeddings` for why square roots). Two tables rather than one joint
vocabulary because the same string is often a different word in the two languages ("a", "on",
"est"). The dot product of the two factors approximates how often two words are aligned, so
translations start close together, rather than the model having to discover translations from
the synthetic task alone (which asks for it only indirectly). The same
vectors give the embedding-cosine baseline. They are kept fixed by default: fine-tuning them on
the synthetic task did not help on the development sets (ROC AUC 0.87 either way on
commoncrawl, 0.78 -> 0.73 on opensubs, one epoch; the synthetic held-out accuracy dropped too):
it moves the training vocabulary away from the words it never sees, 12-18% of the development
tokens. ``embeddings="random"`` learns them end to end instead.

The decision threshold on P(equivalent) is tuned for macro F1 on development data with labels
(:func:`tune_threshold`). Baselines of the paper: :func:`embedding_cosine_scores` and
:func:`length_ratio_scores`, thresholded the same way.

Directory layout (:meth:`DivergenceDetector.save`): ``src_words.json`` and ``tgt_words.json``
(vocabularies as JSON lists), ``weights.pt`` (a plain state dict of tensors, read weights-only
through models.safety.load_tensor_file: nothing beyond tensors is ever unpickled) and
``config.json`` (sizes, languages, threshold, format version), written last: its presence marks
a whole model.
"""
from __future__ import annotations

import html
import math
import os
import random
import re
import tempfile
import time
import unicodedata
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Iterable, NamedTuple, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from common.text import Vocabulary
from models.safety import load_tensor_file
from common.atomic import replacing, write_json, write_text
from common.cli import UsageError

FORMAT_VERSION = 1
FILES = ("config.json", "src_words.json", "tgt_words.json", "weights.pt")
MAX_CHARS = 5000            # hostile input: a line is cut to this many characters before tokenising
MAX_TOKENS = 80             # and to this many tokens before it reaches the model (the cube is L1 x L2)
N_CHANNELS = 13             # 3 measures x 4 views of the BiLSTM states + the same-string channel
MAX_MEMBERS = 16            # an ensemble's detectors (each one a training and a pass when scoring)
MAX_PARTIAL_NEGATIVES = 10   # partial divergences made of each positive

_TOKEN = re.compile(r"\w+|[^\w\s]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_QUOTES = str.maketrans({"\u2019": "'", "\u2018": "'", "`": "'", "\u00b4": "'"})


# ---------------------------------------------------------------------------------- tokens
def tokenize(text: str, max_tokens: int | None = None) -> list[str]:
    """Lower-cased words and single punctuation marks. The training corpus is Moses-tokenised with
    HTML escapes ("l&apos; an", "austria &apos;s") and the development sets are raw text
    ("l'an", "c ’ est"): unescaping, one apostrophe and splitting every mark off makes both give
    the same tokens ("l ' an"), so dictionary and vocabulary lookups agree."""
    text = html.unescape(unicodedata.normalize("NFKC", (text or "")[:MAX_CHARS]))
    toks = _TOKEN.findall(_CONTROL.sub(" ", text.lower().translate(_QUOTES)))
    return toks if max_tokens is None else toks[:max_tokens]


# ---------------------------------------------------------------------------------- alignments, dictionary
ALIGNERS = ("fast_align", "agreement", "eflomal")


def word_alignments(src_tok: Sequence[Sequence[str]], tgt_tok: Sequence[Sequence[str]], seed: int | None = None,
                    n_samplers: int = 3, rel_iterations: float = 1.0, aligner: str = "fast_align"
                    ) -> tuple[list[list[tuple[int, int]]], list[list[tuple[int, int]]]]:
    """Word alignments of each pair in both directions: (forward, reverse), each a list (one per
    pair) of (source position, target position) links. ALIGNER "fast_align" (the default: fast_align's
    model, each direction alone) and "agreement" (both directions trained by agreement: better links,
    a worse detector on subtitles) are deterministic (models/bitext/word_align.py); "eflomal" does not
    honour SEED: eflomal 2.0 has no
    seed option (its samplers seed themselves from /dev/urandom), so links of rare words differ
    between runs, and the dictionary, vectors and negatives built on them with them."""
    del seed
    if aligner not in ALIGNERS:
        raise ValueError(f"aligner must be one of {', '.join(ALIGNERS)}, not {aligner!r}")
    if len(src_tok) != len(tgt_tok):
        raise ValueError(f"{len(src_tok)} source sentences but {len(tgt_tok)} target sentences")
    if not src_tok:
        return [], []
    if aligner in ("agreement", "fast_align"):
        from models.bitext.word_align import agreement_align, fast_align

        return (agreement_align if aligner == "agreement" else fast_align)(src_tok, tgt_tok)
    import eflomal

    with tempfile.TemporaryDirectory(prefix="paragen-eflomal-") as tmp:
        fwd, rev = os.path.join(tmp, "fwd"), os.path.join(tmp, "rev")
        # eflomal reads whitespace-separated tokens; ours never contain whitespace
        eflomal.Aligner(n_samplers=n_samplers, rel_iterations=rel_iterations).align(
            [" ".join(s) + "\n" for s in src_tok], [" ".join(t) + "\n" for t in tgt_tok],
            links_filename_fwd=fwd, links_filename_rev=rev, quiet=True)
        return _read_links(fwd, len(src_tok)), _read_links(rev, len(src_tok))


def _read_links(path: str, n: int) -> list[list[tuple[int, int]]]:
    with open(path, encoding="utf-8") as f:
        rows = [[tuple(int(x) for x in link.split("-")) for link in line.split()] for line in f]
    if len(rows) != n:
        raise RuntimeError(f"eflomal wrote {len(rows)} alignment lines for {n} sentence pairs")
    return rows


def link_counts(src_tok, tgt_tok, alignments) -> Counter:
    """How often each (source word, target word) pair is linked, summed over the pairs and over
    both directions of ALIGNMENTS (as word_alignments returns them)."""
    counts = Counter()
    for links in alignments:
        for s, t, row in zip(src_tok, tgt_tok, links):
            counts.update((s[i], t[j]) for i, j in row if i < len(s) and j < len(t))
    return counts


class Dictionary(NamedTuple):
    """A bilingual dictionary per direction: word -> the words it translates to."""
    src_to_tgt: dict[str, set[str]]
    tgt_to_src: dict[str, set[str]]


def dictionary_from_counts(counts: Counter, min_count: int = 1) -> Dictionary:
    """Every word pair linked at least MIN_COUNT times (SemDiverge keeps every aligned pair:
    MIN_COUNT 1), indexed from each side."""
    s2t, t2s = {}, {}
    for (s, t), c in counts.items():
        if c >= min_count:
            s2t.setdefault(s, set()).add(t)
            t2s.setdefault(t, set()).add(s)
    return Dictionary(s2t, t2s)


def bilingual_dictionary(src_tok, tgt_tok, min_count: int = 1, alignments=None, seed: int | None = None
                         ) -> Dictionary:
    """The dictionary of the aligned word pairs of a tokenised parallel corpus (aligned here
    unless ALIGNMENTS, word_alignments' output for the same pairs, is given)."""
    alignments = alignments if alignments is not None else word_alignments(src_tok, tgt_tok, seed)
    return dictionary_from_counts(link_counts(src_tok, tgt_tok, alignments), min_count)


def coverage(words: Sequence[str], other_words: Iterable[str], dictionary: dict[str, set[str]]) -> float:
    """Fraction of WORDS (tokens, repeats counted) with a translation among OTHER_WORDS according
    to DICTIONARY (one direction: word -> translations). 0 for an empty sentence."""
    if not words:
        return 0.0
    other = other_words if isinstance(other_words, (set, frozenset)) else set(other_words)
    empty = frozenset()
    return sum(1 for w in words if not dictionary.get(w, empty).isdisjoint(other)) / len(words)


def length_ratio(a: Sequence, b: Sequence) -> float:
    """Longer length / shorter length in words (inf when one side is empty)."""
    lo, hi = sorted((len(a), len(b)))
    return hi / lo if lo else math.inf


class Examples(list):
    """(src_tokens, tgt_tokens, label) triples, label 1 = equivalent; ``stats`` says how sampling
    went (positives, negatives, positives short of negatives, tries)."""

    def __init__(self, items=(), stats: dict | None = None):
        super().__init__(items)
        self.stats = dict(stats or {})


def synthetic_examples(pairs_tok: Sequence[tuple[Sequence[str], Sequence[str]]], dictionary: Dictionary,
                       negatives_per_positive: int = 5, max_length_ratio: float = 2.0, min_coverage: float = 0.5,
                       seed: int = 1, max_tries: int = 200, partial_negatives: int = 0) -> Examples:
    """Each pair of PAIRS_TOK as a positive, followed by up to NEGATIVES_PER_POSITIVE negatives
    (e_i, f_j), j != i drawn at random (random.Random(SEED)), kept only when the length ratio is
    <= MAX_LENGTH_RATIO, at least MIN_COVERAGE of the words of each side have a translation in the
    other side, the pair is not itself one of the corpus pairs (duplicated sentences) and j was
    not drawn for i already. At most MAX_TRIES draws per positive: a sentence with no plausible
    partner gets fewer negatives, counted in stats['short_positives']. Then PARTIAL_NEGATIVES
    partial divergences of the positive itself (:func:`partial_divergence`), from their own
    generator (random.Random(SEED + 1)), so the cross pairs are the same with or without them."""
    if negatives_per_positive < 0 or max_tries < 0 or partial_negatives < 0:
        raise ValueError("negatives_per_positive, partial_negatives and max_tries must be >= 0")
    partial_rng = random.Random(seed + 1)
    partial_count = 0
    rng = random.Random(seed)
    pairs = [(tuple(s), tuple(t)) for s, t in pairs_tok]
    true_pairs = set(pairs)
    tgt_sets = [frozenset(t) for _, t in pairs]
    out = Examples()
    short = tries_total = 0
    n = len(pairs)
    for i, (src, tgt) in enumerate(pairs):
        out.append((list(src), list(tgt), 1))
        src_set, chosen, tries = frozenset(src), set(), 0
        while len(chosen) < negatives_per_positive and tries < max_tries and n > 1:
            tries += 1
            j = _other_index(rng, n, i)
            cand = pairs[j][1]
            if j in chosen or (src, cand) in true_pairs or length_ratio(src, cand) > max_length_ratio:
                continue
            if coverage(src, tgt_sets[j], dictionary.src_to_tgt) < min_coverage or \
                    coverage(cand, src_set, dictionary.tgt_to_src) < min_coverage:
                continue
            chosen.add(j)
            out.append((list(src), list(cand), 0))
        tries_total += tries
        short += len(chosen) < negatives_per_positive
        for _ in range(partial_negatives if n > 1 else 0):
            changed = partial_divergence(src, tgt, pairs[_other_index(partial_rng, n, i)], partial_rng)
            if changed is not None and changed not in true_pairs:
                out.append((list(changed[0]), list(changed[1]), 0))
                partial_count += 1
    out.stats = {"positives": n, "negatives": len(out) - n, "short_positives": short, "tries": tries_total,
                 "negatives_per_positive": negatives_per_positive, "partial_negatives": partial_count}
    return out


def _other_index(rng: random.Random, n: int, i: int) -> int:
    """An index of range(N) other than I, uniformly."""
    j = rng.randrange(n - 1)
    return j + (j >= i)


PARTIAL_OPS = ("delete", "replace", "add")
MIN_PARTIAL_WORDS = 4          # a side shorter than this (trailing punctuation apart) is left whole


def partial_divergence(src: Sequence[str], tgt: Sequence[str], donor: tuple[Sequence[str], Sequence[str]],
                       rng: random.Random) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """A translation pair made partly divergent, or None when the chosen side is too short: on one
    side (drawn at random) 30-60% of the words, a contiguous span, are deleted (content missing
    from that side), replaced with a span as long from the DONOR pair's same side (content that
    differs), or such a span is added at its start or end (content only that side has). Trailing
    punctuation stays where it was, so the end of a sentence is no cue. The divergences the
    cross pairs cannot teach: most of the two sides still translate each other, as in the
    labelled divergences of the development sets (a clause missing or added on one side)."""
    side = rng.randrange(2)
    words, other = list((src, tgt)[side]), list(donor[side])
    op = PARTIAL_OPS[rng.randrange(len(PARTIAL_OPS))]
    tail = []
    while words and not any(c.isalnum() for c in words[-1]):
        tail.insert(0, words.pop())
    while other and not any(c.isalnum() for c in other[-1]):
        other.pop()
    n = len(words)
    if n < MIN_PARTIAL_WORDS:
        return None
    span = max(2, round(n * rng.uniform(0.3, 0.6)))
    start = rng.randrange(n - span + 1)
    piece_start = rng.randrange(max(1, len(other) - span + 1))
    piece = other[piece_start:piece_start + span]
    if op != "delete" and not piece:
        return None
    if op == "delete":
        words = words[:start] + words[start + span:]
    elif op == "replace":
        words = words[:start] + piece + words[start + span:]
    else:
        words = piece + words if rng.randrange(2) else words + piece
    changed = tuple(words + tail)
    return (changed, tuple(tgt)) if side == 0 else (tuple(src), changed)


# ---------------------------------------------------------------------------------- embeddings, baselines
@dataclass
class BilingualEmbeddings:
    """Word vectors of both languages in one space (rows of 0 and 1: padding and unknown, zero)."""
    src_words: Vocabulary
    tgt_words: Vocabulary
    src_vectors: np.ndarray
    tgt_vectors: np.ndarray

    @property
    def dim(self) -> int:
        return self.src_vectors.shape[1]

    def sentence_vectors(self, token_lists, side: str) -> np.ndarray:
        """Average vector of each sentence's known words (zeros when none is known)."""
        vocab, table = (self.src_words, self.src_vectors) if side == "src" else (self.tgt_words, self.tgt_vectors)
        out = np.zeros((len(token_lists), self.dim), dtype=np.float32)
        for k, toks in enumerate(token_lists):
            ids = [i for i in vocab.ids(toks) if i > 1]
            if ids:
                out[k] = table[ids].mean(0)
        return out


def svd_embeddings(counts: Counter, src_words: Vocabulary, tgt_words: Vocabulary, dim: int = 200,
                   seed: int = 1, power: float = 0.5) -> BilingualEmbeddings:
    """Cross-lingual vectors from the alignment-count matrix (source words x target words): the
    counts raised to POWER and factored by a rank-DIM truncated SVD; source words U sqrt(S),
    target words V sqrt(S), each row scaled to unit length, so a word and its translations point
    the same way. Words never linked get zero vectors.

    Why square roots of counts: on 1,000 held-out pairs of the 10,000-pair en-fr corpus, finding a
    sentence's translation by the cosine of averaged vectors (100 dims) succeeds for 46% of the
    pairs with PPMI weighting (the usual choice, which lets rare, noisily aligned words dominate),
    70% with log(1 + count), 79% with sqrt(count), 71% with raw counts; 85% with sqrt at 200 dims."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.linalg import svds

    rows, cols, vals = [], [], []
    for (s, t), c in counts.items():
        i, j = src_words.index.get(s, 1), tgt_words.index.get(t, 1)
        if i > 1 and j > 1 and c > 0:
            rows.append(i), cols.append(j), vals.append(float(c) ** power)
    shape = (len(src_words), len(tgt_words))
    src, tgt = np.zeros((shape[0], dim)), np.zeros((shape[1], dim))
    m = csr_matrix((vals, (rows, cols)), shape=shape, dtype=np.float64)
    k = min(dim, min(shape) - 3)
    if m.nnz and k >= 1:
        # PROPACK with a seeded start: ARPACK keeps a random state of its own across calls, and gave
        # other vectors for the same matrix from one call to the next when it had to restart
        u, sv, vt = svds(m, k=k, solver="propack", rng=np.random.default_rng(seed))
        order = np.argsort(-sv)
        u, sv, vt = u[:, order], sv[order], vt[order]
        src[:, :k] = _unit_rows(u * np.sqrt(sv))               # tiny corpora: fewer than DIM columns, zero-padded
        tgt[:, :k] = _unit_rows(vt.T * np.sqrt(sv))
    src[:2] = tgt[:2] = 0.0
    return BilingualEmbeddings(src_words, tgt_words, src.astype(np.float32), tgt.astype(np.float32))


def _unit_rows(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norm, 1e-12)


def embedding_cosine_scores(src_tok, tgt_tok, embeddings: BilingualEmbeddings) -> np.ndarray:
    """Baseline: cosine of the averaged bilingual word vectors of the two sides (higher = more
    equivalent; 0 when a side has no known word)."""
    a, b = embeddings.sentence_vectors(src_tok, "src"), embeddings.sentence_vectors(tgt_tok, "tgt")
    norm = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.where(norm > 0, (a * b).sum(1) / np.maximum(norm, 1e-12), 0.0).astype(np.float64)


def length_ratio_scores(src_tok, tgt_tok) -> np.ndarray:
    """Baseline: shorter length / longer length in words (1 = same length; higher = more
    equivalent; 0 when a side is empty)."""
    return np.array([min(len(a), len(b)) / max(len(a), len(b)) if min(len(a), len(b)) else 0.0
                     for a, b in zip(src_tok, tgt_tok)], dtype=np.float64)


# ---------------------------------------------------------------------------------- thresholds, F1
def macro_f1(pred, labels) -> float:
    """Mean over the classes present in LABELS or PRED of each class's F1 (a class never
    predicted, or never right, has F1 0)."""
    pred, labels = np.asarray(pred).astype(int), np.asarray(labels).astype(int)
    if pred.shape != labels.shape:
        raise ValueError(f"{pred.shape[0]} predictions for {labels.shape[0]} labels")
    classes = sorted(set(pred.tolist()) | set(labels.tolist()))
    if not classes:
        return 0.0
    f1s = []
    for c in classes:
        tp = int(((pred == c) & (labels == c)).sum())
        denom = int((pred == c).sum()) + int((labels == c).sum())
        f1s.append(2 * tp / denom if denom else 0.0)
    return float(np.mean(f1s))


def tune_threshold(scores, labels) -> tuple[float, float]:
    """(threshold, macro F1) maximising the macro F1 of 'equivalent (1) if score >= threshold'
    on (SCORES, LABELS). Candidates: below every score, and midway between consecutive distinct
    scores; the lowest of equally good thresholds wins."""
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels).astype(int)
    if scores.shape != labels.shape or scores.size == 0:
        raise ValueError("tune_threshold needs as many scores as labels, at least one")
    if not np.all(np.isfinite(scores)):
        raise ValueError("scores must be finite")
    u = np.unique(scores)
    candidates = np.concatenate([[u[0] - 1.0], (u[:-1] + u[1:]) / 2, [u[-1] + 1.0]])
    best = (None, -1.0)
    for th in candidates:
        f = macro_f1((scores >= th).astype(int), labels)
        if f > best[1] + 1e-12:
            best = (float(th), f)
    return best


# ---------------------------------------------------------------------------------- the model
def greedy_matching(sim: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """He & Lin's focus selection: repeatedly take the most similar remaining word pair and drop
    its row and column. Computed batch-wide by rounds: every pair that is the maximum of its row
    and of its column among the remaining ones is one greedy would take (nothing left in its row
    or column beats it), so each round takes all of them at once; the result equals the one-at-a-
    time greedy matching (ties broken by position). SIM, VALID: (B, L1, L2). Returns a bool mask."""
    chosen = torch.zeros_like(valid)
    avail = valid.clone()
    while bool(avail.any()):
        s = sim.masked_fill(~avail, float("-inf"))
        pick = avail & (s == s.amax(2, keepdim=True)) & (s == s.amax(1, keepdim=True))
        pick &= pick.cumsum(2) == 1                        # ties: first in its row,
        pick &= pick.cumsum(1) == 1                        # then first in its column
        if not bool(pick.any()):                           # cannot happen with finite sims; stay safe
            break
        chosen |= pick
        avail &= ~pick.any(2, keepdim=True) & ~pick.any(1, keepdim=True)
    return chosen


class InteractionModel(nn.Module):
    """Pairwise word interactions -> P(equivalent) (He & Lin 2016, as used by Vyas et al. 2018).

    forward(src_ids, src_len, tgt_ids, tgt_len, same) -> logits (B, 2), class 1 = equivalent.
    Padding never changes a pair's output: the BiLSTM runs on packed sequences, the cube is zero
    outside each pair's L1 x L2 region and stays so after every conv (re-masked), max-pools use
    ceil mode over non-negative values, and the last pool is a max over the valid region only."""

    def __init__(self, n_src: int, n_tgt: int, dim: int = 200, hidden: int = 64,
                 channels: Sequence[int] = (16, 32, 64, 64), dense: int = 128, focus_weight: float = 0.1,
                 dropout: float = 0.1, src_vectors: np.ndarray | None = None, tgt_vectors: np.ndarray | None = None,
                 freeze_embeddings: bool = False):
        super().__init__()
        self.hidden, self.focus_weight = hidden, focus_weight
        # sparse gradients: a batch touches a few hundred of the tables' rows (SparseAdam updates those)
        self.src_embed = nn.Embedding(n_src, dim, padding_idx=0, sparse=True)
        self.tgt_embed = nn.Embedding(n_tgt, dim, padding_idx=0, sparse=True)
        for emb, vec in ((self.src_embed, src_vectors), (self.tgt_embed, tgt_vectors)):
            if vec is not None:
                if vec.shape != emb.weight.shape:
                    raise ValueError(f"initial vectors {vec.shape} do not fit the table {tuple(emb.weight.shape)}")
                with torch.no_grad():
                    emb.weight.copy_(torch.as_tensor(vec))
            emb.weight.requires_grad_(not freeze_embeddings)
        self.lstm = nn.LSTM(dim, hidden, batch_first=True, bidirectional=True)
        convs, c_in = [], N_CHANNELS
        for c_out in channels:
            convs.append(nn.Conv2d(c_in, c_out, 3, padding=1))
            c_in = c_out
        self.convs = nn.ModuleList(convs)
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(c_in, dense), nn.ReLU(), nn.Dropout(dropout),
                                  nn.Linear(dense, 2))

    def states(self, embed: nn.Embedding, ids: torch.Tensor, lengths: torch.Tensor):
        """(forward, backward) BiLSTM states (B, L, hidden), zero past each length."""
        packed = nn.utils.rnn.pack_padded_sequence(embed(ids), lengths.cpu().clamp(min=1), batch_first=True,
                                                   enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=ids.shape[1])
        return out[..., :self.hidden], out[..., self.hidden:]

    def cube(self, s_states, t_states, same: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The similarity cube (B, 13, L1, L2) and the cosines of the concatenated and summed views
        (the focus layer's guides). L2 distances are divided by sqrt(2 hidden) and dot products by
        hidden so that every channel is O(1), as the CNN's inputs should be."""
        (sf, sb), (tf, tb) = s_states, t_states
        views = [(sf, tf), (sb, tb), (torch.cat([sf, sb], -1), torch.cat([tf, tb], -1)), (sf + sb, tf + tb)]
        chans, cosines = [], []
        for a, b in views:
            dot = a @ b.transpose(1, 2)
            na, nb = a.norm(dim=-1), b.norm(dim=-1)
            cos = dot / (na.unsqueeze(2) * nb.unsqueeze(1)).clamp(min=1e-8)
            sq = (na.unsqueeze(2) ** 2 + nb.unsqueeze(1) ** 2 - 2 * dot).clamp(min=0)
            l2 = torch.sqrt(sq + 1e-6) / math.sqrt(2 * self.hidden)     # eps: a finite gradient at 0
            chans += [cos, l2, dot / self.hidden]
            cosines.append(cos)
        chans.append(same.to(dot.dtype))
        return torch.stack(chans, 1), cosines[2], cosines[3]

    def forward(self, src_ids, src_len, tgt_ids, tgt_len, same: torch.Tensor | None = None) -> torch.Tensor:
        b, l1, l2 = src_ids.shape[0], src_ids.shape[1], tgt_ids.shape[1]
        valid = (torch.arange(l1, device=src_ids.device)[None, :, None] < src_len.to(src_ids.device)[:, None, None]) & \
                (torch.arange(l2, device=src_ids.device)[None, None, :] < tgt_len.to(src_ids.device)[:, None, None])
        if same is None:
            same = torch.zeros(b, l1, l2, device=src_ids.device)
        cube, cos_bi, cos_add = self.cube(self.states(self.src_embed, src_ids, src_len),
                                          self.states(self.tgt_embed, tgt_ids, tgt_len), same)
        with torch.no_grad():                               # focus: which interactions count fully
            focus = greedy_matching(cos_bi, valid) | greedy_matching(cos_add, valid)
            weight = torch.where(focus, 1.0, self.focus_weight) * valid
        x = cube * weight.unsqueeze(1).to(cube.dtype)
        m = valid.unsqueeze(1).to(x.dtype)
        for conv in self.convs:
            x = F.relu(conv(x)) * m
            x, m = F.max_pool2d(x, 2, ceil_mode=True), F.max_pool2d(m, 2, ceil_mode=True)
        pooled = (x * m).amax(dim=(2, 3))                   # x >= 0, padding 0: max over the valid cells
        return self.head(pooled)


class InteractionEnsemble(nn.Module):
    """Interaction models trained from different seeds on the same data; forward gives the log of
    their mean P(class), in float64 (so P(equivalent) = sigmoid of the difference, as for one model,
    and confident pairs keep their order). With 100 labelled pairs a set a seed moves one model's
    ROC AUC by 0.03-0.08; the mean of five ranked the dev pairs better on average, at the same
    F1 (docs/benchmarks.md). Members with fixed SVD vectors share one pair of tables: the vectors
    are the same for every seed."""

    def __init__(self, members: Sequence[InteractionModel]):
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        self.members = nn.ModuleList(members)

    def forward(self, *inputs) -> torch.Tensor:
        logp = torch.stack([F.log_softmax(m(*inputs).double(), -1) for m in self.members])
        return torch.logsumexp(logp, 0) - math.log(len(self.members))

    @property
    def src_embed(self) -> nn.Embedding:
        return self.members[0].src_embed

    @property
    def tgt_embed(self) -> nn.Embedding:
        return self.members[0].tgt_embed


def member_seed(seed: int, k: int) -> int:
    """The seed of an ensemble's K-th member (0-based): member 0 is the detector that --seed alone
    trains; the others are far from the seeds a user would try next (seed + 1, seed + 2)."""
    return seed + 1000 * k


def new_model(cfg: "DivergenceConfig", n_src: int, n_tgt: int, src_vectors: np.ndarray | None = None,
              tgt_vectors: np.ndarray | None = None) -> nn.Module:
    """The untrained model of CFG: one InteractionModel, or an InteractionEnsemble of cfg.members
    (sharing the word-vector tables when they are fixed)."""
    def one():
        return InteractionModel(n_src, n_tgt, cfg.dim, cfg.hidden, cfg.channels, cfg.dense, cfg.focus_weight,
                                cfg.dropout, src_vectors, tgt_vectors, freeze_embeddings=cfg.freeze_embeddings)
    if cfg.members == 1:
        return one()
    return share_fixed_tables(InteractionEnsemble([one() for _ in range(cfg.members)]), cfg)


def share_fixed_tables(ensemble: InteractionEnsemble, cfg: "DivergenceConfig") -> InteractionEnsemble:
    """Point every member at the first member's word-vector tables when they are fixed (the same
    SVD vectors in all): one copy in memory and in weights.pt."""
    if cfg.freeze_embeddings:
        first = ensemble.members[0]
        for m in ensemble.members[1:]:
            m.src_embed, m.tgt_embed = first.src_embed, first.tgt_embed
    return ensemble


# ---------------------------------------------------------------------------------- detector
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


class DivergenceDetector:
    """A trained interaction model with its vocabularies and decision threshold."""

    def __init__(self, src_words: Vocabulary, tgt_words: Vocabulary, cfg: DivergenceConfig,
                 threshold: float = 0.5, model: nn.Module | None = None, extra: dict | None = None):
        self.src_words, self.tgt_words, self.cfg, self.threshold = src_words, tgt_words, cfg, float(threshold)
        self.device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model = (model or new_model(cfg, len(src_words), len(tgt_words))).to(self.device)
        self.extra = dict(extra or {})

    # ---------------------------------------------------------------- tensors
    def batch(self, src_tok: Sequence[Sequence[str]], tgt_tok: Sequence[Sequence[str]]):
        """Model inputs for tokenised pairs (each side cut to max_tokens; an empty side becomes
        one unknown word): ids, lengths and the same-string matrix."""
        cap = self.cfg.max_tokens
        strings: dict[str, int] = {}

        def pad(rows, vocab):
            rows = [list(r[:cap]) for r in rows]
            lengths = torch.tensor([max(1, len(r)) for r in rows], dtype=torch.long)
            ids = torch.full((len(rows), int(lengths.max())), 0, dtype=torch.long)
            sid = torch.full((len(rows), int(lengths.max())), -1, dtype=torch.long)     # -1: matches nothing
            for k, r in enumerate(rows):
                if not r:
                    ids[k, 0] = 1                       # an empty side: one unknown word, same as no string
                    continue
                ids[k, :len(r)] = torch.tensor(vocab.ids(r), dtype=torch.long)
                sid[k, :len(r)] = torch.tensor([strings.setdefault(w, len(strings)) for w in r], dtype=torch.long)
            return ids, lengths, sid
        s_ids, s_len, s_sid = pad(src_tok, self.src_words)
        t_ids, t_len, t_sid = pad(tgt_tok, self.tgt_words)
        same = (s_sid.unsqueeze(2) == t_sid.unsqueeze(1)) & (s_sid.unsqueeze(2) >= 0)
        dev = self.device
        return s_ids.to(dev), s_len, t_ids.to(dev), t_len, same.float().to(dev)

    def member_detectors(self) -> list["DivergenceDetector"]:
        """Each member of an ensemble as a one-model detector with its own seed (sharing this
        detector's vocabularies, threshold and weights); a one-model detector: itself."""
        if not isinstance(self.model, InteractionEnsemble):
            return [self]
        return [DivergenceDetector(self.src_words, self.tgt_words,
                                   replace(self.cfg, members=1, seed=member_seed(self.cfg.seed, k)),
                                   self.threshold, model=m)
                for k, m in enumerate(self.model.members)]

    def logits(self, src_tok, tgt_tok) -> torch.Tensor:
        return self.model(*self.batch(src_tok, tgt_tok))

    # ---------------------------------------------------------------- inference API
    @torch.no_grad()
    def score_tokens(self, src_tok, tgt_tok, batch_size: int = 64) -> np.ndarray:
        """P(equivalent) of pre-tokenised pairs; pairs are sorted by length inside (less padding),
        the output keeps the input order."""
        if len(src_tok) != len(tgt_tok):
            raise ValueError(f"{len(src_tok)} source sentences but {len(tgt_tok)} target sentences")
        was_training = self.model.training
        self.model.eval()
        try:
            order = sorted(range(len(src_tok)), key=lambda i: (len(src_tok[i]), len(tgt_tok[i])))
            out = np.zeros(len(src_tok), dtype=np.float64)
            for start in range(0, len(order), batch_size):
                idx = order[start:start + batch_size]
                logits = self.logits([src_tok[i] for i in idx], [tgt_tok[i] for i in idx])
                # P(equivalent) = sigmoid of the logit difference, in float64: float32 rounds
                # confident pairs to exactly 1.0, and ties lose their order when pairs are ranked
                out[idx] = torch.sigmoid((logits[:, 1] - logits[:, 0]).double()).cpu().numpy()
            return out
        finally:
            self.model.train(was_training)

    def score(self, src_sentences: Sequence[str], tgt_sentences: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Probability that each pair (src_sentences[i], tgt_sentences[i]) is equivalent."""
        cap = self.cfg.max_tokens
        return self.score_tokens([tokenize(s, cap) for s in src_sentences], [tokenize(t, cap) for t in tgt_sentences],
                                 batch_size)

    def divergent(self, src_sentences, tgt_sentences, threshold: float | None = None) -> np.ndarray:
        """True where a pair is predicted divergent: P(equivalent) below the tuned threshold."""
        th = self.threshold if threshold is None else threshold
        return self.score(src_sentences, tgt_sentences) < th

    # ---------------------------------------------------------------- persistence
    def config(self) -> dict:
        cfg = {k: v for k, v in asdict(self.cfg).items() if k not in ("device", "progress")}
        cfg["channels"] = [int(c) for c in self.cfg.channels]
        return {"format_version": FORMAT_VERSION, "kind": "divergence-interaction", "threshold": self.threshold,
                "src_words": len(self.src_words), "tgt_words": len(self.tgt_words), "model": cfg, **self.extra}

    def save(self, path: str) -> None:
        """Write the model directory; each file is renamed into place, config.json last, so a
        reader never takes half a model for a whole one."""
        write_text(os.path.join(path, "src_words.json"), self.src_words.to_json())
        write_text(os.path.join(path, "tgt_words.json"), self.tgt_words.to_json())
        on_cpu: dict[tuple, torch.Tensor] = {}             # a shared table (ensembles) is stored once
        state = {}
        for k, v in self.model.state_dict().items():
            key = (str(v.device), v.data_ptr(), tuple(v.shape), tuple(v.stride()), v.dtype)
            if key not in on_cpu:
                on_cpu[key] = v.detach().cpu()
            state[k] = on_cpu[key]
        with replacing(os.path.join(path, "weights.pt")) as tmp:
            torch.save(state, tmp)
        write_json(os.path.join(path, "config.json"), self.config())


def _validated_config(cfg, path: str) -> tuple[DivergenceConfig, float, dict]:
    """(model config, threshold, extra fields) of a config.json, or UsageError: only known
    fields of the expected types and ranges reach the model constructor."""
    def bad(why):
        raise UsageError(f"{path}/config.json: {why}")

    if not isinstance(cfg, dict):
        bad("not a JSON object")
    if cfg.get("format_version") != FORMAT_VERSION:
        bad(f"format {cfg.get('format_version')!r}, this code reads {FORMAT_VERSION}")
    th = cfg.get("threshold")
    if isinstance(th, bool) or not isinstance(th, (int, float)) or not math.isfinite(th):
        bad(f"threshold must be a finite number, not {th!r}")
    model = cfg.get("model")
    if not isinstance(model, dict):
        bad("no 'model' object")
    defaults = DivergenceConfig()
    # detectors saved before these fields were trained without them (and as one member)
    kwargs = {"partial_negatives": 0, "average_epochs": 0, "members": 1}
    for name, value in model.items():
        if name not in DivergenceConfig.__dataclass_fields__ or name in ("device", "progress"):
            continue                                   # unknown fields are ignored, never passed on
        want = getattr(defaults, name)
        if name == "channels":
            if not (isinstance(value, list) and 0 < len(value) <= 16 and
                    all(type(c) is int and 0 < c <= 4096 for c in value)):
                bad(f"model.channels must be a list of 1 to 16 positive integers, not {value!r}")
            value = tuple(value)
        elif type(want) is bool:
            if not isinstance(value, bool):
                bad(f"model.{name} must be true or false")
        elif type(want) is int:
            if type(value) is not int or not 0 <= value < 1 << 31:
                bad(f"model.{name} must be a non-negative integer, not {value!r}")
        elif type(want) is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                bad(f"model.{name} must be a finite number, not {value!r}")
            value = float(value)
        elif type(want) is str:
            if not isinstance(value, str) or len(value) > 100:
                bad(f"model.{name} must be a short string")
        kwargs[name] = value
    mc = DivergenceConfig(**kwargs)
    try:
        mc.validate()
    except ValueError as exc:
        bad(str(exc))
    if mc.dim > 4096 or mc.hidden > 4096 or mc.dense > 65536:
        bad("model sizes out of range")
    known = {"format_version", "kind", "threshold", "src_words", "tgt_words", "model"}
    return mc, float(th), {k: v for k, v in cfg.items() if k not in known}


def load_divergence_detector(path: str, device: str | None = None) -> DivergenceDetector:
    """Load a directory written by DivergenceDetector.save (or python -m models.bitext.train_divergence);
    a bucket URL is copied to the local cache first (common.storage.local_copy)."""
    from models.safety import open_model_dir

    path, raw = open_model_dir(path, FILES, "divergence model")
    cfg, threshold, extra = _validated_config(raw, path)
    cfg.device = device
    vocabs = []
    for name in ("src_words.json", "tgt_words.json"):
        try:
            with open(os.path.join(path, name), encoding="utf-8") as f:
                vocabs.append(Vocabulary.from_json(f.read()))
        except (ValueError, UnicodeDecodeError) as exc:
            raise UsageError(f"{path}/{name}: {exc}") from None
    for vocab, key in zip(vocabs, ("src_words", "tgt_words")):
        if raw.get(key) != len(vocab):
            raise UsageError(f"{path}: config says {raw.get(key)} {key}, the vocabulary file has {len(vocab)}")
    det = DivergenceDetector(vocabs[0], vocabs[1], cfg, threshold, extra=extra)
    state = load_tensor_file(os.path.join(path, "weights.pt"))
    try:
        det.model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise UsageError(f"{path}/weights.pt does not fit its config.json ({str(exc).splitlines()[0]})") from None
    det.model.eval()
    return det


# ---------------------------------------------------------------------------------- training
@dataclass
class TrainedDivergence:
    """What train_divergence makes: the detector, and the pieces the baselines reuse."""
    detector: DivergenceDetector
    embeddings: BilingualEmbeddings
    dictionary: Dictionary
    report: dict = field(default_factory=dict)


def _set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _length_batches(examples, batch_size: int, rng: random.Random, pool: int = 50) -> list[list[int]]:
    """Shuffled mini-batches of similar lengths: shuffle, sort pools of POOL batches by length,
    cut them into batches, shuffle the batches (little padding, still random)."""
    order = list(range(len(examples)))
    rng.shuffle(order)
    batches = []
    step = batch_size * pool
    for start in range(0, len(order), step):
        chunk = sorted(order[start:start + step], key=lambda i: (len(examples[i][0]), len(examples[i][1])))
        batches += [chunk[k:k + batch_size] for k in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def _progress(total: int, desc: str, enabled: bool):
    import sys

    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="ex", disable=not enabled, mininterval=2.0, file=sys.stderr)


def train_divergence(src_tok: Sequence[Sequence[str]], tgt_tok: Sequence[Sequence[str]],
                     cfg: DivergenceConfig | None = None, dev: Sequence[tuple[str, str, int]] | None = None,
                     alignments=None, heldout: float = 0.02, log: Callable[[str], None] = print) -> TrainedDivergence:
    """Train a detector on a tokenised parallel corpus (SRC_TOK[i] translates TGT_TOK[i]):
    align (unless ALIGNMENTS is given), build the dictionary and the embeddings, sample the
    synthetic examples, train the interaction model with cross-entropy (Adam) for cfg.epochs, and
    tune the threshold on DEV ((src, tgt, label) triples, label 1 = equivalent; without DEV the
    threshold is 0.5). HELDOUT of the positives, with their negatives, are kept out of training
    to report accuracy on unseen synthetic pairs. With cfg.members > 1 the steps from the synthetic
    examples on are repeated for each member's seed (member_seed) on the same alignments,
    dictionary and vectors, and the threshold is tuned on the members' mean P(equivalent)."""
    cfg = cfg or DivergenceConfig()
    cfg.validate()
    _set_seed(cfg.seed)
    t0 = time.time()
    if len(src_tok) != len(tgt_tok):
        raise ValueError(f"{len(src_tok)} source sentences but {len(tgt_tok)} target sentences")
    n_given = len(src_tok)
    kept = [i for i, (s, t) in enumerate(zip(src_tok, tgt_tok)) if s and t]
    pairs = [(list(src_tok[i]), list(tgt_tok[i])) for i in kept]
    if len(pairs) < 2:
        raise UsageError(f"need at least 2 non-empty sentence pairs, got {len(pairs)}")
    src_tok, tgt_tok = [s for s, _ in pairs], [t for _, t in pairs]
    align_s = 0.0
    if alignments is None:
        log(f"aligning {len(pairs)} pairs with {cfg.aligner} ...")
        alignments = word_alignments(src_tok, tgt_tok, cfg.seed, aligner=cfg.aligner)
        align_s = time.time() - t0
    else:                                          # given for the pairs as passed: drop the empty ones too
        if any(len(links) != n_given for links in alignments):
            raise ValueError("alignments must have one row per sentence pair")
        alignments = [[links[i] for i in kept] for links in alignments]
    counts = link_counts(src_tok, tgt_tok, alignments)
    dictionary = dictionary_from_counts(counts, cfg.min_count)
    src_words = Vocabulary.build(Counter(w for s in src_tok for w in s))
    tgt_words = Vocabulary.build(Counter(w for t in tgt_tok for w in t))
    embeddings = svd_embeddings(counts, src_words, tgt_words, cfg.dim, cfg.seed)

    short = [(s, t) for s, t in pairs if len(s) <= cfg.max_train_tokens and len(t) <= cfg.max_train_tokens]
    if len(short) < 2:
        raise UsageError(f"fewer than 2 pairs with at most {cfg.max_train_tokens} tokens a side")
    log(f"dictionary: {sum(map(len, dictionary.src_to_tgt.values()))} word pairs; vocabularies "
        f"{len(src_words)} {cfg.src_lang} / {len(tgt_words)} {cfg.tgt_lang}")
    report = {"pairs": len(pairs), "trained_positives": len(short),
              "dictionary_pairs": sum(map(len, dictionary.src_to_tgt.values())),
              "src_words": len(src_words), "tgt_words": len(tgt_words), "align_seconds": round(align_s, 1),
              "prep_seconds": round(time.time() - t0 - align_s, 1)}
    vectors = (embeddings.src_vectors, embeddings.tgt_vectors) if cfg.embeddings == "svd" else (None, None)
    members, member_reports = [], []
    for k in range(cfg.members):
        member_cfg = replace(cfg, members=1, seed=member_seed(cfg.seed, k))
        if cfg.members > 1:
            log(f"member {k + 1} of {cfg.members} (seed {member_cfg.seed})")
        member = _train_member(src_words, tgt_words, member_cfg, vectors, short, dictionary, heldout, log)
        members.append(member.model)
        member_reports.append(member.extra["training"])
    # member 0's figures at the top, as for a single detector; every member's under 'members'
    report.update(member_reports[0])
    if cfg.members > 1:
        report["members"] = member_reports
    model = members[0] if cfg.members == 1 else share_fixed_tables(InteractionEnsemble(members), cfg)
    det = DivergenceDetector(src_words, tgt_words, cfg, model=model)
    if dev:
        scores = det.score([s for s, _, _ in dev], [t for _, t, _ in dev])
        det.threshold, f = tune_threshold(scores, [y for _, _, y in dev])
        report["dev"] = {"pairs": len(dev), "threshold": det.threshold, "macro_f1": f}
        log(f"threshold {det.threshold:.4f} tuned on {len(dev)} dev pairs"
            + (f" (the mean P(equivalent) of {cfg.members} members)" if cfg.members > 1 else "") + f": macro F1 {f:.3f}")
    report["train_seconds"] = round(time.time() - t0, 1)
    det.extra = {"training": report}
    return TrainedDivergence(det, embeddings, dictionary, report)


def _train_member(src_words: Vocabulary, tgt_words: Vocabulary, cfg: DivergenceConfig, vectors, short,
                  dictionary: Dictionary, heldout: float, log: Callable[[str], None]) -> DivergenceDetector:
    """One interaction model trained with cfg.seed: its own synthetic negatives, held-out split,
    initial weights and batch order (an ensemble member differs from the others in all four). The
    detector's extra['training'] says how it went."""
    _set_seed(cfg.seed)
    examples = synthetic_examples(short, dictionary, cfg.negatives_per_positive, cfg.max_length_ratio,
                                  cfg.min_coverage, cfg.seed, cfg.max_tries, cfg.partial_negatives)
    train_ex, held_ex = _split_heldout(examples, heldout, cfg.seed)
    log(f"synthetic data: {examples.stats['positives']} positives, {examples.stats['negatives']} negatives "
        f"({examples.stats['short_positives']} positives short of {cfg.negatives_per_positive}; "
        f"{examples.stats['partial_negatives']} of them partial); "
        f"{len(train_ex)} to train, {len(held_ex)} held out")
    det = DivergenceDetector(src_words, tgt_words, cfg, model=new_model(cfg, len(src_words), len(tgt_words), *vectors))
    optimizers = _optimizers(det.model, cfg.lr)
    mean = WeightMean(det.model)
    rng = random.Random(cfg.seed)
    report = {"seed": cfg.seed, "synthetic": dict(examples.stats), "epochs": []}
    for epoch in range(1, cfg.epochs + 1):
        averaging = epoch > cfg.epochs - cfg.average_epochs
        det.model.train()
        start, losses = time.time(), []
        bar = _progress(len(train_ex), f"epoch {epoch}/{cfg.epochs}", cfg.progress)
        for idx in _length_batches(train_ex, cfg.batch_size, rng):
            batch = [train_ex[i] for i in idx]
            labels = torch.tensor([y for _, _, y in batch], dtype=torch.long, device=det.device)
            loss = F.cross_entropy(det.logits([s for s, _, _ in batch], [t for _, t, _ in batch]), labels)
            for opt in optimizers:
                opt.zero_grad()
            loss.backward()
            for opt in optimizers:
                opt.step()
            if averaging:
                mean.add()
            losses.append(loss.item())
            bar.update(len(idx))
            bar.set_postfix(loss=f"{np.mean(losses[-100:]):.4f}")
        bar.close()
        entry = {"epoch": epoch, "loss": float(np.mean(losses)), "seconds": round(time.time() - start, 1)}
        if held_ex:
            entry["heldout_accuracy"] = _heldout_accuracy(det, held_ex)
        report["epochs"].append(entry)
        log(f"epoch {epoch}: loss {entry['loss']:.4f}, {entry['seconds']:.0f}s"
            + (f", held-out synthetic accuracy {entry['heldout_accuracy']:.3f}" if held_ex else ""))
    if mean.steps:
        mean.copy_to_model()
        report["averaged_steps"] = mean.steps
        if held_ex:
            report["heldout_accuracy"] = _heldout_accuracy(det, held_ex)
        log(f"weights averaged over the last {mean.steps} steps ({cfg.average_epochs} epoch(s))"
            + (f": held-out synthetic accuracy {report['heldout_accuracy']:.3f}" if held_ex else ""))
    det.extra = {"training": report}
    return det


def _heldout_accuracy(det: "DivergenceDetector", held_ex) -> float:
    p = det.score_tokens([s for s, _, _ in held_ex], [t for _, t, _ in held_ex])
    return float(np.mean((p >= 0.5) == np.array([y for _, _, y in held_ex], bool)))


class WeightMean:
    """The running mean of a model's trained weights, one step at a time (stochastic weight
    averaging, Izmailov et al. 2018, with a constant learning rate). Only the parameters that
    train are averaged: the fixed SVD tables are most of the model's size and would be averaged
    to themselves. (torch.optim.swa_utils.AveragedModel copies and averages every parameter.)"""

    def __init__(self, model: nn.Module):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.mean: list[torch.Tensor] = []
        self.steps = 0

    @torch.no_grad()
    def add(self) -> None:
        self.steps += 1
        if self.steps == 1:
            self.mean = [p.detach().clone() for p in self.params]
        else:
            for m, p in zip(self.mean, self.params):
                m.lerp_(p, 1.0 / self.steps)

    @torch.no_grad()
    def copy_to_model(self) -> None:
        for m, p in zip(self.mean, self.params):
            p.copy_(m)


def _optimizers(model: InteractionModel, lr: float) -> list:
    """Adam for the dense weights, SparseAdam for the embedding tables (when trained): dense
    Adam would update all of both tables at every step, the slowest part of a step."""
    tables = [p for p in (model.src_embed.weight, model.tgt_embed.weight) if p.requires_grad]
    dense = [p for n, p in model.named_parameters() if p.requires_grad and not n.endswith("_embed.weight")]
    return [torch.optim.Adam(dense, lr=lr)] + ([torch.optim.SparseAdam(tables, lr=lr)] if tables else [])


def _split_heldout(examples: Examples, fraction: float, seed: int) -> tuple[list, list]:
    """Split by positive: a held-out positive takes its negatives with it (they share its
    source sentence)."""
    groups, cur = [], []
    for ex in examples:
        if ex[2] == 1 and cur:
            groups.append(cur)
            cur = []
        cur.append(ex)
    if cur:
        groups.append(cur)
    n_held = int(len(groups) * fraction) if len(groups) >= 10 else 0
    held_idx = set(random.Random(seed + 7).sample(range(len(groups)), n_held))
    train = [ex for k, g in enumerate(groups) if k not in held_idx for ex in g]
    held = [ex for k, g in enumerate(groups) if k in held_idx for ex in g]
    return train, held


LANGUAGE_NAMES = {"en": "english", "fr": "french", "de": "german", "cs": "czech", "es": "spanish", "it": "italian"}


def read_dev_tsv(path: str, src_lang: str = "en", tgt_lang: str = "fr") -> list[tuple[str, str, int]]:
    """(source, target, label) rows of a labelled development file: tab-separated, no quoting
    (quotes are text), a header naming two text columns then 'label' (the divergence sets:
    'english french label agreement'; label 1 = equivalent). The text columns are swapped when
    the header names them in the other order than SRC_LANG, TGT_LANG."""
    import csv
    import gzip

    from common import storage

    with storage.open_input(path) as raw:
        data = raw.read()
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    reader = csv.reader(data.decode("utf-8").splitlines(), delimiter="\t", quoting=csv.QUOTE_NONE)
    header = next(reader, None)
    if not header or len(header) < 3 or header[2].strip().lower() != "label":
        raise UsageError(f"{path}: expected a header '<source><TAB><target><TAB>label ...', got {header!r}")
    names = [h.strip().lower() for h in header[:2]]
    swap = [LANGUAGE_NAMES.get(tgt_lang, tgt_lang), LANGUAGE_NAMES.get(src_lang, src_lang)] == names
    rows = []
    for n, row in enumerate(reader, 2):
        if not row:
            continue
        if len(row) < 3 or row[2].strip() not in ("0", "1"):
            raise UsageError(f"{path}:{n}: expected source<TAB>target<TAB>label (0 or 1)")
        a, b = (row[1], row[0]) if swap else (row[0], row[1])
        rows.append((a, b, int(row[2])))
    if not rows:
        raise UsageError(f"{path}: no labelled pairs")
    return rows
