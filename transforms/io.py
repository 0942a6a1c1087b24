"""File IO as DoFns over an explicit shard list.

Beam's own text sources rely on splittable DoFns that some runners (DaskRunner) do not
translate, so reading happens inside a plain DoFn per shard, and each output partition is
written by one DoFn call after a GroupByKey: a temporary file, then an atomic rename, so a
reader never sees a partial file and a retried bundle simply overwrites.
"""
from __future__ import annotations

import os

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq

from paracorpus.cleaning import pair_id
from paracorpus.names import check_lang_code
from paracorpus.atomic import replacing, write_json
from paracorpus.shards import ShardSpec, read_shard
from transforms.progress import Progress

MAIN_TAG = "main"
REJECTS_TAG = "rejects"
COUNTS_TAG = "counts"


def _select(item, kind):
    if item[0] == kind:
        yield item[1]


class SplitTagged(beam.PTransform):
    """Split a stream of (kind, value) into one PCollection per kind.

    DoFns here emit (kind, value) pairs instead of using ParDo(...).with_outputs(): the DaskRunner
    collects every tagged output of a multi-output ParDo into one collection, mixing them up.
    """

    def __init__(self, kinds=(MAIN_TAG, REJECTS_TAG)):
        super().__init__()
        self.kinds = kinds

    def expand(self, pcoll):
        return {kind: pcoll | f"Only_{kind}" >> beam.FlatMap(_select, kind) for kind in self.kinds}


class ReadShard(beam.DoFn):
    """ShardSpec -> (main, raw pair dict) | (rejects, reject row) | (counts, (shard, records read))."""

    def __init__(self, max_line_chars: int, src_column: str, tgt_column: str, config_hash: str):
        self.max_line_chars = max_line_chars
        self.src_column, self.tgt_column = src_column, tgt_column
        self.config_hash = config_hash

    def setup(self):
        self.progress = Progress("read")

    def process(self, spec: ShardSpec):
        n = 0
        for rec in read_shard(spec, self.max_line_chars, self.src_column, self.tgt_column):
            n += 1
            pid = pair_id(rec.shard, rec.index, rec.src, rec.tgt)
            if rec.error:
                self.progress.inc(f"rejected_{rec.error}")
                yield (REJECTS_TAG, {
                    "pair_id": pid, "input_shard": rec.shard, "input_index": rec.index,
                    "stage": "read", "reason": rec.error, "detail": rec.detail,
                    "source": None if rec.src is None else rec.src[:1000],
                    "reference": None if rec.tgt is None else rec.tgt[:1000],
                    "config_hash": self.config_hash})
            else:
                self.progress.inc("pairs_read")
                yield (MAIN_TAG, {"pair_id": pid, "input_shard": rec.shard, "input_index": rec.index,
                                  "source": rec.src, "reference": rec.tgt})
        yield (COUNTS_TAG, (spec.name, n))
        self.progress.flush()


def output_shard(pid: str, num_shards: int) -> int:
    return int(pid[:8], 16) % num_shards


def partition_dir(root: str, table: str, lang_pair: str, shard: int) -> str:
    src, _, tgt = lang_pair.partition("-")      # checked on the driver too; a path must never escape ROOT
    check_lang_code(src)
    check_lang_code(tgt)
    return os.path.join(root, table, f"lang_pair={lang_pair}", f"shard={shard:05d}")


def write_table_atomically(table: pa.Table, path: str) -> None:
    with replacing(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


class WritePartition(beam.DoFn):
    """((lang_pair, shard), rows) -> one Parquet file; rows sorted so reruns are byte-stable."""

    def __init__(self, root: str, table: str, schema: pa.Schema, sort_keys: tuple):
        self.root, self.table, self.schema, self.sort_keys = root, table, schema, sort_keys

    def process(self, element):
        (lang_pair, shard), rows = element
        rows = sorted(rows, key=lambda r: tuple(r[k] for k in self.sort_keys))
        table = pa.Table.from_pylist(rows, schema=self.schema)
        path = os.path.join(partition_dir(self.root, self.table, lang_pair, shard), "part-00000.parquet")
        write_table_atomically(table, path)
        yield (self.table, lang_pair, shard, len(rows))


class WriteCounts(beam.DoFn):
    """Per input shard, the number of records read: the left-hand side of the reconciliation."""

    def __init__(self, root: str):
        self.root = root

    def process(self, element):
        name, n = element
        write_json(os.path.join(self.root, "_counts", f"{name}.json"),
                   {"input_shard": name, "records_read": n}, indent=None)
        yield element
