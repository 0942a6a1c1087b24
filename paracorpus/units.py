"""Work units: the generation job's pieces of decoding work, and what one unit does.

Every input shard gets about ``records / unit_pairs`` units (``plan_units``), and each of its
records belongs to one of them, chosen by a hash of its pair id (``unit_of``). So decoding
spreads over many keys whatever the number of output files, a retry or a resume redoes one unit,
a unit's rows fit in one worker's memory, and every unit (and file) comes from one input shard,
which is what lets a later run reuse the output of a shard that did not change. A unit writes
into the output partition its input shard's name and its index there hash to (``partition_of_unit``;
on disk a partition is a ``<lang pair>/NNNNN`` directory, the contract's ``lang_pair`` and ``shard``
columns).

:func:`generate_unit` is the whole per-unit algorithm as a plain function (decode in batches,
with a failing batch retried pair by pair so one bad pair becomes a reject, not a failed unit);
:func:`write_unit` writes its rows under names no other attempt uses and returns the unit's
completion record. The Beam DoFns in transforms/units.py only call these.
"""
from __future__ import annotations

import bisect
import hashlib
import math
import os
import socket
import time
from collections import Counter
from dataclasses import dataclass, field

from common import storage
from common.steps import run_steps
from models.nmt.devices import DeviceFailure, is_fatal_device_error, is_out_of_memory, release_cached_memory
from paracorpus.cleaning import CleanPair, dedup_key
from paracorpus.commit import attempt_id
from paracorpus.schema import (DEDUP, PARAPHRASES, REJECTS, UNIT_COUNT_KEYS, UNIT_RECORD_KEYS, check_manifest,
                               partition_dir, reject_row)

DEFAULT_UNIT_PAIRS = 500
MAX_FILE_ROWS = 1_000_000     # a unit's table rolls over to a new file past this many rows
PAIR, REJECT, UNIT = "pair", "reject", "unit"     # element tags; UNIT marks a unit (no record)


def plan_units(expected: dict[str, int], unit_pairs: int) -> dict[str, tuple[int, int]]:
    """{input shard: (first unit, number of units)}: about EXPECTED records / UNIT_PAIRS units
    per input shard (at least one), numbered shard after shard in name order."""
    layout, first = {}, 0
    for name in sorted(expected):
        n = max(1, math.ceil(expected[name] / max(unit_pairs, 1)))
        layout[name] = (first, n)
        first += n
    return layout


def unit_of(input_shard: str, pair_id: str, layout: dict) -> int:
    """The unit a record belongs to: one of its input shard's units, by a hash of its pair id
    (independent of the output partition)."""
    first, n = layout[input_shard]
    return first + int(pair_id[8:16] or pair_id, 16) % n


def input_shard_of(unit: int, layout: dict) -> str:
    """The input shard unit UNIT belongs to."""
    names = sorted(layout, key=lambda name: layout[name][0])
    at = bisect.bisect_right([layout[name][0] for name in names], unit) - 1
    return names[at]


def partition_of_unit(unit: int, layout: dict, num_output_shards: int) -> int:
    """The output partition unit UNIT writes into: a hash of its input shard and its index there,
    so a shard's rows land in the same partitions whatever other shards a run has."""
    name = input_shard_of(unit, layout)
    local = unit - layout[name][0]
    return int(hashlib.sha1(f"{name}\0{local}".encode()).hexdigest()[:8], 16) % num_output_shards


def unit_name(unit: int) -> str:
    return f"u{unit:06d}"


@dataclass
class UnitResult:
    rows: list = field(default_factory=list)          # paraphrase rows (schema.PARAPHRASES)
    rejects: list = field(default_factory=list)       # reject rows (schema.REJECTS)
    kept: list = field(default_factory=list)          # dedup rows of the pairs the unit decoded (schema.DEDUP)
    counters: Counter = field(default_factory=Counter)
    setup: dict = field(default_factory=dict)         # how it was decoded: device, precision, decode_step


def _clean_pair(rec: dict) -> CleanPair:
    return CleanPair(rec["pair_id"], rec["input_shard"], rec["input_index"], rec["source"], rec["reference"])


