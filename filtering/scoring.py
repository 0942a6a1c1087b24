"""Score one table of generation rows with every configured filter and decide: the per-file work
of the filter job, as a plain function (transforms/filtering.py runs it inside a DoFn)."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from common import storage
from common.steps import decide
from filtering.config import FilterConfig
from filtering.filters import PairBatch
from paracorpus.schema import SCORED_COLUMNS


def output_schema(input_schema: pa.Schema, cfg: FilterConfig) -> pa.Schema:
    """Every input column, then one float64 column per score, then keep, reasons, fit_sample."""
    fields = [f for f in input_schema if f.name not in cfg.score_columns + ["keep", "reasons", "fit_sample"]]
    fields += [pa.field(name, pa.float64(), metadata={"doc": f"score of filter {f.NAME!r} ({direction})"})
               for f in cfg.filters for name, direction in f.scores.items()]
    fields += [pa.field(name, dtype, metadata={"doc": doc}) for name, dtype, doc in SCORED_COLUMNS]
    return pa.schema(fields)


def score_table(table: pa.Table, cfg: FilterConfig, fit_ids: frozenset = frozenset(),
                timings: Counter | None = None) -> tuple[pa.Table, Counter]:
    """(scored table, stats). Every input row is in the output, in the input order."""
    import time

    batch = PairBatch(table)
    n = len(batch)
    scores = {}
    for f in cfg.filters:
        t0 = time.perf_counter()
        out = f.score(batch)
        if timings is not None:
            timings[f.NAME] += time.perf_counter() - t0
        for name in f.scores:
            v = np.asarray(out[name], dtype=np.float64)
            if v.shape != (n,):
                raise RuntimeError(f"filter {f.NAME!r} returned {v.shape} scores for {n} rows")
            scores[name] = v
    keep, reasons = decide(scores, cfg.rules, n)
    keep_cols = [c for c in table.column_names if c not in cfg.score_columns + ["keep", "reasons", "fit_sample"]]
    out = table.select(keep_cols)
    for name, v in scores.items():
        out = out.append_column(name, pa.array(v, type=pa.float64(), mask=np.isnan(v)))
    out = out.append_column("keep", pa.array(keep, type=pa.bool_()))
    out = out.append_column("reasons", pa.array(reasons, type=pa.list_(pa.string())))
    ids = table.column("pair_id").to_pylist() if "pair_id" in table.column_names else [None] * n
    out = out.append_column("fit_sample", pa.array([i in fit_ids for i in ids], type=pa.bool_()))
    stats = Counter(rows=n, kept=int(keep.sum()))
    for name, v in scores.items():      # no score (e.g. no parse): that rule cannot judge the row
        missing = int(np.isnan(v).sum())
        if missing:
            stats[f"unscored:{name}"] += missing
    for rs in reasons:
        for r in rs:
            stats[f"reason:{r}"] += 1
    return out, stats


def score_file(src: str, dst: str, cfg: FilterConfig, fit_ids: frozenset = frozenset(),
               batch_rows: int = 4096, on_batch=None) -> Counter:
    """Score one Parquet file (a local path or a URL) in record batches and write DST whole
    (common.storage.open_output). ON_BATCH(stats of the batch) is called after each batch."""
    pf = storage.parquet_file(src)
    schema = output_schema(pf.schema_arrow, cfg)
    total = Counter()
    with storage.open_output(dst) as out, pq.ParquetWriter(out, schema, compression="zstd") as w:
        for rb in pf.iter_batches(batch_size=batch_rows):
            scored, stats = score_table(pa.Table.from_batches([rb]), cfg, fit_ids)
            w.write_table(scored.cast(schema))
            total.update(stats)
            if on_batch is not None:
                on_batch(stats)
    total["files"] += 1
    total["rows_in"] += pf.metadata.num_rows
    return total
