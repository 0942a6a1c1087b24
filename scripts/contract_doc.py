"""Write docs/contract.md, the output contract, from the contract module (paracorpus/schema.py).

    .venv/bin/python scripts/contract_doc.py --write docs/contract.md   # regenerate the file
    .venv/bin/python scripts/contract_doc.py --check docs/contract.md   # exit 1 if it is stale
    .venv/bin/python scripts/contract_doc.py                            # print it

Every table, column, type, reject reason and manifest key comes from paracorpus/schema.py. The
manifest keys' meanings are written here (KEY_DOCS); a key the contract adds without a meaning
here is an error, so the document cannot fall behind the module. tests/test_docs.py checks that
the file is what this script writes, byte for byte.
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from paracorpus import schema  # noqa: E402

# Meaning of every key the contract requires in a manifest or bookkeeping record.
KEY_DOCS = {
    "manifest": {
        "contract_version": "the contract version the run was written with",
        "run_id": "the run's id (UTC time plus a random part, or `--run_id`)",
        "config_hash": "hash of everything that decides the rows: generation settings, cleaning settings, "
                       "preset, precision, the models' fingerprints, the bitext filter's thresholds",
        "config": "the generation settings (preset values with the command line's overrides)",
        "models": "per model (`forward`, `backward`, `bitext_encoder`, `bitext_mlp`, `divergence`): its path, "
                  "the sha256 of each of its files and a fingerprint",
        "inputs": "per input shard: kind, paths, sha256, bytes, records read, counts, `decoded_in` (the run "
                  "that decoded it) and `bin` (the bin of input shards whose files hold its rows)",
        "counts": "records read (in total and per input shard), pairs with paraphrases, paraphrase rows, "
                  "rejected (in total and by reason), `reconciled`",
        "files": "per table (`paraphrases`, `rejects`, `dedup`): the files of the run, each "
                 "`{path, rows, bytes, bin, shard}` (`shard`: the output partition; the input shards of the "
                 "`bin` are those whose `inputs` entry names it)",
        "units": "work units planned, written and reused, units and decoding seconds per worker; unit files written, "
                 "files published after compaction, compaction seconds; `failed_attempts`: how many attempts at a "
                 "unit failed in a worker (over every attempt of the run; the counter `unit_attempts_failed` too) "
                 "and `failures`, the first 20 in words (unit, worker, what it was doing, the error's first line)",
        "versions": "versions of Python, paragen, Beam, torch, fairseq, sentencepiece and pyarrow",
        "command": "the command line",
        "finished_at": "when the run finished (UTC, ISO 8601)",
    },
    "filter manifest": {
        "contract_version": "the contract version the run was written with",
        "run_id": "the filter run's id",
        "input": "the generation run (or Parquet) that was filtered",
        "input_run_id": "the generation run's id (null for plain Parquet)",
        "config": "the filter config as read (filters, parameters, thresholds)",
        "rows_in": "rows read",
        "rows_out": "rows written (every input row is written, kept or not)",
        "kept": "rows no rule rejected",
        "files": "`scored` (each `{path, rows, bytes}`), `fitted` (the models fitted on the sample) and "
                 "`report` files",
        "reconciled": "rows in = rows out",
        "versions": "package versions, as in the generation manifest",
        "command": "the command line",
    },
    "read record": {
        "input_shard": "the input shard's name",
        "kind": "`tsv`, `moses` or `parquet`",
        "paths": "its file (two for a Moses pair)",
        "records_read": "records read, rejects included (the left-hand side of the reconciliation)",
        "sha256": "sha256 of each file, hashed while reading",
        "bytes": "its size",
    },
    "unit record": {
        "unit": "the work unit's number",
        "input_shard": "the input shard the unit belongs to",
        "shard": "the output partition it wrote into",
        "attempt": "the attempt id in its files' names",
        "files": "its files per table, as in the manifest",
        "counts": "see the unit counts below",
        "counters": ("what its decoding counted: candidates, pairs, milliseconds per stage; the first unit a "
                     "worker process wrote also its warm-up and up-front compilation (`ms_warm_up`, `ms_compile`)"),
        "worker": "`host:pid` of the worker that decoded it",
        "setup": "how that worker decoded it: `device` (`cpu`, `cuda`), `precision` as it resolved it, `decode_step`",
        "seconds": "decoding time",
    },
    "group record": {
        "bin": "the bin of input shards the group compacts",
        "shard": "the output partition",
        "input_shards": "the input shards whose rows its files hold",
        "carried": "the input shards whose rows it copied from the previous run (not decoded again)",
        "units": "the group's unit numbers, in order",
        "carried_files": "the previous run's files it copied rows from: table, location, input shards",
        "files": "the group's files per table after compaction, as in the manifest",
        "counts": "the sums of its units' counts",
        "counts_per_shard": "the sums of its units' counts per input shard",
        "counters": "the sums of its units' counters",
        "setups": "its units per worker, device, precision, decode step and input shard",
        "per_worker": "units per `host:pid` of the worker that decoded them",
        "decoding_seconds_per_worker": "decoding time per worker (units decoded by this attempt)",
        "reused_units": ("units an earlier attempt finished (the same command run again continues a stopped run; "
                         "on Dask, a task run again after its worker was lost)"),
        "unit_files": "the unit files compaction read",
        "compaction_seconds": "time spent rewriting them",
    },
    "unit counts": {
        "records": "records of the unit",
        "pairs_with_paraphrases": "pairs that got at least one paraphrase",
        "paraphrase_rows": "paraphrase rows written",
        "rejected": "reject rows written",
        "rejected_by_reason": "reject rows per reason",
    },
}

KEY_LISTS = {"manifest": schema.MANIFEST_KEYS, "filter manifest": schema.FILTER_MANIFEST_KEYS,
             "read record": schema.READ_RECORD_KEYS, "unit record": schema.UNIT_RECORD_KEYS,
             "unit counts": schema.UNIT_COUNT_KEYS, "group record": schema.GROUP_RECORD_KEYS}


def key_table(what: str) -> str:
    docs = KEY_DOCS[what]
    missing = [k for k in KEY_LISTS[what] if k not in docs]
    if missing:
        raise SystemExit(f"scripts/contract_doc.py: no meaning for {what} key(s) {missing}: add them to KEY_DOCS")
    lines = ["| key | meaning |", "|---|---|"]
    lines += [f"| `{key}` | {docs[key]} |" for key in KEY_LISTS[what]]
    return "\n".join(lines)


def table_notes(table) -> str:
    optional = [n for n in table.names if n in table.optional]
    notes = [f"Partition columns: {', '.join(f'`{c}`' for c in schema.PARTITION_COLUMNS)} (also the directory "
             "names; stored in the files too)."]
    notes.append("May be null: " + (", ".join(f"`{c}`" for c in optional) if optional else "none") +
                 "; every other column is required (paracorpus.schema.Table.row refuses a row without it).")
    return " ".join(notes)


def reasons_table() -> str:
    lines = ["| reason | meaning |", "|---|---|"]
    lines += [f"| `{reason}` | {doc} |" for reason, doc in schema.REJECT_REASONS.items()]
    return "\n".join(lines)


def layout() -> str:
    part = f"{schema.partition_dir('cs-en', 1)}/part-s7641412d41c6-1e7c1389-000.parquet"
    lines = [(f"OUT/{schema.PARAPHRASES.name}/{part}", "paraphrase rows of one bin of input shards in partition 1"),
             (f"OUT/{schema.REJECTS.name}/{part}", "their rejected input records"),
             (f"OUT/{schema.DEDUP.name}/{part}", "dedup keys of the pairs they decoded"),
             (f"OUT/{schema.MANIFEST}", "written last: lists every file of the run"),
             (f"OUT/_log/<n>-{schema.MANIFEST}", "its versions, each created once: the newest is the truth"),
             ("OUT/_log/<n>-_owner.json", "the claim of the run writing here (its versions)"),
             ("OUT/_work/<run id>/", "bookkeeping of a run in progress (removed when it commits)")]
    width = max(len(path) for path, _ in lines) + 3
    return "\n".join(f"{path.ljust(width)}{what}" for path, what in lines)


def render() -> str:
    p, r, d = schema.PARAPHRASES, schema.REJECTS, schema.DEDUP
    return f"""# Output contract

