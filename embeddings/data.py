"""Where training pairs come from: the generation (or filter) job's Parquet, or a TSV file.

Pairs are streamed in record batches and shuffled through a bounded buffer, so a 5M-pair corpus
never sits in Python lists. Every row is accounted for: ``PairSource.stats`` counts rows read,
used, and skipped by reason (null or empty side, malformed TSV line).
"""
from __future__ import annotations

import glob
import os
import random
from collections import Counter
from typing import Iterator

import pyarrow.dataset as ds

from paracorpus.schema import read_manifest
from paracorpus.shards import bounded_lines, open_binary
from paracorpus.where import parse_where

MAX_LINE_BYTES = 100_000    # a TSV line longer than this is not a sentence pair: skipped, counted

def _is_parquet(path: str) -> bool:
    return os.path.isdir(path) or path.endswith(".parquet")


class PairSource:
    """A re-iterable stream of (sentence1, sentence2) pairs.

    PATH: a directory of Parquet (Hive partitions, e.g. ``<generate --output>/paraphrases``, or the
    output directory itself, whose ``paraphrases/`` is used), a .parquet file, or a TSV file
    (``sentence1<TAB>sentence2``, optionally .gz; a glob matches several). COLUMNS names the two
    text columns of Parquet input; WHERE are filter clauses (see parse_where).
    """

    def __init__(self, path: str, columns: tuple[str, str] = ("reference", "paraphrase"),
                 where: list[str] | None = None, max_pairs: int | None = None, batch_rows: int = 65536):
        self.path, self.columns, self.max_pairs, self.batch_rows = path, tuple(columns), max_pairs, batch_rows
        self.where = list(where or [])
        self.stats: Counter = Counter()
        self.generation_manifest = None     # the generation run's _manifest.json, when PATH is one
        if _is_parquet(path):
            root = path
            if os.path.isdir(os.path.join(path, "paraphrases")):
                root = os.path.join(path, "paraphrases")
                self.generation_manifest = read_manifest(path) or {}
            if not os.path.exists(root):
                raise FileNotFoundError(f"{path}: no such file or directory")
            self._dataset = ds.dataset(root, format="parquet", partitioning="hive")
            missing = [c for c in self.columns if c not in self._dataset.schema.names]
            if missing:
                raise ValueError(f"{path}: no column {', '.join(missing)}; columns are "
                                 f"{', '.join(self._dataset.schema.names)}")
            self._filter = parse_where(self.where, self._dataset.schema)
        else:
            self._files = sorted(glob.glob(path)) or ([path] if os.path.exists(path) else [])
            if not self._files:
                raise FileNotFoundError(f"{path}: no such file or directory")
            if self.where:
                raise ValueError("--where filters apply to Parquet input, not to TSV files")
            self._dataset = None

    def __iter__(self) -> Iterator[tuple[str, str]]:
        self.stats = Counter()
        n = 0
        for s1, s2 in (self._parquet_pairs() if self._dataset is not None else self._tsv_pairs()):
            self.stats["read"] += 1
            if not s1 or not s2 or not s1.strip() or not s2.strip():
                self.stats["skipped_empty_side"] += 1
                continue
            self.stats["used"] += 1
            yield s1, s2
            n += 1
            if self.max_pairs is not None and n >= self.max_pairs:
                return

    def _parquet_pairs(self):
        a, b = self.columns
        scanner = self._dataset.scanner(columns=[a, b], filter=self._filter, batch_size=self.batch_rows)
        for batch in scanner.to_batches():
            yield from zip(batch.column(0).to_pylist(), batch.column(1).to_pylist())

    def _tsv_pairs(self):
        for path in self._files:
            with open_binary(path) as f:
                # bounded: one multi-gigabyte "line" is skipped without being held in memory
                for raw, overlong in bounded_lines(f, MAX_LINE_BYTES):
                    if overlong:
                        self.stats["skipped_overlong"] += 1
                        continue
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError:
                        self.stats["skipped_bad_utf8"] += 1
                        continue
                    fields = line.split("\t")
                    if len(fields) != 2:
                        self.stats["skipped_not_two_columns"] += 1
                        continue
                    yield fields[0], fields[1]

    def describe(self) -> str:
        cols = "" if self._dataset is None else f" columns {self.columns[0]},{self.columns[1]}"
        where = f" where {' and '.join(self.where)}" if self.where else ""
        return f"{self.path}{cols}{where}"


def shuffled(pairs, buffer_size: int, rng: random.Random) -> Iterator:
    """Streaming shuffle through a buffer of BUFFER_SIZE items (exact shuffle when the corpus fits)."""
    buf = []
    for p in pairs:
        if len(buf) < buffer_size:
            buf.append(p)
            continue
        i = rng.randrange(buffer_size)
        yield buf[i]
        buf[i] = p
    rng.shuffle(buf)
    yield from buf


def scramble(tokens: list[str], rate: float, rng: random.Random) -> list[str]:
    """With probability RATE, the tokens in a random order (ParaNMT's word scrambling); the bag of
    words never changes."""
    if rate > 0 and len(tokens) > 1 and rng.random() < rate:
        tokens = tokens[:]
        rng.shuffle(tokens)
    return tokens
