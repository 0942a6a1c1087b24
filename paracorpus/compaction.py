"""Output files sized for readers, whatever the work unit's or the input shard's size.

Work units commit their own small files (retries and ``--resume`` stay per unit), but a run of
50M pairs in units of 500 would publish 100,000 files per table: slow to list in a bucket, slow
for Spark, DuckDB or HF ``datasets`` to open, and a manifest of tens of MB. So before the run is
published, the files of each group, one bin of input shards (paracorpus/bins.py) in one output
partition, are rewritten into files of about ``--file_rows`` rows (default 1,000,000) or
``--file_mb`` MB (default 128): first the rows the group carries from the previous run (shards
not decoded again whose old bin changed, filtered by ``input_shard``), then its units' rows in
unit order. A group with a single unit file and nothing carried keeps that file.

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
from paracorpus.schema import CONTRACT_VERSION, GROUP_RECORD_KEYS, check_manifest, partition_dir
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


def group_key(bin_: str, partition: int) -> str:
    """The group a unit's (or carried rows') files are compacted in: a bin and an output partition."""
    return f"{bin_}\0{partition:05d}"


def group_name(bin_: str, partition: int) -> str:
    """A file-name-safe id of a group."""
    return hashlib.sha1(f"{bin_}\0{partition}".encode()).hexdigest()[:12]


def group_record_path(work: str, bin_: str, partition: int) -> str:
    return storage.join(work, "groups", f"{group_name(bin_, partition)}.json")


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
            # the file's schema says this contract version, also when its first rows were copied
            # from a file of an earlier one (the writer ignores the tables' own metadata)
            schema = table.schema.with_metadata({**(table.schema.metadata or {}),
                                                 b"contract_version": str(CONTRACT_VERSION).encode()})
            self._writer = pq.ParquetWriter(sink, schema, compression="zstd")
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


def read_row_groups(location: str, input_shards=None):
    """The row groups of the Parquet file at LOCATION, one at a time; only the rows of INPUT_SHARDS
    when given (a carried shard's rows, or its dedup keys, in a file it shares with shards that
    changed)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parquet = storage.parquet_file(location)
    for i in range(parquet.num_row_groups):
        data = parquet.read_row_group(i)
        if input_shards is not None:
            data = data.filter(pc.is_in(data["input_shard"], value_set=pa.array(sorted(input_shards))))
        yield data


