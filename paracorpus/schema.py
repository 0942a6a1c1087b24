"""The output contract of the generation job: every Parquet column, its type and meaning.

Downstream jobs (filter, embedding training) read these tables, so changing a column here is a
breaking change: add columns, never rename or retype them, and bump CONTRACT_VERSION.

Layout under ``--output``::

    paraphrases/lang_pair=<src>-<tgt>/shard=<NNNNN>/part-00000.parquet   one row per paraphrase
    rejects/lang_pair=<src>-<tgt>/shard=<NNNNN>/part-00000.parquet       one row per rejected pair
    _manifest.json                                                        inputs, models, config, counts

``pyarrow.dataset.dataset(output / "paraphrases", partitioning="hive")`` reads it; the partition
columns ``lang_pair`` and ``shard`` come from the directory names.
"""
from __future__ import annotations

import json
import os

import pyarrow as pa

CONTRACT_VERSION = 1
MANIFEST = "_manifest.json"     # written last by the generation job

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
]

REJECT_COLUMNS: list[tuple[str, pa.DataType, str]] = [
    ("pair_id", pa.string(), "stable id of the input record (same scheme as paraphrases.pair_id)"),
    ("input_shard", pa.string(), "file name of the input shard"),
    ("input_index", pa.int64(), "0-based record index inside the shard"),
    ("stage", pa.string(), "pipeline stage that rejected it: read, clean, dedup, segment, dual_xent, generate"),
    ("reason", pa.string(), "machine-readable reason, one of REJECT_REASONS"),
    ("detail", pa.string(), "human-readable detail (e.g. the offending character, the score)"),
    ("source", pa.string(), "foreign side as read, truncated to 1,000 characters; null if unreadable"),
    ("reference", pa.string(), "English side as read, truncated to 1,000 characters; null if unreadable"),
    ("config_hash", pa.string(), "hash of the generation config"),
]

PARTITION_COLUMNS = ("lang_pair", "shard")

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
    "dual_xent": "dual conditional cross-entropy of the pair above the threshold",
    "no_candidates": "no candidate survived the dual-score threshold",
    "no_paraphrase": "every surviving candidate fell into the reference cluster",
}


def _schema(columns) -> pa.Schema:
    return pa.schema([pa.field(name, dtype, metadata={"doc": doc}) for name, dtype, doc in columns],
                     metadata={"contract_version": str(CONTRACT_VERSION)})


PARAPHRASE_SCHEMA = _schema(PARAPHRASE_COLUMNS)
REJECT_SCHEMA = _schema(REJECT_COLUMNS)


def markdown_table(columns=PARAPHRASE_COLUMNS) -> str:
    """The column table used in the README (kept in sync by a test)."""
    lines = ["| column | type | meaning |", "|---|---|---|"]
    lines += [f"| `{name}` | {dtype} | {doc} |" for name, dtype, doc in columns]
    return "\n".join(lines)


def read_manifest(run_dir: str) -> dict | None:
    """The generation run's manifest in RUN_DIR, or None when there is none (an unfinished run,
    or not a run directory)."""
    path = os.path.join(run_dir, MANIFEST)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def manifest_reconciled(manifest: dict) -> bool:
    """True when the run's counts reconcile (records read = pairs with paraphrases + rejects)."""
    return bool(manifest.get("counts", {}).get("reconciled"))