<!-- Generated by scripts/contract_doc.py from paracorpus/schema.py. Do not edit by hand:
     .venv/bin/python scripts/contract_doc.py --write docs/contract.md -->

Contract version **{schema.CONTRACT_VERSION}**. The filter and embedding jobs read these tables, so a
change is a breaking change: columns are added, never renamed or retyped, and the version goes up.
Names used here (source, reference, input shard, output partition, work unit) are defined in
[architecture.md](architecture.md#names).

## Layout of a generation run

```
{layout()}
```

`cs-en/00001` is an output partition: the language pair, then the partition number
(`--num_output_shards` of them per language pair). Directory names are not `key=value` on
purpose: readers that infer Hive partitions from such names (pandas, polars, Spark) would add the
partition columns a second time with another type, and these columns are in the files already.

Work units write their own files (`part-u<unit>-<attempt>.parquet`). Input shards are packed, in
name order, into *bins* of at least `--file_rows` x `--num_output_shards` records (a shard larger
than that is a bin of its own; only the last bin is smaller). Before the run is published, each
bin's unit files in a partition are rewritten into files of at most `--file_rows` rows (1,000,000)
or `--file_mb` MB (128), `part-s<group>-<attempt>-<n>.parquet`; a group of one unit keeps its
unit's file. So a table has about one file per `--file_rows` rows, however small the units or the
input shards. A file name holds the attempt that wrote it, so no two attempts write the same name.
A file holds rows of its bin's input shards (those whose `inputs` entry names its `bin`; each row's
`input_shard` column says which), and the manifest's `inputs` name each shard's `bin`.

