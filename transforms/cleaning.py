"""Cleaning and deduplication DoFns: thin wrappers over paracorpus.cleaning."""
from __future__ import annotations

import apache_beam as beam

from paracorpus.cleaning import CleaningConfig, Rejection, clean_pair, dedup_key
from paracorpus.schema import reject_row
from transforms.io import MAIN_TAG, REJECTS_TAG
from transforms.progress import Progress


def _reject(rec: dict, stage: str, reason: str, detail: str, config_hash: str) -> tuple:
    return (REJECTS_TAG, reject_row(
        pair_id=rec["pair_id"], input_shard=rec["input_shard"], input_index=rec["input_index"],
        stage=stage, reason=reason, detail=detail, source=rec["source"][:1000],
        reference=rec["reference"][:1000], config_hash=config_hash))


class CleanPairs(beam.DoFn):
    def __init__(self, cfg: CleaningConfig, config_hash: str):
        self.cfg, self.config_hash = cfg, config_hash

    def setup(self):
        self.progress = Progress("clean")

    def process(self, rec: dict):
        out = clean_pair(rec["source"], rec["reference"], self.cfg)
        if isinstance(out, Rejection):
            self.progress.inc(f"rejected_{out.reason}")
            yield _reject(rec, "clean", out.reason, out.detail, self.config_hash)
            return
        self.progress.inc("pairs_clean")
        yield (MAIN_TAG, {**rec, "source": out[0], "reference": out[1]})


class KeepFirstOfDuplicates(beam.DoFn):
    """(dedup key, records) -> the first record by input position; the others are rejects."""

    def __init__(self, config_hash: str):
        self.config_hash = config_hash

    def setup(self):
        self.progress = Progress("dedup")

    def process(self, element):
        _key, recs = element
        recs = sorted(recs, key=lambda r: (r["input_shard"], r["input_index"]))
        yield (MAIN_TAG, recs[0])
        for dup in recs[1:]:
            self.progress.inc("rejected_duplicate")
            yield _reject(dup, "dedup", "duplicate", f"duplicate of pair {recs[0]['pair_id']}",
                          self.config_hash)


class Deduplicate(beam.PTransform):
    """Global deduplication of cleaned pairs; emits (kind, value) pairs like the DoFns."""

    def __init__(self, config_hash: str):
        super().__init__()
        self.config_hash = config_hash

    def expand(self, pairs):
        return (pairs
                | "KeyByText" >> beam.Map(lambda r: (dedup_key(r["source"], r["reference"]), r))
                | "GroupDuplicates" >> beam.GroupByKey()
                | "KeepFirst" >> beam.ParDo(KeepFirstOfDuplicates(self.config_hash)))
