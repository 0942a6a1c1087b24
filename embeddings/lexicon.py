"""Paraphrase lexicon from a paraphrase corpus by adjusted PMI (ParaNMT-50M, appendix A.1).

For word pairs (a, b), a in one side of a paraphrase pair and b in the other:

    cross PMI    = log p_cross(a, b) / (p(a) p(b))        co-occurrence across the two sides
    ordinary PMI = log p_same(a, b) / (p(a) p(b))         co-occurrence inside one sentence,
                                                           computed per side and averaged
    adjusted PMI = cross PMI - ordinary PMI

Words that merely co-occur in any sentence (topic words) get a high ordinary PMI and drop; words
that replace each other across paraphrases rank high. Pairs whose paraphrase score (encoder
cosine) is below a threshold and sentences over 30 tokens are dropped first.

    paragen-lexicon --input runs/example-output --model runs/example-encoder --min_score 0.5 \
        --output runs/lexicon.tsv
"""
from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from typing import Iterable

from common.text import tokenize


def _usable_pairs(pairs: Iterable[tuple[str, str]], max_tokens: int, encoder, min_score: float | None,
                  stats: Counter, batch: int = 2048):
    def flush(buf):
        if encoder is not None and min_score is not None and buf:
            scores = encoder.similarity([a for a, _, _, _ in buf], [b for _, b, _, _ in buf])
        else:
            scores = [None] * len(buf)
        for (_, _, t1, t2), sc in zip(buf, scores):
            if sc is not None and sc < min_score:
                stats["dropped_low_score"] += 1
                continue
            stats["used"] += 1
            yield t1, t2

    buf = []
    for a, b in pairs:
        stats["read"] += 1
        t1, t2 = tokenize(a, 10 * max_tokens), tokenize(b, 10 * max_tokens)
        if not t1 or not t2 or len(t1) > max_tokens or len(t2) > max_tokens:
            stats["dropped_length"] += 1
            continue
        buf.append((a, b, set(t1), set(t2)))
        if len(buf) == batch:
            yield from flush(buf)
            buf = []
    yield from flush(buf)


def adjusted_pmi(pairs, max_tokens: int = 30, min_count: int = 3, encoder=None, min_score: float | None = None,
                 smoothing: float = 1.0, skip_punct: bool = True) -> tuple[list[dict], Counter]:
    """Word pairs ranked by adjusted PMI. PAIRS must be re-iterable (two passes: the first counts
    cross-side co-occurrence, the second in-sentence co-occurrence of the candidate pairs only).
    MIN_COUNT: cross-side co-occurrences needed to be a candidate. SMOOTHING is added to the
    in-sentence counts so a pair that never shares a sentence gets a finite ordinary PMI."""
    stats = Counter()
    df = Counter()                     # sentences containing the word (both sides)
    side_df = (Counter(), Counter())
    cross = Counter()                  # unordered pair -> pairs with a on one side and b on the other
    n_pairs = 0

    def words(ts):
        return {t for t in ts if t[0].isalnum()} if skip_punct else ts

    for t1, t2 in _usable_pairs(pairs, max_tokens, encoder, min_score, stats):
        t1, t2 = words(t1), words(t2)
        n_pairs += 1
        df.update(t1)
        df.update(t2)
        side_df[0].update(t1)
        side_df[1].update(t2)
        for a in t1:
            for b in t2:
                if a != b:
                    cross[(a, b) if a < b else (b, a)] += 1
    candidates = {p for p, c in cross.items() if c >= min_count}
    same = (Counter(), Counter())
    stats2 = Counter()
    for t1, t2 in _usable_pairs(pairs, max_tokens, encoder, min_score, stats2):
        for side, ts in ((0, words(t1)), (1, words(t2))):
            ts = sorted(ts)
            for i, a in enumerate(ts):
                for b in ts[i + 1:]:
                    if (a, b) in candidates:
                        same[side][(a, b)] += 1
    if not n_pairs:
        return [], stats
    n_sent = 2 * n_pairs
    rows = []
    for (a, b) in candidates:
        p_a, p_b = df[a] / n_sent, df[b] / n_sent
        # a pair of sentences offers two orientations (a left/b right and the reverse)
        cross_pmi = math.log((cross[(a, b)] / (2 * n_pairs)) / (p_a * p_b))
        ordinary = []
        for side in (0, 1):
            pa, pb = side_df[side][a] / n_pairs, side_df[side][b] / n_pairs
            p_ab = (same[side][(a, b)] + smoothing) / (n_pairs + smoothing)
            ordinary.append(math.log(p_ab / (max(pa, 1 / n_pairs) * max(pb, 1 / n_pairs))))
        ordinary_pmi = sum(ordinary) / 2
        rows.append({"word1": a, "word2": b, "adjusted_pmi": cross_pmi - ordinary_pmi, "cross_pmi": cross_pmi,
                     "ordinary_pmi": ordinary_pmi, "cross_count": cross[(a, b)]})
    rows.sort(key=lambda r: (-r["adjusted_pmi"], r["word1"], r["word2"]))
    return rows, stats


