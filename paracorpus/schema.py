"""The output contract of the jobs: every table's columns, types, meaning and required columns,
one row builder per table, and the manifests that publish them.

Downstream jobs (filter, embedding training) read these tables, so changing a column here is a
breaking change: add columns, never rename or retype them, and bump CONTRACT_VERSION.

Layout under a generation run's ``--output`` (a local directory or a bucket URL)::

    paraphrases/<src>-<tgt>/<NNNNN>/part-s<group>-<attempt>-<NNN>.parquet   one row per paraphrase
    rejects/<src>-<tgt>/<NNNNN>/part-s<group>-<attempt>-<NNN>.parquet       one row per rejected record
    dedup/<src>-<tgt>/<NNNNN>/part-s<group>-<attempt>-<NNN>.parquet         dedup keys of the pairs decoded
    _manifest.json    written last: the files of the run, inputs, models, config, counts

(a group whose rows came from a single work unit keeps that unit's ``part-u<unit>-<attempt>.parquet``).

Only the files the manifest lists belong to the run (paracorpus/commit.py): read them with
``paracorpus.commit.committed_files(output, "paraphrases")`` or any Parquet reader given that list.
The partition columns ``lang_pair`` and ``shard`` are stored in the files, and the directories
are deliberately not named ``key=value``: readers that infer Hive partitions from such names
(pandas, Spark, polars) would add the same columns again with another type (pandas: "string vs
dictionary"). So every reader sees the files' columns and nothing else.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

# 2: partition columns stored in the files; files listed by the manifest.
# 3: no key=value directory names; every manifest path opens as <manifest's directory>/<path>
#    (or is a full URL), no "root".
# 4: files are per bin of input shards (paracorpus/bins.py), not per input shard: every file
#    entry has "bin" and "shard" (its output partition); every inputs entry has its "bin".
CONTRACT_VERSION = 4
MANIFEST = "_manifest.json"     # written last by the generation job
FILTER_MANIFEST = "_filter_manifest.json"   # written last by the filter job

# (name, type, meaning). Order is the column order in the files.
PARAPHRASE_COLUMNS: list[tuple[str, pa.DataType, str]] = [
    ("pair_id", pa.string(), "stable id of the input pair: hash of input shard name, record index and text"),
    ("src_lang", pa.string(), "language code of the foreign side (e.g. cs)"),
    ("tgt_lang", pa.string(), "language code of the English side (e.g. en)"),
    ("source", pa.string(), "foreign sentence after cleaning (what was back-translated)"),
    ("reference", pa.string(), "English reference after cleaning"),
    ("paraphrase", pa.string(), "back-translated English candidate selected as a paraphrase of the reference"),
    ("rank", pa.int32(), "1 = best; rank among the paraphrases kept for this pair, by combined score"),
    ("cluster_id", pa.int32(), "Levenshtein k-means cluster of this candidate (0 is the reference cluster, never output)"),
    ("cluster_size", pa.int32(), "number of surviving candidates in that cluster"),
    ("forward_nll", pa.float32(), "per-token NLL of the paraphrase given the source, forward (src->tgt) model"),
    ("backward_nll", pa.float32(), "per-token NLL of the source given the paraphrase, backward (tgt->src) model; null without one"),
    ("combined_score", pa.float32(), "mean of forward_nll and backward_nll (forward_nll alone without a backward model); lower is better"),
    ("constraint_set", pa.list_(pa.string()), "English words banned while sampling this candidate (empty in beam mode)"),
    ("constraint_set_id", pa.int32(), "index of the constraint set (0..S-1) this candidate was sampled under; -1 in beam mode"),
    ("num_sampled", pa.int32(), "distinct candidates decoded for this pair (all sets, all samples)"),
    ("num_surviving", pa.int32(), "candidates left after the dual-score threshold"),
    ("mode", pa.string(), "decoding mode: 'sample' (ParaBank 2) or 'beam' (ParaNMT)"),
    ("config_hash", pa.string(), "hash of the generation config (models, preset, thresholds, seed)"),
    ("input_shard", pa.string(), "file name of the input shard the pair came from"),
    ("input_index", pa.int64(), "0-based record index of the pair inside its input shard"),
    ("lang_pair", pa.string(), "partition: <src_lang>-<tgt_lang> (also the directory name)"),
    ("shard", pa.int32(), "partition: output shard number (also the directory name)"),
]

REJECT_COLUMNS: list[tuple[str, pa.DataType, str]] = [
    ("pair_id", pa.string(), "stable id of the input record (same scheme as paraphrases.pair_id)"),
    ("input_shard", pa.string(), "file name of the input shard"),
    ("input_index", pa.int64(), "0-based record index inside the shard"),
    ("stage", pa.string(), "pipeline stage that rejected it: read, clean, dedup, bitext_filter, segment, dual_xent, generate"),
    ("reason", pa.string(), "machine-readable reason, one of REJECT_REASONS"),
    ("detail", pa.string(), "human-readable detail (e.g. the offending character, the score)"),
    ("source", pa.string(), "foreign side as read, truncated to 1,000 characters; null if unreadable"),
    ("reference", pa.string(), "English side as read, truncated to 1,000 characters; null if unreadable"),
    ("config_hash", pa.string(), "hash of the generation config"),
    ("lang_pair", pa.string(), "partition: <src_lang>-<tgt_lang> (also the directory name)"),
    ("shard", pa.int32(), "partition: output shard number (also the directory name)"),
]

REJECT_REASONS = {
    "bad_utf8": "the line or cell is not valid UTF-8",
    "missing_column": "a TSV line without a tab, a Parquet row with a null side, or a Moses file shorter than its twin",
    "extra_column": "a TSV line with more than one tab",
    "overlong_line": "the raw record exceeds max_line_chars; it is not parsed further",
    "read_error": "the input shard could not be read past this record (truncated or corrupt file); the records before it were kept, the rest of the shard is this one row",
    "empty_src": "foreign side empty after cleaning",
    "empty_tgt": "English side empty after cleaning",
    "control_chars": "a side contains control characters other than whitespace, or bidi/tag format characters that reorder or hide text",
    "not_encodable_src": "foreign side not encodable in its language's charset (ParaBank 2 rule)",
    "not_encodable_tgt": "English side not encodable in its language's charset",
    "too_long_src": "foreign side has more than max_tokens tokens",
    "too_long_tgt": "English side has more than max_tokens tokens",
    "length_ratio": "token length ratio between the sides exceeds max_length_ratio",
    "too_many_pieces_src": "foreign side has more sentencepiece pieces than max_pieces (or than the models' positions allow)",
    "too_many_pieces_tgt": "English side has more sentencepiece pieces than max_pieces (or than the models' positions allow)",
    "duplicate": "same cleaned pair seen before (detail names the pair id kept)",
    "bitext_similarity": "the bitext filter: the bilingual-embedding cosine (or MLP probability) of the pair below the threshold (detail: the score)",
    "divergent": "the bitext filter: the divergence detector's P(equivalent) of the pair below the threshold (detail: the score)",
    "dual_xent": "dual conditional cross-entropy of the pair above the threshold",
    "no_candidates": "no candidate survived the dual-score threshold",
    "no_paraphrase": "every surviving candidate fell into the reference cluster",
    "decode_error": "decoding this pair raised an error (out of memory, a bug) even when retried alone; detail says which",
}


DEDUP_COLUMNS: list[tuple[str, pa.DataType, str]] = [
    ("dedup_key", pa.string(), "key of the cleaned pair (case- and whitespace-insensitive hash of both sides)"),
    ("pair_id", pa.string(), "the pair kept for this key (its first occurrence)"),
    ("input_shard", pa.string(), "file name of the input shard it came from"),
    ("input_index", pa.int64(), "0-based record index inside that shard"),
    ("lang_pair", pa.string(), "partition: <src_lang>-<tgt_lang> (also the directory name)"),
    ("shard", pa.int32(), "partition: output shard number (also the directory name)"),
]

PARTITION_COLUMNS = ("lang_pair", "shard")


def partition_dir(lang_pair: str, shard: int) -> str:
    """An output partition's directory inside its table: ``cs-en/00003``."""
    return f"{lang_pair}/{shard:05d}"


