"""What the driver says while a generation run decodes, on every runner: read from the unit
records the workers commit under ``<output>/_work/<run id>/units/`` (paracorpus/units.py), not from
the runner's metrics, so a DirectRunner, Dask, SLURM, Flink or Dataflow run reads alike::

    progress: 12 of 40 units (30%), 6,000 of ~20,000 pairs; 8.5 pairs/s over the last 5m00s; ETA 27m27s; workers: 2; failed attempts: 1 (units 7; 1 since committed)

:class:`RunProgress` is the plain bookkeeping (tested alone); :class:`DriverProgress` is the thread
that lists the records every ``PARAGEN_PROGRESS_SECONDS`` (default 10 s on a terminal, 30 s in a
log) and logs the line. Times are this process's monotonic clock only: nothing compares the
workers' clocks with the driver's. Units an earlier attempt committed (a resume) count as done but
not into the rate. A worker's failed attempt at a unit (paracorpus/unit_failures.py) is logged as a
warning with its unit, worker and error the first time the driver sees it, and counted in the line
until the run ends (with how many of those units a later attempt committed)."""
from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque

from common import storage
from common.progress import format_seconds, progress_seconds
from paracorpus.unit_failures import describe, read_failures, unit_of_failure
from paracorpus.units import unit_of_record

log = logging.getLogger("paragen.progress")
LAST_LOOK_SECONDS = 10.0      # a failed run's last look: the failure's line must not wait on a store that is away
WINDOW_SECONDS = 300.0        # the rate is over the last five minutes: a run's pace changes


class RunProgress:
    """Units and pairs committed so far, the recent rate, an ETA."""

    def __init__(self, total_units: int, expected_pairs: int | None = None, window: float = WINDOW_SECONDS,
                 clock=time.monotonic):
        self.total, self.expected, self.window, self.clock = total_units, expected_pairs, window, clock
        self.units: set[int] = set()
        self.pairs = self.earlier_pairs = self.attempt_units = 0
        self.workers: set[str] = set()
        self.failed: list[int] = []              # the unit of each failed attempt seen
        self.history: deque = deque([(clock(), 0)])      # (when, pairs committed in this attempt)

    def earlier(self, units: set[int]) -> None:
        """UNITS were committed before this attempt began (their pairs are counted when read)."""
        self.units |= set(units)

    def saw(self, unit: int, record: dict) -> None:
        """The record of UNIT, read for the first time."""
        pairs = int(record.get("counts", {}).get("records", 0))
        if unit in self.units:                 # committed by an earlier attempt: done, not this attempt's pace
            self.earlier_pairs += pairs
            return
        self.units.add(unit)
        self.attempt_units += 1
        self.pairs += pairs
        if record.get("worker"):
            self.workers.add(str(record["worker"]))

    def failed_attempt(self, unit: int) -> None:
        self.failed.append(unit)

    def tick(self) -> None:
        """Note the pairs so far at this instant (for the rate)."""
        now = self.clock()
        self.history.append((now, self.pairs))
        while len(self.history) > 2 and now - self.history[1][0] >= self.window:
            self.history.popleft()

    def rate(self) -> float | None:
        """Pairs a second over the window, None before there is any."""
        (t0, p0), (t1, p1) = self.history[0], self.history[-1]
        return (p1 - p0) / (t1 - t0) if t1 > t0 and p1 > p0 else None

    def line(self, bar: bool = False) -> str:
        done = len(self.units)
        share = done / self.total if self.total else 1.0
        parts = [f"{done} of {self.total} units ({share:.0%})"]
        if bar:
            filled = int(round(share * 20))
            parts[0] = f"[{'#' * filled}{'.' * (20 - filled)}] " + parts[0]
        total_pairs = self.pairs + self.earlier_pairs
        parts[0] += f", {total_pairs:,}" + (f" of ~{self.expected:,} pairs" if self.expected else " pairs")
        rate = self.rate()
        if rate is None:
            parts.append("no unit committed yet in this attempt" if not self.pairs else "rate: measuring")
        else:
            span = min(self.window, self.history[-1][0] - self.history[0][0])
            parts.append(f"{rate:,.1f} pairs/s over the last {format_seconds(span)}")
            if self.expected and self.expected > total_pairs:
                parts.append(f"ETA {format_seconds((self.expected - total_pairs) / rate)}")
            elif done < self.total:                    # no estimate of the pairs: by units of this attempt's size
                parts.append(f"ETA {format_seconds((self.total - done) * self.pairs / self.attempt_units / rate)}")
        if self.workers:
            parts.append(f"workers: {len(self.workers)}")
        if self.failed:
            units = sorted(set(self.failed))
            named = ", ".join(str(u) for u in units[:5]) + (f" and {len(units) - 5} more" if len(units) > 5 else "")
            parts.append(f"failed attempts: {len(self.failed)} (unit{'s' if len(units) > 1 else ''} {named}; "
                         f"{sum(1 for u in units if u in self.units)} since committed)")
        return "progress: " + "; ".join(parts)


class DriverProgress:
    """A thread of the driver that reads WORK/units/ every few seconds and logs RunProgress's line,
    while the pipeline runs (a context manager around it). A store that does not answer skips a
    line, never the run."""

    def __init__(self, work: str, total_units: int, expected_pairs: int | None, earlier: set[int] = frozenset(),
                 every: float | None = None):
        self.work, self.units_dir = work, storage.join(work, "units")
        self.failures_seen: set[str] = set()
        self.progress = RunProgress(total_units, expected_pairs)
        self.progress.earlier(set(earlier))
        self.every = progress_seconds(on_terminal=10.0) if every is None else every
        self.read: set[int] = set()
        self._stop = threading.Event()
        self._looking = threading.Lock()          # the loop's look and a failed run's last look, one at a time
        self._thread = threading.Thread(target=self._loop, name="paragen-driver-progress", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, exc_type, *exc):
        self._stop.set()
        self._thread.join(timeout=5)
        if exc_type is None:                    # the pipeline ended well: where it ended
            self._say()
        else:       # failed: the units that failed, as the workers noted them, if the store answers soon
            last = threading.Thread(target=self._say, name="paragen-driver-progress-last", daemon=True)
            last.start()
            last.join(timeout=LAST_LOOK_SECONDS)
        return False

    def look(self) -> str:
        """Read the records committed since the last look; the line to say."""
        for name in storage.listdir(self.units_dir):
            unit = unit_of_record(name)
            if unit is None or unit in self.read:
                continue
            try:
                record = storage.read_json(storage.join(self.units_dir, name))
            except (OSError, ValueError):           # gone (a clean-up) or unreadable: looked at again next time
                continue
            self.read.add(unit)
            self.progress.saw(unit, record)
        for name, record in read_failures(self.work, self.failures_seen):
            self.failures_seen.add(name)
            log.warning("%s; the runner may run it again", describe(record))
            self.progress.failed_attempt(unit_of_failure(name))
        self.progress.tick()
        return self.progress.line(bar=sys.stderr.isatty())

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self._say()

    def _say(self) -> None:
        try:
            with self._looking:
                log.info("%s", self.look())
        except Exception as exc:  # noqa: BLE001: progress must never end a run
            log.debug("progress: could not read the unit records (%s)", exc)
