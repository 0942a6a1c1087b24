"""Randomised negative lexical constraints (ParaBank 2 §2.2).

For each pair, S sets of words are drawn from the English reference; decoding under a set may
never produce any of its words, which pushes the samples away from the reference's wording.
Drawing is seeded by (seed, pair id, set index) so a pair gets the same sets on every worker.
"""
from __future__ import annotations

import hashlib
import random
import unicodedata

# Draws of a set that repeats an earlier set of the pair before the repeat is kept (few words
# leave few distinct sets; a bound keeps a 1-word reference from looping).
SET_DRAW_ATTEMPTS = 8


def constraint_words(reference: str) -> list[str]:
    """Candidate words to ban: whitespace tokens with a letter or digit, first occurrence only."""
    seen, words = set(), []
    for tok in reference.split():
        word = "".join(ch for ch in tok if not unicodedata.category(ch).startswith("P"))
        if not word or not any(ch.isalnum() for ch in word):
            continue
        key = word.lower()
        if key not in seen:
            seen.add(key)
            words.append(word)
    return words


def _rng(seed: int, pair_id: str, set_index: int) -> random.Random:
    digest = hashlib.blake2b(f"{seed}\x00{pair_id}\x00{set_index}".encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little"))


def draw_constraint_sets(reference: str, num_sets: int, seed: int, pair_id: str,
                         max_words: int = 3) -> list[tuple[str, ...]]:
    """S sets of 1..max_words distinct reference words (empty sets if the reference has no words).

    Sets are distinct while the reference has enough words to make them so.
    """
    words = constraint_words(reference)
    if not words:
        return [() for _ in range(num_sets)]
    sets: list[tuple[str, ...]] = []
    for s in range(num_sets):
        rng = _rng(seed, pair_id, s)
        chosen: tuple[str, ...] = ()
        for _attempt in range(SET_DRAW_ATTEMPTS):
            size = rng.randint(1, min(max_words, len(words)))
            chosen = tuple(sorted(rng.sample(words, size), key=words.index))
            if chosen not in sets:
                break
        sets.append(chosen)
    return sets