def _rewrite(output: str, sources: list[tuple], directory: str, prefix: str, target: FileTarget) -> list[dict]:
    """The rows of SOURCES ((location, input shards to keep or None, rows, bytes) of Parquet files)
    as files of about TARGET under OUTPUT/DIRECTORY, named PREFIX-NNN.parquet; their manifest
    entries. At most a row group's rows in memory at a time."""
    rows = sum(s[2] for s in sources)
    per_file = target.rows_per_file(rows, sum(s[3] for s in sources))
    per_file = -(-rows // -(-rows // per_file)) if rows else per_file   # even files, not a full one and a stub
    files = _FileSeries(output, lambda n: f"{directory}/{prefix}-{n:03d}.parquet")
    for location, input_shards, _rows, _bytes in sources:
        for data in read_row_groups(location, input_shards):
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


def carry_item(table: str, location: str, input_shards: list[str], entry: dict) -> dict:
    """What a group copies from an earlier run: the rows of INPUT_SHARDS in the TABLE file at
    LOCATION (ENTRY: its manifest entry)."""
    return {"table": table, "location": location, "input_shards": sorted(input_shards),
            "rows": entry["rows"], "bytes": entry["bytes"]}


def unit_setups(records: list[dict]) -> list[dict]:
    """How RECORDS' units were decoded: one entry per worker, device, precision, decode step, MPS
    (on a GPU) and input shard, with its number of units (records of code before setups: all None)."""
    counted: Counter = Counter()
    for r in records:
        setup = r.get("setup") or {}
        counted[(r["worker"], setup.get("device"), setup.get("precision"), setup.get("decode_step"),
                 setup.get("mps"), r["input_shard"])] += 1
    return [{"worker": w, "device": d, "precision": p, "decode_step": s, "mps": m, "input_shard": n, "units": k}
            for (w, d, p, s, m, n), k in sorted(counted.items(), key=lambda kv: [str(x) for x in kv[0]])]


def compact_group(output: str, work: str, lang_pair: str, bin_: str, partition: int, unit_records: list[dict],
                  carries: list[dict], target: FileTarget, plan_key: str = "", fence=None) -> dict:
    """The record of one group, bin BIN_ in output partition PARTITION, after its unit files
    (UNIT_RECORDS: completion records of its units) and the rows it carries from an earlier run
    (CARRIES: carry_item) were rewritten as files of about TARGET: its files per table, counts
    (per input shard too), units and workers. A group compacted by an earlier attempt of the run
    from the same units and carries for the same plan (PLAN_KEY) is taken as it was (--resume);
    one of another plan never is. FENCE() (paracorpus.commit.Fence) runs before the files and
    before the record."""
    fence = fence or (lambda: None)
    records = sorted(unit_records, key=lambda r: r["unit"])
    carries = sorted(carries, key=lambda c: (c["table"], c["location"]))
    units = [r["unit"] for r in records]
    carried = sorted({n for c in carries for n in c["input_shards"]})
    signature = {"units": units, "carried_files": [[c["table"], c["location"], c["input_shards"]] for c in carries],
                 "plan_key": plan_key}
    path = group_record_path(work, bin_, partition)
    if storage.isfile(path):
        earlier = storage.read_json(path)
        if {k: earlier.get(k) for k in signature} == signature:
            return {**earlier, "reused_group": True}
    fence()
    start = time.time()
    attempt = attempt_id()
    directory = {t: f"{t}/{partition_dir(lang_pair, partition)}" for t in TABLES}
    input_shards = sorted({r["input_shard"] for r in records} | set(carried))
    files = {}
    for table in TABLES:
        entries = [e for r in records for e in r["files"].get(table, [])]
        copied = [(c["location"], c["input_shards"], c["rows"], c["bytes"]) for c in carries if c["table"] == table]
        if len(entries) <= 1 and not copied:        # one unit file: published as it is
            files[table] = [{k: e[k] for k in ("path", "rows", "bytes")} for e in entries]
        else:
            sources = copied + [(storage.join(output, e["path"]), None, e["rows"], e["bytes"]) for e in entries]
            files[table] = _rewrite(output, sources, directory[table],
                                    f"part-s{group_name(bin_, partition)}-{attempt}", target)
        for e in files[table]:
            e.update(bin=bin_, shard=partition)
    per_worker: Counter = Counter()
    seconds: Counter = Counter()
    by_shard: dict = {}
    for r in records:
        per_worker[r["worker"]] += 1
        by_shard.setdefault(r["input_shard"], []).append(r)
        if not r.get("reused"):
            seconds[r["worker"]] += r["seconds"]
    record = {"bin": bin_, "shard": partition, "input_shards": input_shards, "carried": carried, **signature,
              "files": files,
              "counts": sum_counts(records, ("records", "pairs_with_paraphrases", "paraphrase_rows", "rejected")),
              "counts_per_shard": {n: sum_counts(rs) for n, rs in sorted(by_shard.items())},
              "counters": dict(sum((Counter(r.get("counters", {})) for r in records), Counter())),
              "setups": unit_setups(records),
              "per_worker": dict(per_worker), "decoding_seconds_per_worker": {w: round(s, 3) for w, s in seconds.items()},
              "reused_units": sum(1 for r in records if r.get("reused")),
              "unit_files": sum(len(r["files"].get(t, [])) for r in records for t in TABLES),
              "compaction_seconds": round(time.time() - start, 3),
              "compacted_by": f"{socket.gethostname()}:{os.getpid()}"}
    check_manifest(record, GROUP_RECORD_KEYS, "group record")
    fence()
    storage.write_json(path, record, indent=None)
    return record