def table_relative(path: str, table: str) -> str:
    """The part of a manifest PATH below its TABLE directory (``cs-en/00003/part-....parquet``),
    whether the file is this run's (``paraphrases/...``) or an earlier run's (``../r1/paraphrases/...``)."""
    parts = path.split("/")
    at = max(i for i, p in enumerate(parts[:-1]) if p == table)
    return "/".join(parts[at + 1:])


def _schema(columns) -> pa.Schema:
    return pa.schema([pa.field(name, dtype, metadata={"doc": doc}) for name, dtype, doc in columns],
                     metadata={"contract_version": str(CONTRACT_VERSION)})


class ContractError(ValueError):
    """A row that does not fit its table: a column name that is not in it, a required value missing."""


@dataclass(frozen=True)
class Table:
    """One table of the contract: its columns and which of them may never be null."""
    name: str
    columns: list
    optional: frozenset = field(default_factory=frozenset)      # columns that may be null

    @property
    def schema(self) -> pa.Schema:
        return _schema(self.columns)

    @property
    def names(self) -> list[str]:
        return [c[0] for c in self.columns]

    def row(self, **values) -> dict:
        """A row of this table from VALUES, checked where it is made: an unknown column or a
        missing required value raises ContractError (the partition columns may come later, from
        the writer: :meth:`partitioned`)."""
        unknown = set(values) - set(self.names)
        if unknown:
            raise ContractError(f"{self.name}: no column(s) {sorted(unknown)}")
        missing = [n for n in self.names if n not in PARTITION_COLUMNS and n not in self.optional
                   and values.get(n) is None]
        if missing:
            raise ContractError(f"{self.name}: required column(s) {missing} missing or null")
        return {n: values.get(n) for n in self.names}

    def partitioned(self, rows: list[dict], lang_pair: str, shard: int) -> pa.Table:
        """ROWS (made by :meth:`row`) with their partition columns set, as an Arrow table."""
        for r in rows:
            r["lang_pair"], r["shard"] = lang_pair, shard
        return pa.Table.from_pylist(rows, schema=self.schema)


