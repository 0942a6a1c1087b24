"""Words and which words translate which: the tokenizer every side of the detector shares, word
alignments of a parallel corpus (fast_align's model, both directions; or eflomal), and the
bilingual dictionary made of every aligned word pair, as in the authors' code (SemDiverge)."""
from __future__ import annotations

import html
import math
import os
import re
import tempfile
import unicodedata
from collections import Counter
from typing import Iterable, NamedTuple, Sequence

MAX_CHARS = 5000            # hostile input: a line is cut to this many characters before tokenising
MAX_TOKENS = 80             # and to this many tokens before it reaches the model (the cube is L1 x L2)

_TOKEN = re.compile(r"\w+|[^\w\s]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_QUOTES = str.maketrans({"\u2019": "'", "\u2018": "'", "`": "'", "\u00b4": "'"})


def tokenize(text: str, max_tokens: int | None = None) -> list[str]:
    """Lower-cased words and single punctuation marks. The training corpus is Moses-tokenised with
    HTML escapes ("l&apos; an", "austria &apos;s") and the development sets are raw text
    ("l'an", "c ’ est"): unescaping, one apostrophe and splitting every mark off makes both give
    the same tokens ("l ' an"), so dictionary and vocabulary lookups agree."""
    text = html.unescape(unicodedata.normalize("NFKC", (text or "")[:MAX_CHARS]))
    toks = _TOKEN.findall(_CONTROL.sub(" ", text.lower().translate(_QUOTES)))
    return toks if max_tokens is None else toks[:max_tokens]


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