def _decode_batch(pairs: list[CleanPair], steps: list, config_hash: str, out: UnitResult) -> None:
    """PAIRS through STEPS; their rows, rejects and counters go into OUT only once the whole batch
    succeeded."""
    result = run_steps(steps, pairs)
    out.rows += result.rows
    out.rejects += [reject_row(r.item, r.stage, r.reason, r.detail, config_hash) for r in result.rejects]
    out.counters.update(result.counters)


def _raise_if_fatal(exc: Exception) -> None:
    """A device error other than out-of-memory ends the unit (and the worker): its pairs are not
    rejects, and a poisoned process must not decode on (models/nmt/devices.py)."""
    if is_fatal_device_error(exc):
        raise DeviceFailure(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]) from exc


def generate_unit(elements: list, steps: list, batch_pairs: int, config_hash: str, on_batch=None) -> UnitResult:
    """Rows and rejects of one unit. ELEMENTS are (PAIR, cleaned record) and (REJECT, reject row)
    items; pairs go through STEPS (paracorpus.steps.decoding_steps) in batches of BATCH_PAIRS in
    pair-id order, so a unit always gives the same rows. A batch that raises (an error in
    decoding, running out of memory) is retried one pair at a time, and a pair that fails alone is
    rejected as 'decode_error'; a device error other than out-of-memory raises DeviceFailure
    instead (the worker must end). ON_BATCH(number of pairs) is called after each batch (progress)."""
    out = UnitResult()
    out.rejects += [row for tag, row in elements if tag == REJECT]
    pairs = sorted((_clean_pair(rec) for tag, rec in elements if tag == PAIR), key=lambda p: p.pair_id)
    out.kept = [DEDUP.row(dedup_key=dedup_key(p.source, p.reference), pair_id=p.pair_id, input_shard=p.input_shard,
                          input_index=p.input_index) for p in pairs]
    for start in range(0, len(pairs), batch_pairs):
        batch = pairs[start:start + batch_pairs]
        try:
            _decode_batch(batch, steps, config_hash, out)
        except Exception as exc:  # noqa: BLE001: isolate the pair that fails, below
            _raise_if_fatal(exc)
            if is_out_of_memory(exc):
                out.counters["batches_out_of_memory"] += 1
                release_cached_memory()
            out.counters["batches_retried_pair_by_pair"] += 1
            for pair in batch:
                try:
                    _decode_batch([pair], steps, config_hash, out)
                except Exception as exc:  # noqa: BLE001: any failure of one pair is that pair's reject
                    _raise_if_fatal(exc)
                    detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
                    out.rejects.append(reject_row(pair, "generate", "decode_error", detail, config_hash))
        if on_batch is not None:
            on_batch(len(batch))
    out.counters["paraphrases"] = len(out.rows)
    return out


def _write_table(output: str, contract, rows: list, lang_pair: str, partition: int, unit: int,
                 attempt: str, written: list[str] | None = None) -> list[dict]:
    """ROWS as Parquet under OUTPUT/<table>/<lang pair>/<partition>/ (schema.partition_dir),
    MAX_FILE_ROWS per file, each named after the unit and attempt; their manifest entries. Each
    file's path is added to WRITTEN (when given) once it is whole."""
    import pyarrow.parquet as pq

    if not rows:
        return []
    rel_dir = f"{contract.name}/{partition_dir(lang_pair, partition)}"
    entries = []
    for seq, start in enumerate(range(0, len(rows), MAX_FILE_ROWS)):
        chunk = rows[start:start + MAX_FILE_ROWS]
        name = f"part-{unit_name(unit)}-{attempt}" + (f"-{seq:03d}" if len(rows) > MAX_FILE_ROWS else "") + ".parquet"
        rel = f"{rel_dir}/{name}"
        path = storage.join(output, rel)
        table = contract.partitioned(chunk, lang_pair, partition)
        with storage.open_output(path) as f:
            pq.write_table(table, f, compression="zstd")
        if written is not None:
            written.append(path)
        entries.append({"path": rel, "rows": table.num_rows, "bytes": storage.size(path)})
    return entries