A refresh (`--previous`) keeps a bin's files, by reference, when every shard in it is unchanged
and the bin is full. The unchanged shards of any other bin (one of its shards changed or was
removed, or it is the under-full last bin) are copied: their rows are read out of the old files,
filtered by `input_shard`, and written into the new run's files with the new and changed shards'
rows; they are not decoded again (`previous.copied_shards` in the manifest).

## Reading a run

Only the files `{schema.MANIFEST}` lists belong to the run. A file of a dead attempt, or of a run
the new one replaced, may sit beside them for a moment; a directory without a manifest is not a
corpus. Each entry's `path` opens as `<the manifest's directory>/<path>`, or is a full URL:

- the run's own files: `paraphrases/cs-en/00001/part-....parquet`;
- a file an earlier run wrote and this one reuses (an incremental run, a refresh): on a disk
  `../<that run>/paraphrases/...`; in a bucket, under the run or else the full `gs://`/`s3://` URL
  (keys have no `..`);
- a refresh root's `ROOT/latest/` is a directory holding a copy of the current run's manifest
  whose paths open from there, so `ROOT/latest` reads like any run, on a disk or in a bucket;
  `ROOT/latest.json` names the run (`"run_id"`, `"path": "runs/<run id>"`) and, when it has a
  filter run, that run's folder (`"filtered": "filtered/<run id>"`, or `filtered/<run id>.<plan
  key>` for a later filter run made with other filter options).

What a reader may rely on (`common/storage/versions.py`; a run written before versions has no
`_log/`, and its `_manifest.json` is the truth):

- **The truth is the newest version** in `_log/` (`<20-digit n>-_manifest.json`, the highest n;
  `latest` likewise under a refresh root). Versions are created once, whole, and never changed.
  `_manifest.json`, `latest.json` and `ROOT/latest/` are copies of it, each written whole after it:
  a reader that opens one sees one version or the next, never a mix. A copy can lag its log: for
  the instant between a version and its copy, and after a writer stopped there until the next
  start repairs it; a reader that must see the newest reads the highest version.
- **What a reader opened stays readable for `--retain` hours** (default 24) under a refresh root:
  retention removes a run only when no kept run, no view and no version of `latest` written in
  that time references it, and never while its claim is alive. Outside a refresh, a run's own
  `--overwrite` removes the files the replaced manifest listed once the new one is published: a
  reader of the old manifest then has to open the new one.
- Files a manifest lists are never replaced or changed: every one has a name no other attempt
  uses.

The list of a table's files, with nothing but the standard library (`OUT` is a run directory or
`ROOT/latest`):

```python
import json
OUT = "runs/example-output"
manifest = json.load(open(f"{{OUT}}/{schema.MANIFEST}"))
files = [p if "://" in p else f"{{OUT}}/{{p}}" for p in (f["path"] for f in manifest["files"]["paraphrases"])]
```

Then any Parquet reader. The partition columns are stored in the files, so every reader sees the
same columns and types:

```python
import pyarrow.parquet as pq
table = pq.read_table(files)
```

```python
import duckdb
best = duckdb.read_parquet(files).filter("rank = 1").df()
```

```python
import polars as pl
frame = pl.read_parquet(files)
```

```python
import pandas as pd
frame = pd.read_parquet(files)
```

```python
import datasets
corpus = datasets.load_dataset("parquet", data_files=files, split="train")
```

The project's own helper does the same for bucket URLs too (`gs://`, `s3://`):

