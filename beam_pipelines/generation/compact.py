"""The compact stage of the generation pipeline, and the summary that closes it.

Unit files are many and small (one per work unit, table and output partition); readers want few
files of a known size. ``Compact`` gathers the completion records of a bin's units in one output
partition (a bin: input shards packed to a file's worth per partition, paracorpus/bins.py), with
the previous run's files whose rows an incremental run copies, and rewrites them as files of
``--file_rows`` rows or ``--file_mb`` MB (paracorpus/compaction.py). ``WriteRunSummary`` gathers
every group record and read record into WORK/summary.json for the driver.
"""
from __future__ import annotations

import apache_beam as beam

from common import storage
from paracorpus.compaction import FileTarget, group_key


class Compact(beam.PTransform):
    """Unit completion records -> one group record per (bin, output partition), its files rewritten
    into files sized for readers. BINS: input shard -> bin; CARRIES: (group key, carry item) of the
    rows copied from the previous run."""

    def __init__(self, output: str, work: str, lang_pair: str, bins: dict, carries: list,
                 file_target: FileTarget = FileTarget(), plan_key: str = "", fence=None):
        super().__init__()
        self.output, self.work, self.lang_pair = output, work, lang_pair
        self.bins, self.carries, self.file_target, self.plan_key = bins, carries, file_target, plan_key
        self.fence = fence

    def expand(self, unit_records):
        from transforms.units import CompactGroup    # here: it pulls in torch, which the commit phase never needs

        bins = self.bins
        by_group = unit_records | "KeyUnitsByGroup" >> beam.Map(
            lambda r: (group_key(bins[r["input_shard"]], r["shard"]), ("unit", r)))
        carried = unit_records.pipeline | "CarriedFiles" >> beam.Create(
            [(key, ("carry", item)) for key, item in self.carries])
        return ((by_group, carried) | "UnitsAndCarried" >> beam.Flatten()
                | "GroupUnitsByFile" >> beam.GroupByKey()
                | "CompactGroups" >> beam.ParDo(CompactGroup(self.output, self.work, self.lang_pair, self.file_target,
                                                             self.plan_key, self.fence)))


class WriteRunSummary(beam.PTransform):
    """{"groups": group records, "reads": read records} -> WORK/summary.json; one element, the
    number of records. One sink that depends on everything: the DaskRunner computes only the graph
    behind the last transform of the pipeline."""

    def __init__(self, work: str, fence=None):
        super().__init__()
        self.work, self.fence = work, fence

    def expand(self, records):
        return ((records["groups"] | "TagGroups" >> beam.Map(lambda r: ("group", r)),
                 records["reads"] | "TagReads" >> beam.Map(lambda r: ("read", r)))
                | "AllRecordsOfTheRun" >> beam.Flatten()
                | "KeyRun" >> beam.Map(lambda r: (None, r))
                | "GroupRun" >> beam.GroupByKey()
                | "WriteSummary" >> beam.Map(write_summary, self.work, self.fence))


def write_summary(keyed, work: str, fence=None) -> int:
    records = list(keyed[1])
    summary = {"groups": [r for tag, r in records if tag == "group"], "reads": [r for tag, r in records if tag == "read"]}
    if fence is not None:
        fence()
    storage.write_json(storage.join(work, "summary.json"), summary, indent=None)
    return len(records)


def read_summary(work: str) -> dict:
    """What WriteRunSummary wrote ({"groups", "reads"}), or empty lists when nothing was written."""
    path = storage.join(work, "summary.json")
    return storage.read_json(path) if storage.isfile(path) else {"groups": [], "reads": []}
