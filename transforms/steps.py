"""The one adapter between a step (common/steps.py) and Beam: a DoFn that sets the step up once
per worker and applies it to each element, emitting ("main", kept item) and ("rejects", reject
row) pairs (transforms/io.py's SplitTagged separates them) and counting both in the progress
output."""
from __future__ import annotations

import apache_beam as beam

from paracorpus.schema import reject_row
from transforms.io import MAIN_TAG, REJECTS_TAG
from transforms.progress import Progress


class ApplyStep(beam.DoFn):
    """STEP on each element (a batch of one: per-record steps keep Beam's own parallelism).
    KEPT_COUNTER names the progress counter of kept items."""

    def __init__(self, step, config_hash: str, kept_counter: str):
        self.step, self.config_hash, self.kept_counter = step, config_hash, kept_counter

    def setup(self):
        self.step.setup()
        self.progress = Progress(self.step.NAME)

    def process(self, element):
        result = self.step.apply([element])
        for item in result.kept:
            self.progress.inc(self.kept_counter)
            yield (MAIN_TAG, item)
        for r in result.rejects:
            self.progress.inc(f"rejected_{r.reason}")
            yield (REJECTS_TAG, reject_row(r.item, r.stage, r.reason, r.detail, self.config_hash))