```python
from paracorpus.commit import committed_files
from common import storage
files = committed_files(OUT, "paraphrases")
table = storage.parquet_dataset(files).to_table()
```

Manifests of contract 2 named a reused file by a `root` beside its path;
`paracorpus.commit.file_location` still reads them.

Counts reconcile: records read = pairs with at least one paraphrase + rejected records. A run
whose counts do not is not published (the previous run stays) and the job exits with status 1. A
run with no paraphrase row (every record rejected, or none read) is not published either, unless
`--allow_empty`: the job names the top reject reasons and exits with status 3, so a scheduler can
tell it from a mistake in the options (status 2).

## Table `{p.name}`

One row per paraphrase kept.

{schema.markdown_table(p.columns)}

{table_notes(p)}

### What a pair's rows depend on

With the fairseq engine a pair's rows depend on the pair, the two models, the settings in
`config_hash` and `--seed`, and on nothing else: not on the pairs decoded beside it, the batch or
work-unit size, torch's thread count, which process, worker or runner decoded it, or the load on
the machine. Its samples are drawn from counter-based random numbers keyed by the pair id
(models/nmt/decoding/device_random.py), and each source gets its own length limit in beam search.
The float scores (`forward_nll`, `backward_nll`, `combined_score`) are sums computed in batches,
and a batch of another shape may round them differently: they agree to 1e-5 nats (1.8e-7 measured
on the tiny test models); in the same batches, another process or another thread count gives the
same bits. Where it cannot hold exactly: two candidates of one pair whose combined scores differ by
less than that rounding can swap `rank` (or which one represents a cluster) between runs with
different batch sizes; everything else in the row is the same. tests/test_batch_independence.py
checks all of this (three unit sizes, two batch sizes, one and two threads, another process;
sampling and beam). So `--batch_pairs` is hashed as its default (64) in `config_hash` with this
engine: a run decoded with 64 pairs a batch on a CPU and continued with 256 on a GPU, or a refresh
on either, is one plan, its units reused, not decoded again.

With the CTranslate2 engine the randomness is per work unit (a fresh generator seeded by the seed
and the unit: [models.md](models.md)): the same units and batches give the same rows whatever the
thread count or process (tests/test_ct2_engine.py), but a pair's samples depend on the other pairs
of its unit, so `--unit_pairs` and `--batch_pairs` are part of what a run's rows depend on (and
`--batch_pairs` of its `config_hash`). Beam
search with it does not depend on batch-mates (int8 scores to 2e-3: it quantizes per batch).