def write_tsv(rows: list[dict], path: str) -> None:
    """ROWS as a TSV at PATH (a local path or a URL), written whole."""
    from common import storage

    lines = ["word1\tword2\tadjusted_pmi\tcross_pmi\tordinary_pmi\tcross_count\n"]
    lines += [f"{r['word1']}\t{r['word2']}\t{r['adjusted_pmi']:.4f}\t{r['cross_pmi']:.4f}\t"
              f"{r['ordinary_pmi']:.4f}\t{r['cross_count']}\n" for r in rows]
    storage.write_bytes(path, "".join(lines).encode("utf-8"))


def run(argv=None) -> int:
    from embeddings.data import PairSource
    from common import storage
    from common.cli import UsageError, check_output_location

    ap = argparse.ArgumentParser(prog="paragen-lexicon", description=__doc__, allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", required=True, metavar="PATH",
                    help="paraphrase Parquet (a run's output dir, a dir or a file) or a sentence1<TAB>sentence2 "
                         "file (required)")
    ap.add_argument("--columns", default="reference,paraphrase",
                    help="the two text columns of Parquet input (default reference,paraphrase)")
    ap.add_argument("--where", action="append", default=[],
                    help="row filter on Parquet input, repeatable, e.g. 'rank <= 2' (default: all rows)")
    ap.add_argument("--model", metavar="DIR",
                    help="encoder directory for the paraphrase score (needs --min_score; default: no score filter)")
    ap.add_argument("--min_score", type=float, help="drop pairs whose encoder cosine is below this (needs --model)")
    ap.add_argument("--max_tokens", type=int, default=30, help="drop pairs with a side longer than this (default 30)")
    ap.add_argument("--min_count", type=int, default=3,
                    help="cross-side co-occurrences a word pair needs (default 3)")
    ap.add_argument("--top", type=int, help="write only the best N pairs (default: all)")
    ap.add_argument("--output", required=True, metavar="FILE", help="TSV to write (required)")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing --output file (default: refuse)")
    a = ap.parse_args(argv)
    if (a.model is None) != (a.min_score is None):
        raise UsageError("--model and --min_score go together")
    if storage.exists(a.output) and not a.overwrite:
        raise UsageError(f"{a.output} exists; pass --overwrite to replace it")
    check_output_location(storage.parent(a.output), "--output's directory")
    try:
        source = PairSource(a.input, tuple(a.columns.split(",")), a.where)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    encoder = None
    if a.model:
        from models.sentence.sentence_encoder import load_encoder

        encoder = load_encoder(a.model)
    rows, stats = adjusted_pmi(source, a.max_tokens, a.min_count, encoder, a.min_score)
    write_tsv(rows[:a.top] if a.top else rows, a.output)
    print(f"{len(rows)} word pairs from {stats['used']} of {stats['read']} pairs "
          f"(dropped: {stats['dropped_length']} over {a.max_tokens} tokens or empty, "
          f"{stats['dropped_low_score']} below score {a.min_score}) -> {a.output}")
    for r in rows[:10]:
        print(f"  {r['word1']:>15} {r['word2']:<15} {r['adjusted_pmi']:.2f}")
    return 0


def main(argv=None) -> int:
    from common.cli import cli_main

    return cli_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
