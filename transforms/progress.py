"""Progress for long runs: Beam counters plus a log line per worker at most every few seconds."""
from __future__ import annotations

import logging
import time

import apache_beam as beam

NAMESPACE = "paragen"
log = logging.getLogger("paragen.progress")


class Progress:
    """Counts into Beam metrics and logs running totals of this worker periodically."""

    def __init__(self, stage: str, every_seconds: float = 10.0):
        self.stage = stage
        self.every = every_seconds
        self._counters: dict = {}
        self._totals: dict[str, int] = {}
        self._last = time.monotonic()

    def inc(self, name: str, n: int = 1) -> None:
        if n == 0:
            return
        counter = self._counters.get(name)
        if counter is None:
            counter = self._counters[name] = beam.metrics.Metrics.counter(NAMESPACE, name)
        counter.inc(n)
        self._totals[name] = self._totals.get(name, 0) + n
        now = time.monotonic()
        if now - self._last >= self.every:
            self._last = now
            self.flush()

    def flush(self) -> None:
        if self._totals:
            body = ", ".join(f"{k}={v}" for k, v in sorted(self._totals.items()))
            log.info("[%s] %s", self.stage, body)