## Table `{r.name}`

One row per input record that did not yield a paraphrase.

{schema.markdown_table(r.columns)}

{table_notes(r)}

### Reject reasons

`{r.name}.reason` is one of these (`paracorpus.schema.REJECT_REASONS`):

{reasons_table()}

## Table `{d.name}`

One row per pair that passed deduplication (its first occurrence), paraphrased or not: what a
later incremental run deduplicates new pairs against, without reading the old text again.

{schema.markdown_table(d.columns)}

{table_notes(d)}

## Table `scored` (filter job)

`OUT/scored/<lang pair>/<partition>/<input file>-<attempt>.parquet`, one file per input file, one
row per input row: every input column, then one float64 column per score of the configured
filters (named after the score; see [architecture.md](architecture.md#the-filter-job)), then:

{schema.markdown_table(schema.SCORED_COLUMNS)}

A score that could not be computed for a row (no parse, no `forward_nll`) is null; its rule lets
the row pass, and the filter manifest counts such rows per score (`unscored_by_score`). Read the
files `{schema.FILTER_MANIFEST}` lists (`committed_files(OUT, "scored", "{schema.FILTER_MANIFEST}")`),
or give the run directory to the embedding job or `filtering.tune`.

## Manifests

Each job publishes its run by writing its manifest last. These keys are always there
(`paracorpus.schema.check_manifest` refuses a manifest without one).

### `{schema.MANIFEST}` (generation job)

{key_table("manifest")}

The job also records the preset, the cleaning settings, the runner, the device, `precision`
(requested, resolved by the driver where it can tell, the worker processes per device and
precision they resolved, the units decoded in each, and `mixed`: true when the run's rows, those
reused from an earlier run included, were decoded in more than one precision, which the job also
says in a warning; each `inputs` entry it decoded names its units' precisions), torch threads per
worker, `previous` (for an incremental run), the counters (summed from the unit records, the same
on every runner, units of an earlier attempt included, with the records read and the rejects by
reason), whether it was resumed, its `plan_key` (what the same command run again compares: the
config hash, the input shards to decode and their sizes, the unit size, the previous run and the
bins), its seconds, and `slurm` (with `--slurm_workers`; else null): the
worker jobs' name, their ids, how many ran, failed starts, excluded nodes, `worker_job_hours` and
`gpu_hours` (the jobs' running time as the driver's looks at the queue saw it, to within one look,
times their GPUs).

### `{schema.FILTER_MANIFEST}` (filter job)

{key_table("filter manifest")}

It also records the generation run's `input_config_hash`, the rules, rows rejected per reason
(`rejected_by_reason`), rows without a score per score (`unscored_by_score`), the fit sample's
size, seconds, rows/s and the counters.

## Bookkeeping records (`OUT/_work/<run id>/`)

A run in progress keeps one read record per input shard (`read/<shard>.json`), one completion
record per finished work unit (`units/u<unit>.json`, what a rerun of the same command reads) and one record per
compacted group (`groups/<group>.json`: a bin's units, and the rows it copies from the previous
run, in one output partition, rewritten into files sized for readers; a resumed run keeps the
groups it finds). The driver
reads the group records, not the unit records, so what it holds grows with the groups. They are
removed when the run commits.

### Read record

{key_table("read record")}

### Unit record

{key_table("unit record")}

### Unit counts

{key_table("unit counts")}

### Group record

{key_table("group record")}
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--write", metavar="FILE", help="write the document here (e.g. docs/contract.md)")
    group.add_argument("--check", metavar="FILE", help="exit 1 when FILE differs from what --write would write")
    opts = ap.parse_args(argv)
    text = render()
    if opts.write:
        with open(opts.write, "w", encoding="utf-8") as f:
            f.write(text)
    elif opts.check:
        with open(opts.check, encoding="utf-8") as f:
            if f.read() != text:
                print(f"{opts.check} is stale: run scripts/contract_doc.py --write {opts.check}", file=sys.stderr)
                return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
