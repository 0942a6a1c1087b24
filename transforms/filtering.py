"""Thin DoFn around filtering.scoring.score_file: one input Parquet file in, one scored file out."""
from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics

from common import storage
from paracorpus.commit import attempt_id
from transforms.progress import Progress


class ScoreFile(beam.DoFn):
    """(input file, its path inside the input table) -> stats Counter as a dict, with the scored
    file's manifest entry under 'files'. The scored file mirrors the input's path under
    OUTPUT/scored, named with an attempt id so a retried attempt never overwrites a committed file.
    Filters are built and their models loaded once per worker in setup(); RAW_CONFIG is the
    validated config with fitted parameters filled in."""

    def __init__(self, output: str, raw_config: dict, overrides: dict, fit_ids: list,
                 torch_threads: int | None = None, expected_rows: int | None = None, fence=None):
        self.output, self.fence = output, fence
        self.raw_config, self.overrides, self.fit_ids = raw_config, overrides, fit_ids
        self.torch_threads, self.expected_rows = torch_threads, expected_rows
        self.rows = Metrics.counter("filter", "rows_scored")
        self.kept = Metrics.counter("filter", "rows_kept")
        self.files = Metrics.counter("filter", "files_written")

    def setup(self):
        from filtering.config import parse_config

        if self.torch_threads:      # several worker processes share this machine's cores
            import torch

            torch.set_num_threads(self.torch_threads)
        self.cfg = parse_config(self.raw_config, "job config", self.overrides)
        for f in self.cfg.filters:
            f.setup()
        self._fit_ids = frozenset(self.fit_ids)
        # progress lines while files are scored (the counters above are the job's record)
        self.progress = Progress("filter", rate_of="rows", unit="rows", expected=self.expected_rows)

    def process(self, item):
        from filtering.scoring import score_file

        src, rel_path = item
        stem = rel_path[:-len(".parquet")] if rel_path.endswith(".parquet") else rel_path
        rel_out = f"scored/{stem}-{attempt_id()}.parquet"
        dst = storage.join(self.output, rel_out)
        done = 0
        self.progress.working(f"{rel_path}: 0 rows")

        def on_batch(batch_stats):
            nonlocal done
            done += batch_stats["rows"]
            self.progress.working(f"{rel_path}: {done:,} rows")
            self.progress.add("rows", batch_stats["rows"])
            self.progress.add("kept", batch_stats["kept"])
        if self.fence is not None:
            self.fence()                  # the run still holds its output (paracorpus.commit.Fence)
        stats = score_file(src, dst, self.cfg, self._fit_ids, on_batch=on_batch)
        self.progress.idle()
        self.rows.inc(stats["rows"])
        self.kept.inc(stats["kept"])
        self.files.inc()
        for key, n in stats.items():
            if key.startswith("reason:"):
                Metrics.counter("filter", rejected_counter(key)).inc(n)
        self.progress.add("files", 1)
        self.progress.flush()                 # a line per file done, beside the heartbeat's
        yield {**stats, "files": [{"path": rel_out, "rows": stats["rows"], "bytes": storage.size(dst)}]}


def rejected_counter(key: str) -> str:
    """The counter of a stats key 'reason:<rule>' ('reason:translation_cost>max' ->
    'rejected_translation_cost_above_max'): the Beam counter's name and the manifest's."""
    return "rejected_" + key[len("reason:"):].replace("<", "_below_").replace(">", "_above_")


def merge_stats(dicts) -> dict:
    total: dict = {}
    for d in dicts:
        for k, v in d.items():
            total[k] = total.get(k, [] if k == "files" else 0) + v
    return total
