"""Where training pairs come from: the generation (or filter) job's Parquet, or a TSV file.

Pairs are streamed in record batches and shuffled through a bounded buffer, so a 5M-pair corpus
never sits in Python lists. Every row is accounted for: ``PairSource.stats`` counts rows read,
used, and skipped by reason (null or empty side, malformed TSV line).
"""
from __future__ import annotations

import random
from collections import Counter
from typing import Iterator

from common import storage
from paracorpus.runs import open_input
from common.shards import bounded_lines, open_binary
from paracorpus.where import parse_where

MAX_LINE_BYTES = 100_000    # a TSV line longer than this is not a sentence pair: skipped, counted

def _is_text(path: str) -> bool:
    """A sentence-pair text file (or a glob of them) rather than Parquet or a run directory."""
    return storage.has_wildcards(path) or (storage.isfile(path) and not path.endswith(".parquet"))


class PairSource:
    """A re-iterable stream of (sentence1, sentence2) pairs.

    PATH (a local path or a URL): a generation or filter run (the files its manifest lists; its
    ``paraphrases/`` or ``scored/`` too), a directory of Parquet, a .parquet file, or a text file
    (``sentence1<TAB>sentence2``, optionally compressed; a glob matches several).
    COLUMNS names the two text columns of Parquet input; WHERE are filter clauses (see
    paracorpus/where.py).
    """

    def __init__(self, path: str, columns: tuple[str, str] = ("reference", "paraphrase"),
                 where: list[str] | None = None, max_pairs: int | None = None, batch_rows: int = 65536):
        self.path, self.columns, self.max_pairs, self.batch_rows = path, tuple(columns), max_pairs, batch_rows
        self.where = list(where or [])
        self.stats: Counter = Counter()
        self.generation_manifest = None     # the generation run's _manifest.json, when PATH is one
        if not _is_text(path):
            inp = open_input(path)
            if inp.kind == "generation":
                self.generation_manifest = inp.manifest
            self._dataset = storage.parquet_dataset(list(inp.files))
            missing = [c for c in self.columns if c not in self._dataset.schema.names]
            if missing:
                raise ValueError(f"{path}: no column {', '.join(missing)}; columns are "
                                 f"{', '.join(self._dataset.schema.names)}")
            self._filter = parse_where(self.where, self._dataset.schema)
        else:
            self._files = storage.glob(path) if storage.has_wildcards(path) else (
                [path] if storage.isfile(path) else [])
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
