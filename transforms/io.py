"""Reading input shards as a DoFn over an explicit shard list, and splitting tagged outputs.

Beam's own text sources rely on splittable DoFns that some runners (DaskRunner) do not
translate, so reading happens inside a plain DoFn per shard (through common/storage.py, so a
shard may be a local file or a bucket URL). Writing happens per work unit (transforms/units.py).
"""
from __future__ import annotations

import hashlib
import time

import apache_beam as beam

from common import storage
from paracorpus.cleaning import pair_id
from paracorpus.schema import READ_RECORD_KEYS, check_manifest, reject_row
from common.shards import ShardSpec, read_shard, shard_size
from transforms.progress import Progress

MAIN_TAG = "main"
REJECTS_TAG = "rejects"
COUNTS_TAG = "counts"


def _select(item, tag):
    if item[0] == tag:
        yield item[1]


class SplitTagged(beam.PTransform):
    """Split a stream of (tag, value) into one PCollection per tag.

    DoFns here emit (tag, value) pairs instead of using ParDo(...).with_outputs(): the DaskRunner
    collects every tagged output of a multi-output ParDo into one collection, mixing them up.
    """

    def __init__(self, tags=(MAIN_TAG, REJECTS_TAG)):
        super().__init__()
        self.tags = tags

    def expand(self, pcoll):
        return {tag: pcoll | f"Only_{tag}" >> beam.FlatMap(_select, tag) for tag in self.tags}


def read_record_path(work: str, shard_name: str) -> str:
    return storage.join(work, "read", f"{shard_name}.json")


class ReadShard(beam.DoFn):
    """ShardSpec -> (main, raw pair dict) | (rejects, reject row) | (counts, read record).

    The read record (records read, sha256 and size of the stored bytes, hashed while reading) is
    also written to WORK/read/<shard>.json: the left-hand side of the run's reconciliation."""

    def __init__(self, max_line_chars: int, src_column: str, tgt_column: str, config_hash: str, work: str,
                 fence=None):
        self.max_line_chars = max_line_chars
        self.src_column, self.tgt_column = src_column, tgt_column
        self.config_hash, self.work, self.fence = config_hash, work, fence

    def setup(self):
        self.progress = Progress("read", rate_of="records_read", unit="records")

    def process(self, spec: ShardSpec):
        n = 0
        digests = [hashlib.sha256() for _ in spec.paths] if spec.format != "parquet" else None
        for rec in read_shard(spec, self.max_line_chars, self.src_column, self.tgt_column, digests):
            n += 1
            self.progress.inc("records_read")
            pid = pair_id(rec.shard, rec.index, rec.source, rec.reference)
            record = {"pair_id": pid, "input_shard": rec.shard, "input_index": rec.index,
                      "source": rec.source, "reference": rec.reference}
            if rec.error:
                self.progress.inc(f"rejected_{rec.error}")
                yield (REJECTS_TAG, reject_row(record, "read", rec.error, rec.detail, self.config_hash))
            else:
                self.progress.inc("pairs_read")
                yield (MAIN_TAG, record)
        sha = [d.hexdigest() for d in digests] if digests else [storage.sha256(p) for p in spec.paths]
        record = {"input_shard": spec.name, "kind": spec.format, "paths": list(spec.paths), "records_read": n,
                  "sha256": sha, "bytes": shard_size(spec), "finished_at": time.time()}
        check_manifest(record, READ_RECORD_KEYS, "read record")
        if self.fence is not None:
            self.fence()                # the run still holds its output (paracorpus.commit.Fence)
        storage.write_json(read_record_path(self.work, spec.name), record, indent=None)
        self.progress.flush()
        yield (COUNTS_TAG, record)
