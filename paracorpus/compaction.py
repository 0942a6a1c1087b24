"""Output files sized for readers, whatever the work unit's size.

Work units commit their own small files (retries and ``--resume`` stay per unit), but a run of
50M pairs in units of 500 would publish 100,000 files per table: slow to list in a bucket, slow
for Spark, DuckDB or HF ``datasets`` to open, and a manifest of tens of MB. So before the run is
published, the unit files of each group, one input shard's units in one output partition, are
rewritten into files of about ``--file_rows`` rows (default 1,000,000) or ``--file_mb`` MB
(default 128), in unit order. A group stays within one input shard, so a later incremental run
can still take an unchanged shard's files as they are (paracorpus/incremental.py). A group whose
every table already fits in one file keeps its unit's files.

Compaction is part of the commit (paracorpus/commit.py): compacted files get names no other
attempt uses, and each group's record (its files and counts) is written to
``OUT/_work/<run>/groups/`` once its files are whole. The manifest, written last, lists the
compacted files; publishing then removes the unit files. A crash during compaction leaves the
previous run as it was (no manifest changed), and ``--resume`` finds every unit finished, keeps
the groups whose record exists and compacts the others again.
"""
from __future__ import annotations

import hashlib
import os
import socket
import time
from collections import Counter
from dataclasses import dataclass

from common import storage
from paracorpus.commit import attempt_id
from paracorpus.schema import GROUP_RECORD_KEYS, check_manifest, partition_dir
from paracorpus.units import sum_counts

TABLES = ("paraphrases", "rejects", "dedup")
DEFAULT_FILE_ROWS = 1_000_000
DEFAULT_FILE_MB = 128


@dataclass(frozen=True)
class FileTarget:
    """How big a published file may grow: ROWS rows or MEGABYTES MB (Parquet, compressed), whichever
    comes first."""
    rows: int = DEFAULT_FILE_ROWS
    megabytes: float = DEFAULT_FILE_MB

    def __post_init__(self):
        if self.rows < 1 or not self.megabytes > 0:
            raise ValueError(f"file target must be >= 1 row and > 0 MB, not {self.rows} rows, {self.megabytes} MB")

    def rows_per_file(self, rows: int, size: int) -> int:
        """Rows per file for inputs of ROWS rows in SIZE bytes (their bytes per row estimate the output's)."""
        per_row = size / max(rows, 1)
        return max(1, min(self.rows, int(self.megabytes * (1 << 20) / max(per_row, 1e-9))))


def group_key(unit_record: dict) -> str:
    """The group a unit's files are compacted in: its input shard and output partition."""
    return f"{unit_record['input_shard']}\0{unit_record['shard']:05d}"


def group_name(input_shard: str, partition: int) -> str:
    """A file-name-safe id of a group (input shard names may be long or odd)."""
    return hashlib.sha1(f"{input_shard}\0{partition}".encode()).hexdigest()[:12]


def group_record_path(work: str, input_shard: str, partition: int) -> str:
    return storage.join(work, "groups", f"{group_name(input_shard, partition)}.json")


ROW_GROUP_ROWS = 131_072         # rows per Parquet row group in a compacted file


class _FileSeries:
    """Writes NAME_OF(n).parquet files one after another under OUTPUT, each whole or not at all
    (common.storage.open_output), and remembers their manifest entries. Units' small tables are
    held until they make a row group of ROW_GROUP_ROWS rows: readers split work and read
    statistics per row group, and a unit's few thousand rows would make thousands of them."""

    def __init__(self, output: str, name_of, row_group_rows: int = ROW_GROUP_ROWS):
        self.output, self.name_of, self.row_group_rows = output, name_of, row_group_rows
        self.entries: list[dict] = []
        self._stack = None
        self._writer = None
        self._pending: list = []
        self._pending_rows = 0
        self.rows = 0

    @property
    def open(self) -> bool:
        return self._writer is not None

    def write(self, table) -> None:
        import contextlib

        import pyarrow.parquet as pq

        if self._writer is None:
            self._name = self.name_of(len(self.entries))
            self._stack = contextlib.ExitStack()
            sink = self._stack.enter_context(storage.open_output(storage.join(self.output, self._name)))
            self._writer = pq.ParquetWriter(sink, table.schema, compression="zstd")
            self.rows = 0
        self._pending.append(table)
        self._pending_rows += table.num_rows
        self.rows += table.num_rows
        if self._pending_rows >= self.row_group_rows:
            self._write_pending()

    def _write_pending(self) -> None:
        import pyarrow as pa

        if self._pending:
            self._writer.write_table(pa.concat_tables(self._pending), row_group_size=self.row_group_rows)
        self._pending, self._pending_rows = [], 0

    def close(self) -> None:
        if self._writer is not None:
            self._write_pending()
            self._writer.close()
            self._stack.close()                   # the file appears whole here
            self.entries.append({"path": self._name, "rows": self.rows,
                                 "bytes": storage.size(storage.join(self.output, self._name))})
            self._writer = self._stack = None