def write_unit(output: str, work: str, unit: int, partition: int, lang_pair: str, result: UnitResult,
               seconds: float, input_shard: str, plan_key: str = "", fence=None) -> dict:
    """Write a unit's paraphrases and rejects (sorted, so reruns write the same bytes) and then its
    completion record WORK/units/<unit>.json, which names the plan it was decoded for (PLAN_KEY);
    returns that record. FENCE() (paracorpus.commit.Fence) runs before the files and again
    before the record: a worker whose run lost its output writes nothing more, and the files it
    wrote before a refusal (this look's, or the process's write fence at a later table) are
    removed before the refusal is raised."""
    fence = fence or (lambda: None)
    fence()
    attempt = attempt_id()
    rows = sorted(result.rows, key=lambda r: (r["pair_id"], r["rank"]))
    rejects = sorted(result.rejects, key=lambda r: (r["input_shard"], r["input_index"]))
    kept = sorted(result.kept, key=lambda r: r["dedup_key"])
    written: list[str] = []
    try:
        files = {"paraphrases": _write_table(output, PARAPHRASES, rows, lang_pair, partition, unit, attempt, written),
                 "rejects": _write_table(output, REJECTS, rejects, lang_pair, partition, unit, attempt, written),
                 "dedup": _write_table(output, DEDUP, kept, lang_pair, partition, unit, attempt, written)}
        for entries in files.values():
            for e in entries:
                e["input_shard"] = input_shard
        reasons = Counter(r["reason"] for r in rejects)
        record = {"unit": unit, "input_shard": input_shard, "shard": partition, "attempt": attempt, "files": files,
                  "counts": {"records": len({r["pair_id"] for r in rows}) + len(rejects),
                             "pairs_with_paraphrases": len({r["pair_id"] for r in rows}),
                             "paraphrase_rows": len(rows), "rejected": len(rejects),
                             "rejected_by_reason": dict(sorted(reasons.items()))},
                  "counters": dict(result.counters), "worker": f"{socket.gethostname()}:{os.getpid()}",
                  "setup": dict(result.setup),
                  "seconds": round(seconds, 3), "finished_at": time.time(), "plan_key": plan_key}
        check_manifest(record, UNIT_RECORD_KEYS, "unit record")
        check_manifest(record["counts"], UNIT_COUNT_KEYS, "unit counts")
        fence()
    except Exception:
        # refused (the run lost OUTPUT while these files were written: a worker paused past a
        # takeover) or failed: they are this attempt's alone and no run lists them; the new
        # holder's clean-up ran before they existed, so nothing but this would remove them
        for path in written:
            storage.take_back(path)
        raise
    storage.write_json(unit_record_path(work, unit), record, indent=None)
    return record


def unit_record_path(work: str, unit: int) -> str:
    return storage.join(work, "units", f"{unit_name(unit)}.json")


def unit_of_record(name: str) -> int | None:
    """The unit whose completion record is called NAME (``u000042.json``, ``u1250000.json``: six
    digits at least, more past 999,999), or None for any other name (a staged ``.u….tmp``)."""
    digits = name[1:-len(".json")] if name.startswith("u") and name.endswith(".json") else ""
    return int(digits) if len(digits) >= 6 and digits.isascii() and digits.isdigit() else None


def finished_units(work: str) -> set[int]:
    """Units of the run whose completion record exists (for --resume)."""
    units = (unit_of_record(name) for name in storage.listdir(storage.join(work, "units")))
    return {unit for unit in units if unit is not None}


def sum_counts(records: list[dict], keys=("pairs_with_paraphrases", "paraphrase_rows", "rejected")) -> dict:
    """The sums of KEYS and of the reject reasons over the ``counts`` of RECORDS (unit or group
    records)."""
    reasons: Counter = Counter()
    out = dict.fromkeys(keys, 0)
    for rec in records:
        for key in out:
            out[key] += rec["counts"][key]
        reasons.update(rec["counts"]["rejected_by_reason"])
    out["rejected_by_reason"] = dict(sorted(reasons.items()))
    return out


