"""Progress for long runs: Beam counters plus a log line per worker every few seconds.

A line shows this worker's running totals and, for the stage's main count (``rate_of``), its
rate and, when the job told the stage how many items to expect per worker, an ETA; while the
worker is inside a long piece of work (a unit, a file) it also says what and for how long::

    [generate] pairs_generated=1280 paraphrases=6102 | 8.5 pairs/s, ~26% of ~5,000, ETA 7m40s | unit 42: 128 of 500 pairs, 14s

Lines come at least every ``PARAGEN_PROGRESS_SECONDS`` (default 5 s when stderr is a terminal,
30 s in a log file) while work goes on, from a heartbeat thread, so a decoding batch that takes
half a minute is not half a minute of silence.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref

import apache_beam as beam

from common.progress import format_seconds, progress_seconds

NAMESPACE = "paragen"
log = logging.getLogger("paragen.progress")


class Progress:
    """Counts into Beam metrics and logs running totals of this worker periodically."""

    def __init__(self, stage: str, every_seconds: float | None = None, rate_of: str | None = None,
                 unit: str = "pairs", expected: int | None = None):
        self.stage = stage
        self.every = progress_seconds() if every_seconds is None else every_seconds
        self.rate_of, self.unit, self.expected = rate_of, unit, expected
        self._counters: dict = {}
        self._totals: dict[str, int] = {}
        self._start = self._last = time.monotonic()
        self._lock = threading.Lock()
        self._doing: str | None = None           # what the worker is busy with, for the heartbeat
        self._doing_since = 0.0

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
        with self._lock:
            self._totals[name] = self._totals.get(name, 0) + n
        if time.monotonic() - self._last >= self.every:
            self.flush()

    def working(self, what: str) -> None:
        """Say what the worker is busy with now (a unit, a file); until idle(), the heartbeat
        logs a line every few seconds even when no count changes."""
        with self._lock:
            if self._doing is None:
                self._doing_since = time.monotonic()
            self._doing = what
        _watch(self)

    def idle(self) -> None:
        with self._lock:
            self._doing = None

    def _beat(self) -> None:
        if self._doing is not None and time.monotonic() - self._last >= self.every:
            self.flush()

    def line(self) -> str:
        with self._lock:
            totals, doing, since = dict(self._totals), self._doing, self._doing_since
        # ms_* counters are time per stage (paracorpus/paraphrasing.py timed), for the manifest
        body = " ".join(f"{k}={v}" for k, v in sorted(totals.items()) if not k.startswith("ms_"))
        now = time.monotonic()
        done = totals.get(self.rate_of, 0) if self.rate_of else 0
        elapsed = now - self._start
        parts = [f"[{self.stage}] {body}".rstrip()]
        if done and elapsed > 0:
            rate = done / elapsed
            tail = f"{rate:.1f} {self.unit}/s"
            if self.expected and self.expected > 0:
                share = min(done / self.expected, 1.0)
                tail += f", ~{share:.0%} of ~{self.expected:,}"
                if done < self.expected:
                    tail += f", ETA {format_seconds((self.expected - done) / rate)}"
            parts.append(tail)
        if doing:
            parts.append(f"{doing}, {format_seconds(now - since)}")
        return " | ".join(parts)

    def flush(self) -> None:
        self._last = time.monotonic()
        if self._totals or self._doing:
            log.info("%s", self.line())


# One heartbeat thread per process for every Progress in it: runners make a DoFn (and its Progress)
# per bundle or task, and a thread each would pile up over a long run (the Dask workers had 50).
_WATCHED: "weakref.WeakSet[Progress]" = weakref.WeakSet()
_HEARTBEAT: threading.Thread | None = None
_HEARTBEAT_LOCK = threading.Lock()


def _watch(progress: Progress) -> None:
    global _HEARTBEAT
    with _HEARTBEAT_LOCK:
        _WATCHED.add(progress)
        if _HEARTBEAT is None or not _HEARTBEAT.is_alive():
            _HEARTBEAT = threading.Thread(target=_heartbeat, name="paragen-progress", daemon=True)
            _HEARTBEAT.start()


def _heartbeat() -> None:
    while True:
        time.sleep(0.2)
        with _HEARTBEAT_LOCK:
            live = list(_WATCHED)
        for progress in live:
            progress._beat()

