"""Plain score functions on sentence pairs (no models): lengths, n-gram overlap, sentence BLEU,
bag-of-pieces. Tokens are embeddings.text.tokenize's lower-cased words and punctuation marks.
"""
from __future__ import annotations

import unicodedata
from collections import Counter

from embeddings.text import tokenize

__all__ = ["tokenize", "ngrams", "ngram_overlap", "sentence_bleu", "bag_of_pieces_similarity", "is_punct"]


def ngrams(tokens: list[str], n: int) -> Counter:
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def ngram_overlap(a: list[str], b: list[str], n: int) -> float:
    """Shared n-grams (clipped counts) / n-grams of the side with fewer n-grams (Wieting et al.
    2017). 0.0 when that side has no n-gram (fewer than n tokens): nothing can be shared."""
    ga, gb = ngrams(a, n), ngrams(b, n)
    shorter = min(sum(ga.values()), sum(gb.values()))
    if shorter == 0:
        return 0.0
    return sum((ga & gb).values()) / shorter


def sentence_bleu(hyp: list[str], ref: list[str], max_n: int = 4) -> float:
    """Smoothed sentence BLEU in [0, 1], BLEU+1 as Nakov et al. (2012) define it: add one to the
    matches and totals of every n-gram order, unigrams included, and one to the reference length
    of the brevity penalty. sacrebleu's add-k smooths orders n > 1 only, so the unigram and length
    terms are added here and sacrebleu computes the rest."""
    from sacrebleu.metrics.bleu import BLEU

    if not hyp or not ref:      # smoothing alone would give an empty side a positive score
        return 0.0
    correct, total = [], []
    for n in range(1, max_n + 1):
        h, r = ngrams(hyp, n), ngrams(ref, n)
        correct.append(sum((h & r).values()))
        total.append(max(len(hyp) - n + 1, 0))
    correct[0] += 1
    total[0] += 1
    score = BLEU.compute_bleu(correct, total, len(hyp), len(ref) + 1, smooth_method="add-k", smooth_value=1,
                              max_ngram_order=max_n)
    return score.score / 100


def is_punct(piece: str) -> bool:
    return all(unicodedata.category(c).startswith("P") or unicodedata.category(c).startswith("S") for c in piece)


def bag_of_pieces_similarity(a_pieces: list[str], b_pieces: list[str]) -> float:
    """|A ∩ B| / |A ∪ B| of the two sets of lower-cased sentencepiece pieces, without the word
    boundary mark and without punctuation pieces (ParaBank 2 §4). Two empty sets give 0.0."""
    def clean(pieces):
        out = set()
        for p in pieces:
            p = p.replace("\u2581", "").lower()
            if p and not is_punct(p):
                out.add(p)
        return out

    a, b = clean(a_pieces), clean(b_pieces)
    union = a | b
    return len(a & b) / len(union) if union else 0.0