def summarize_run(group_records: list[dict], read_records: list[dict]) -> tuple[dict, dict, dict, dict]:
    """(counts, files, units, per shard) of a run from its groups' records (paracorpus/compaction.py:
    a bin's units in one output partition, compacted) and its shards' read records: the
    reconciliation (records read = pairs with paraphrases + rejected), the files the manifest
    lists, which worker decoded how many units and how long compaction took, and per input shard
    it decoded its records read and counts. Its size grows with the groups, not the units."""
    per_worker: Counter = Counter()
    busy: Counter = Counter()
    by_shard: dict[str, list] = {}
    reused = written = unit_files = 0
    compaction = 0.0
    files: dict = {t: [] for t in ("paraphrases", "rejects", "dedup")}
    for rec in sorted(group_records, key=lambda r: (r["bin"], r["shard"])):
        for name, counts in rec["counts_per_shard"].items():
            by_shard.setdefault(name, []).append({"counts": counts})
        for table in files:
            files[table] += rec["files"].get(table, [])
        per_worker.update(rec["per_worker"])
        busy.update(rec["decoding_seconds_per_worker"])
        reused += rec["reused_units"]
        written += len(rec["units"])
        unit_files += rec["unit_files"]
        compaction += rec["compaction_seconds"]
    shards = {read["input_shard"]: {"records_read": read["records_read"],
                                    "counts": sum_counts(by_shard.get(read["input_shard"], []))}
              for read in read_records}
    counts = totals(shards)
    units = {"written": written, "reused_from_earlier_attempt": reused,
             "per_worker": dict(sorted(per_worker.items())),
             "decoding_seconds_per_worker": {w: round(s, 1) for w, s in sorted(busy.items())},
             "unit_files": unit_files, "published_files": sum(len(v) for v in files.values()),
             "compaction_seconds": round(compaction, 2)}
    return counts, files, units, shards


def record_counters(group_records: list[dict], counts: dict) -> dict:
    """The run's counters from what it wrote, the same on every runner (Beam's metrics are not
    reported by the Dask runner): its units' counters summed (their decoding, the workers' warm-up
    and compilation; units an earlier attempt decoded included), the records read and the rejects
    by reason (COUNTS: totals())."""
    summed: Counter = Counter()
    for rec in group_records:
        summed.update(rec.get("counters", {}))
    summed["records_read"] = counts["records_read"]
    for reason, n in counts["rejected_by_reason"].items():
        summed[f"rejected_{reason}"] = n
    return dict(sorted(summed.items()))


def run_setups(group_records: list[dict]) -> dict:
    """How the run's units were decoded, from its groups' records: the workers of each device and
    precision ({"cpu_fp32": 2}) and of each decode step, the units of each precision, the
    precisions each input shard's units were decoded in (units of code before setups: none), and
    the workers that decoded on a GPU under an MPS server and without one ({"mps": 4, "no_mps": 0};
    {} when none decoded on a GPU)."""
    workers, steps, gpu = {}, {}, {}
    units: Counter = Counter()
    per_shard: dict = {}
    for rec in group_records:
        for s in rec.get("setups", []):
            if s["precision"] is None:
                continue
            workers.setdefault(f"{s['device']}_{s['precision']}", set()).add(s["worker"])
            if s["decode_step"]:
                steps.setdefault(s["decode_step"], set()).add(s["worker"])
            if s["device"] == "cuda":
                gpu.setdefault("mps" if s.get("mps") else "no_mps", set()).add(s["worker"])
            units[s["precision"]] += s["units"]
            per_shard.setdefault(s["input_shard"], Counter())[s["precision"]] += s["units"]
    return {"workers": {k: len(v) for k, v in sorted(workers.items())},
            "decode_steps": {k: len(v) for k, v in sorted(steps.items())},
            "units": dict(sorted(units.items())),
            "per_shard": {n: dict(sorted(c.items())) for n, c in sorted(per_shard.items())},
            "gpu_workers": {k: len(gpu.get(k, ())) for k in ("mps", "no_mps")} if gpu else {}}


def totals(shards: dict) -> dict:
    """The run's counts from its shards' (SHARDS: name -> {"records_read", "counts"})."""
    reasons: Counter = Counter()
    sums = {"pairs_with_paraphrases": 0, "paraphrase_rows": 0, "rejected": 0}
    for entry in shards.values():
        for key in sums:
            sums[key] += entry["counts"][key]
        reasons.update(entry["counts"]["rejected_by_reason"])
    read = {name: entry["records_read"] for name, entry in sorted(shards.items())}
    total = sum(read.values())
    return {"records_read": total, "records_read_per_shard": read, **sums,
            "rejected_by_reason": dict(sorted(reasons.items())),
            "reconciled": total == sums["pairs_with_paraphrases"] + sums["rejected"]}
