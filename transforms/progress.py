"""Progress for long runs: Beam counters plus a log line per worker at most every few seconds.

A line shows this worker's running totals and, for the stage's main count (``rate_of``), its
rate and, when the job told the stage how many items to expect per worker, an ETA::

    [generate] pairs_generated=1280 paraphrases=6102 rejected_dual_xent=31 | 8.5 pairs/s, ~26% of ~5,000, ETA 7m40s
"""
from __future__ import annotations

import logging
import time

import apache_beam as beam

NAMESPACE = "paragen"
log = logging.getLogger("paragen.progress")


def format_seconds(seconds: float) -> str:
    seconds = int(max(0, seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """Counts into Beam metrics and logs running totals of this worker periodically."""

    def __init__(self, stage: str, every_seconds: float = 10.0, rate_of: str | None = None,
                 unit: str = "pairs", expected: int | None = None):
        self.stage = stage
        self.every = every_seconds
        self.rate_of, self.unit, self.expected = rate_of, unit, expected
        self._counters: dict = {}
        self._totals: dict[str, int] = {}
        self._start = self._last = time.monotonic()

    def inc(self, name: str, n: int = 1) -> None:
        """Add N to the Beam counter NAME and to this worker's running total."""
        if n == 0:
            return
        counter = self._counters.get(name)
        if counter is None:
            counter = self._counters[name] = beam.metrics.Metrics.counter(NAMESPACE, name)
        counter.inc(n)
        self.add(name, n)

    def add(self, name: str, n: int = 1) -> None:
        """Add N to this worker's running total NAME only (no Beam counter)."""
        self._totals[name] = self._totals.get(name, 0) + n
        now = time.monotonic()
        if now - self._last >= self.every:
            self._last = now
            self.flush()

    def line(self) -> str:
        body = " ".join(f"{k}={v}" for k, v in sorted(self._totals.items()))
        done = self._totals.get(self.rate_of, 0) if self.rate_of else 0
        elapsed = time.monotonic() - self._start
        if not done or elapsed <= 0:
            return f"[{self.stage}] {body}"
        rate = done / elapsed
        tail = f"{rate:.1f} {self.unit}/s"
        if self.expected and self.expected > 0:
            share = min(done / self.expected, 1.0)
            tail += f", ~{share:.0%} of ~{self.expected:,}"
            if done < self.expected:
                tail += f", ETA {format_seconds((self.expected - done) / rate)}"
        return f"[{self.stage}] {body} | {tail}"

    def flush(self) -> None:
        if self._totals:
            log.info("%s", self.line())