PARAPHRASES = Table("paraphrases", PARAPHRASE_COLUMNS, frozenset({"backward_nll"}))
REJECTS = Table("rejects", REJECT_COLUMNS, frozenset({"detail", "source", "reference"}))
# The dedup keys of the pairs a run kept: what a later incremental run deduplicates new pairs
# against without reading the old text again (paracorpus/incremental.py).
DEDUP = Table("dedup", DEDUP_COLUMNS)
PARAPHRASE_SCHEMA = PARAPHRASES.schema
REJECT_SCHEMA = REJECTS.schema
paraphrase_row = PARAPHRASES.row
REJECT_TEXT_CHARS = 1000        # of each side's text a reject row keeps: enough to see what was wrong


def reject_row(item, stage: str, reason: str, detail: str | None, config_hash: str) -> dict:
    """The reject row of ITEM, the one way every stage makes one. ITEM: a record dict or an object
    (paracorpus.steps.CleanPair) with pair_id, input_shard, input_index, source and reference;
    a side that could not be read is None."""
    def get(name):
        return item[name] if isinstance(item, dict) else getattr(item, name)

    def text(value):
        return None if value is None else value[:REJECT_TEXT_CHARS]

    return REJECTS.row(pair_id=get("pair_id"), input_shard=get("input_shard"), input_index=get("input_index"),
                       stage=stage, reason=reason, detail=detail, source=text(get("source")),
                       reference=text(get("reference")), config_hash=config_hash)

# The filter job's scored table: every input column, one float64 column per score of the
# configured filters (named by the filter), then these.
SCORED_COLUMNS: list[tuple[str, pa.DataType, str]] = [
    ("keep", pa.bool_(), "true when no rule rejected the row"),
    ("reasons", pa.list_(pa.string()), "rules that rejected the row, e.g. 'trigram_overlap>max'"),
    ("fit_sample", pa.bool_(), "the row was in the sample the LM / classifiers were fitted on"),
]

# The manifests: keys every one has. A manifest's 'files' maps a table to a list of
# {"path": p, "rows": n, "bytes": n, "bin": b, "shard": partition}; only those files belong to the
# run. A file holds rows of the input shards of one bin (each row's input_shard column says
# which); the manifest's inputs entries name each shard's bin.
# p opens as <the manifest's directory>/<p>: "paraphrases/..." for the run's own files,
# "../<run>/paraphrases/..." for a file an earlier run wrote and this one reuses, or a full URL
# (a bucket has no ".."). Contract 2 had a "root" instead (paracorpus.commit.file_location).
MANIFEST_KEYS = ("contract_version", "run_id", "config_hash", "config", "models", "inputs", "counts",
                 "files", "units", "versions", "command", "finished_at")
FILTER_MANIFEST_KEYS = ("contract_version", "run_id", "input", "input_run_id", "config", "rows_in", "rows_out",
                        "kept", "files", "reconciled", "versions", "command")


# The run's bookkeeping records (OUT/_work/<run id>/): one per input shard read (the left-hand
# side of the reconciliation) and one per finished work unit (its files and counts; --resume).
READ_RECORD_KEYS = ("input_shard", "kind", "paths", "records_read", "sha256", "bytes")
UNIT_RECORD_KEYS = ("unit", "input_shard", "shard", "attempt", "files", "counts", "counters", "worker", "setup",
                    "seconds")
UNIT_COUNT_KEYS = ("records", "pairs_with_paraphrases", "paraphrase_rows", "rejected", "rejected_by_reason")
# ... and one per group (a bin's units and carried rows in one output partition) once its files were
# compacted into files sized for readers (paracorpus/compaction.py): what the driver summarizes.
GROUP_RECORD_KEYS = ("bin", "shard", "input_shards", "carried", "units", "carried_files", "files", "counts",
                     "counts_per_shard", "counters", "setups", "per_worker", "decoding_seconds_per_worker", "reused_units",
                     "unit_files", "compaction_seconds")


def check_manifest(manifest: dict, keys=MANIFEST_KEYS, what: str = "manifest") -> dict:
    """MANIFEST if it has every key of KEYS, else ContractError (checked where it is made)."""
    missing = [k for k in keys if k not in manifest]
    if missing:
        raise ContractError(f"{what} lacks {missing}")
    return manifest


def markdown_table(columns=PARAPHRASE_COLUMNS) -> str:
    """The column table of COLUMNS in Markdown (docs/contract.md, generated by scripts/contract_doc.py)."""
    lines = ["| column | type | meaning |", "|---|---|---|"]
    lines += [f"| `{name}` | {dtype} | {doc} |" for name, dtype, doc in columns]
    return "\n".join(lines)


def manifest_reconciled(manifest: dict) -> bool:
    """True when the run's counts reconcile (records read = pairs with paraphrases + rejects)."""
    return bool(manifest.get("counts", {}).get("reconciled"))
