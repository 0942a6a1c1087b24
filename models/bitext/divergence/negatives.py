"""The synthetic training data: each corpus pair a positive, cross pairs that look like
translations on the surface (length ratio, dictionary coverage of both sides) as negatives, and
partial divergences of the positive itself (a span deleted, replaced or added on one side)."""
from __future__ import annotations

import random
from typing import Sequence

from models.bitext.divergence.lexicon import Dictionary, coverage, length_ratio


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