def _rewrite(output: str, entries: list[dict], directory: str, prefix: str, target: FileTarget) -> list[dict]:
    """The unit files ENTRIES as files of about TARGET under OUTPUT/DIRECTORY, named
    PREFIX-NNN.parquet; their manifest entries. At most a row group's rows in memory at a time."""
    per_file = target.rows_per_file(sum(e["rows"] for e in entries), sum(e["bytes"] for e in entries))
    files = _FileSeries(output, lambda n: f"{directory}/{prefix}-{n:03d}.parquet")
    for entry in entries:
        data = storage.parquet_file(storage.join(output, entry["path"])).read()
        offset = 0
        while offset < data.num_rows:
            take = min(per_file - files.rows if files.open else per_file, data.num_rows - offset)
            files.write(data.slice(offset, take))
            offset += take
            if files.rows >= per_file:
                files.close()
        del data
    files.close()
    return files.entries


def compact_group(output: str, work: str, lang_pair: str, unit_records: list[dict], target: FileTarget) -> dict:
    """The record of one group (UNIT_RECORDS: the completion records of one input shard's units in
    one output partition) after its unit files were rewritten as files of about TARGET: its files
    per table, counts, units and workers. A group compacted by an earlier attempt of the run with
    the same units is taken as it was (--resume)."""
    records = sorted(unit_records, key=lambda r: r["unit"])
    input_shard, partition = records[0]["input_shard"], records[0]["shard"]
    units = [r["unit"] for r in records]
    path = group_record_path(work, input_shard, partition)
    if storage.isfile(path):
        earlier = storage.read_json(path)
        if earlier.get("units") == units:
            return {**earlier, "reused_group": True}
    start = time.time()
    attempt = attempt_id()
    directory = {t: f"{t}/{partition_dir(lang_pair, partition)}" for t in TABLES}
    files = {}
    for table in TABLES:
        entries = [e for r in records for e in r["files"].get(table, [])]
        if len(entries) <= 1:                   # one unit file: published as it is
            files[table] = [{k: e[k] for k in ("path", "rows", "bytes")} for e in entries]
        else:
            files[table] = _rewrite(output, entries, directory[table],
                                    f"part-s{group_name(input_shard, partition)}-{attempt}", target)
        for e in files[table]:
            e["input_shard"] = input_shard
    per_worker: Counter = Counter()
    seconds: Counter = Counter()
    for r in records:
        per_worker[r["worker"]] += 1
        if not r.get("reused"):
            seconds[r["worker"]] += r["seconds"]
    record = {"input_shard": input_shard, "shard": partition, "units": units, "files": files,
              "counts": sum_counts(records, ("records", "pairs_with_paraphrases", "paraphrase_rows", "rejected")),
              "counters": dict(sum((Counter(r.get("counters", {})) for r in records), Counter())),
              "per_worker": dict(per_worker), "decoding_seconds_per_worker": {w: round(s, 3) for w, s in seconds.items()},
              "reused_units": sum(1 for r in records if r.get("reused")),
              "unit_files": sum(len(r["files"].get(t, [])) for r in records for t in TABLES),
              "compaction_seconds": round(time.time() - start, 3),
              "compacted_by": f"{socket.gethostname()}:{os.getpid()}"}
    check_manifest(record, GROUP_RECORD_KEYS, "group record")
    storage.write_json(path, record, indent=None)
    return record
