"""Global deduplication of cleaned pairs (a grouping by dedup key, so not a per-batch step);
cleaning itself is paracorpus.steps.CleanStep through transforms/steps.py."""
from __future__ import annotations

import apache_beam as beam

from paracorpus.cleaning import dedup_key
from paracorpus.schema import reject_row
from transforms.io import MAIN_TAG, REJECTS_TAG
from transforms.progress import Progress


class KeepFirstOfDuplicates(beam.DoFn):
    """(dedup key, records) -> the first record by input position; the others are rejects. When an
    earlier run already kept a pair with this key ("previous" rows: its dedup table), every new
    record with it is a duplicate of that one."""

    def __init__(self, config_hash: str):
        self.config_hash = config_hash

    def setup(self):
        self.progress = Progress("dedup")

    def process(self, element):
        _key, items = element
        previous = [row for tag, row in items if tag == "previous"]
        recs = sorted((r for tag, r in items if tag == "new"), key=lambda r: (r["input_shard"], r["input_index"]))
        if previous:                 # kept by an earlier run: published, it keeps its place
            kept = min(previous, key=lambda r: (r["input_shard"], r["input_index"]))
            dups = recs
        elif recs:
            kept = recs[0]
            yield (MAIN_TAG, kept)
            dups = recs[1:]
        else:
            return
        why = f"duplicate of pair {kept['pair_id']} ({kept['input_shard']}:{kept['input_index']})"
        for dup in dups:
            self.progress.inc("rejected_duplicate")
            yield (REJECTS_TAG, reject_row(dup, "dedup", "duplicate", why, self.config_hash))


def _previous_rows(source):
    """(dedup key, ("previous", row)) for every row of an earlier run's dedup file; SOURCE: (its
    path, the input shards whose rows count or None for all)."""
    from paracorpus.compaction import read_row_groups

    path, input_shards = source
    for data in read_row_groups(path, input_shards):
        for row in data.select(["dedup_key", "pair_id", "input_shard", "input_index"]).to_pylist():
            yield row["dedup_key"], ("previous", row)


class Deduplicate(beam.PTransform):
    """Global deduplication of cleaned pairs, also against the dedup files (PREVIOUS_FILES: (path,
    input shards whose rows count or None)) of the shards an incremental run reuses; emits (tag,
    value) pairs like the DoFns."""

    def __init__(self, config_hash: str, previous_files: list[tuple] | None = None):
        super().__init__()
        self.config_hash, self.previous_files = config_hash, list(previous_files or [])

    def expand(self, pairs):
        new = pairs | "KeyByText" >> beam.Map(lambda r: (dedup_key(r["source"], r["reference"]), ("new", r)))
        previous = (pairs.pipeline | "PreviousDedupFiles" >> beam.Create(self.previous_files)
                    | "PreviousKeys" >> beam.FlatMap(_previous_rows))
        return ((new, previous) | "NewAndPrevious" >> beam.Flatten()
                | "GroupDuplicates" >> beam.GroupByKey()
                | "KeepFirst" >> beam.ParDo(KeepFirstOfDuplicates(self.config_hash)))
