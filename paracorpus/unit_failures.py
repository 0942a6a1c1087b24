"""Failed attempts at a work unit, as the worker that failed saw them: one record per attempt under
``<output>/_work/<run id>/failures/`` (``u000012.<attempt>.json``: the unit, the worker, what it was
doing, the error's first line), written before the error goes back to the runner. The driver reads
them (paracorpus/run_progress.py) so that a worker's error reaches the driver's log with its unit on
every runner, Dask, SLURM, Flink and Dataflow included, whose workers' logs the driver never sees;
and the manifest counts them. A failure record is advice, never the run's truth: writing one may
fail (the store away) and is then skipped."""
from __future__ import annotations

import logging
import os
import socket
import time

from common import storage
from paracorpus.commit import attempt_id
from paracorpus.units import unit_name, unit_of_record

log = logging.getLogger("paragen.units")
ERROR_CHARS = 300          # an error's first line, cut: a message may quote a whole input line


def failures_dir(work: str) -> str:
    return storage.join(work, "failures")


def record_failure(work: str, unit: int, exc: BaseException, doing: str) -> None:
    """Note that this worker's attempt at UNIT failed with EXC while DOING ("decoding",
    "writing"). Never raises: the unit's own error is what the runner must see. Not when EXC is
    the store's having stayed away (StorageError): writing the note would be retried as long
    again before the error went back."""
    if isinstance(exc, storage.StorageError):   # the store just gave up on this worker: a note would wait as long
        log.debug("unit %s: the store is away; no failure record (%s)", unit, exc)
        return
    first = (str(exc).strip().splitlines() or [""])[0]
    record = {"unit": unit, "worker": f"{socket.gethostname()}:{os.getpid()}", "doing": doing,
              "error": f"{type(exc).__name__}: {first}"[:ERROR_CHARS], "at": time.time()}
    try:
        if not storage.exists(work):       # the run's work is gone (published or pruned): nothing to tell
            return
        storage.write_json(storage.join(failures_dir(work), f"{unit_name(unit)}.{attempt_id()}.json"), record,
                           indent=None)
    except Exception as write_error:  # noqa: BLE001: the unit's error matters, not this note's
        log.debug("could not note the failure of unit %s (%s)", unit, write_error)


def unit_of_failure(name: str) -> int | None:
    """The unit of the failure record called NAME (``u000012.<attempt>.json``), else None."""
    parts = name.split(".")
    return unit_of_record(f"{parts[0]}.json") if len(parts) == 3 and parts[2] == "json" else None


def read_failures(work: str, skip: set[str] = frozenset()) -> list[tuple[str, dict]]:
    """(name, record) of the run's failure records but those named in SKIP, oldest first; a record
    that cannot be read yet is left for the next call."""
    found = []
    for name in storage.listdir(failures_dir(work)):
        if name in skip or unit_of_failure(name) is None:
            continue
        try:
            record = storage.read_json(storage.join(failures_dir(work), name))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            found.append((name, record))
    return sorted(found, key=lambda item: (float(item[1].get("at") or 0), item[0]))


def describe(record: dict) -> str:
    """One failure record in words."""
    return (f"unit {record.get('unit')} failed on worker {record.get('worker')} while {record.get('doing')}: "
            f"{record.get('error')}")
