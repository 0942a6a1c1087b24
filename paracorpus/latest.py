"""A refresh root's current run: ``latest.json`` (the commit point) and the ``latest/`` view, and
retention by reference.

    ROOT/latest.json                          which run is current, written last
    ROOT/latest/_manifest.json                the current run's manifest, its paths opening from latest/
    ROOT/latest/filtered/_filter_manifest.json  the same for its filter run (when it has one)

Every one of these three is written only over the version this refresh read under its lease
(common/storage/conditional.py): a refresh paused past its lease that resumes cannot move
``latest`` over a newer refresh's (exit 75). The view is switched in an order that never shows two
runs at once: the old filter view is removed, the run's manifest written, then its filter view;
a reader of ``latest/`` sees the old run whole, the new run whole, or a run whose filter view is
not there yet (a stop in between, repaired by the next refresh), never one run's rows beside
another's filter run.

Retention (:func:`prune`) keeps the newest KEEP complete runs, the run ``latest`` names, and every
run any kept run or the view takes files from, followed transitively: what a kept manifest
references is never removed, whatever the filter settings (as Delta Lake's VACUUM keeps every
file a retained version references).
"""
from __future__ import annotations

import json
import logging
import os
import time

from common import storage
from common.cli import OutputBusy
from paracorpus.commit import FENCE_SECONDS, entry_path, file_location, holder, is_under
from paracorpus.schema import FILTER_MANIFEST, MANIFEST

log = logging.getLogger("paragen.refresh")
LATEST = "latest.json"


def filter_dir(root: str, run_id: str) -> str:
    """Where run RUN_ID's filter run is: ROOT/filtered/<run id>, or inside the run in roots that
    earlier versions wrote (the filter job now refuses an output inside the run it reads)."""
    legacy = storage.join(root, "runs", run_id, "filtered")
    if storage.isfile(storage.join(legacy, FILTER_MANIFEST)):
        return legacy
    return storage.join(root, "filtered", run_id)


def _manifest_copy(manifest: dict, run_dir: str, copy_dir: str) -> dict:
    """MANIFEST (of the run in RUN_DIR) with every file path rewritten to open from COPY_DIR."""
    files = {table: [{**f, "path": entry_path(copy_dir, file_location(run_dir, f))} for f in entries]
             for table, entries in manifest.get("files", {}).items()}
    return {**manifest, "files": files, "copy_of": entry_path(copy_dir, run_dir)}


def _encode(obj: dict) -> bytes:
    return json.dumps(obj, indent=2).encode("utf-8")


class Latest:
    """ROOT's latest.json and latest/ view as this refresh read them under its lease; every write
    is conditional on what it read (or last wrote): Conflict becomes OutputBusy, exit 75."""

    def __init__(self, root: str):
        self.root = root
        self.named_path = storage.join(root, LATEST)
        self.view = storage.join(root, "latest")
        self.view_run = storage.join(self.view, MANIFEST)
        self.view_filter = storage.join(self.view, "filtered", FILTER_MANIFEST)
        self.versions: dict[str, storage.Version] = {}
        self.read: dict[str, dict | None] = {}
        for path in (self.named_path, self.view_run, self.view_filter):
            raw, self.versions[path] = storage.read_versioned(path)
            self.read[path] = json.loads(raw.decode("utf-8")) if raw is not None else None

    @property
    def run_id(self) -> str | None:
        """The run latest.json names (as read), or None."""
        named = self.read[self.named_path]
        return named.get("run_id") if isinstance(named, dict) else None

    @property
    def run_dir(self) -> str | None:
        return storage.join(self.root, "runs", self.run_id) if self.run_id else None

    def _put(self, path: str, obj: dict) -> None:
        try:
            self.versions[path] = storage.write_if(path, _encode(obj), self.versions[path])
        except storage.Conflict:
            raise self._busy(path) from None
        self.read[path] = obj

    def _remove(self, path: str) -> None:
        version = self.versions[path]
        if version.absent:
            return
        if not storage.delete_if(path, version) and storage.read_versioned(path)[1].tag is not None:
            raise self._busy(path)
        self.versions[path], self.read[path] = storage.ABSENT, None

    def _busy(self, path: str) -> OutputBusy:
        return OutputBusy(f"{path}: written by another refresh since this one read it (this one was paused past its "
                          "lease, or another took the root over); this refresh moves and removes nothing more")

    def _wanted(self, run_id: str) -> dict:
        """The view's two manifests for run RUN_ID (the filter view None when it has no filter run)."""
        run_dir = storage.join(self.root, "runs", run_id)
        wanted = {self.view_run: _manifest_copy(storage.read_json(storage.join(run_dir, MANIFEST)), run_dir,
                                                self.view),
                  self.view_filter: None}
        filtered = filter_dir(self.root, run_id)
        if storage.isfile(storage.join(filtered, FILTER_MANIFEST)):
            wanted[self.view_filter] = _manifest_copy(storage.read_json(storage.join(filtered, FILTER_MANIFEST)),
                                                      filtered, storage.join(self.view, "filtered"))
        return wanted

    def write_view(self, run_id: str) -> bool:
        """Make latest/ the view of run RUN_ID, leaving what already says so alone: the filter view
        removed first, the run's manifest written, then its filter view (never two runs' at once).
        True when something was written or removed."""
        if storage.is_local(self.root):
            link = storage.resolve(self.view)[1]
            if os.path.islink(link):              # earlier versions made latest a symlink
                os.remove(link)
                self.__init__(self.root)
        wanted = self._wanted(run_id)
        if all(self.read[path] == obj for path, obj in wanted.items()):
            return False
        if self.read[self.view_filter] is not None:
            self._remove(self.view_filter)
        if self.read[self.view_run] != wanted[self.view_run]:
            self._put(self.view_run, wanted[self.view_run])
        if wanted[self.view_filter] is not None:
            self._put(self.view_filter, wanted[self.view_filter])
        return True

    def publish(self, run_id: str) -> None:
        """Make run RUN_ID current for every reader: latest/ first, then latest.json, the commit
        point, over the version this refresh read."""
        self.write_view(run_id)
        self._put(self.named_path, {"run_id": run_id, "path": f"runs/{run_id}", "published_at": time.time()})

    def repair(self) -> None:
        """A refresh stopped while publishing left latest/ a view of another run than latest.json
        names (or half of one): made that run's again (nothing when it already is)."""
        if self.run_id and self.write_view(self.run_id):
            log.warning("latest/ did not match latest.json (a refresh stopped while publishing): made it run %s again",
                        self.run_id)

    def fence(self, check):
        """A check before each delete of retention: CHECK() (the lease) and latest.json still what
        this refresh read or wrote; looked at again after FENCE_SECONDS (or a pause)."""
        last = [None]

        def fenced() -> None:
            now = time.monotonic()
            if last[0] is not None and now - last[0] < FENCE_SECONDS:
                return
            check()
            if storage.read_versioned(self.named_path)[1].tag != self.versions[self.named_path].tag:
                raise self._busy(self.named_path)
            last[0] = time.monotonic()
        return fenced


def latest_run(root: str) -> str | None:
    """The run directory ROOT/latest.json names, or None."""
    path = storage.join(root, LATEST)
    if not storage.isfile(path):
        return None
    return storage.join(root, "runs", storage.read_json(path)["run_id"])


def publish_latest(root: str, run_id: str) -> None:
    """Make run RUN_ID current in ROOT (outside a refresh: tools and tests)."""
    Latest(root).publish(run_id)


def referenced_runs(run_dir: str, manifest_name: str = MANIFEST) -> set[str]:
    """Names of the runs (siblings in runs/) whose files RUN_DIR's manifest takes."""
    manifest = storage.read_json(storage.join(run_dir, manifest_name))
    runs_dir = storage.parent(storage.absolute(run_dir.rstrip("/")))
    return _runs_of(manifest, run_dir, runs_dir) - {storage.basename(run_dir.rstrip("/"))}


def _runs_of(manifest: dict, manifest_dir: str, runs_dir: str) -> set[str]:
    names = set()
    for files in manifest.get("files", {}).values():
        for f in files:
            location = file_location(manifest_dir, f)
            if is_under(location, runs_dir):
                names.add(entry_path(runs_dir, location).split("/", 1)[0])
    return names


def _held(run_dir: str) -> bool:
    held = holder(run_dir)
    if held is not None and held[1]:
        log.info("retention keeps %s: %s holds it (%s)", run_dir, held[0].get("run_id"), held[2])
        return True
    return False


def prune(root: str, keep: int, with_filter: bool, current: str | None, log_of: str | None = None,
          fence=None) -> list[str]:
    """Remove from ROOT/runs every run but the newest KEEP complete ones (with WITH_FILTER: those
    with their filter run), CURRENT (latest's target), every run a kept run or the latest/ view
    takes files from, transitively, and every run whose claim is alive; their filter runs go with
    them, and the logs of what was removed (but LOG_OF's: a no-op refresh keeps its own log until
    the next refresh). FENCE() runs before each delete."""
    fence = fence or (lambda: None)
    runs_dir = storage.join(root, "runs")
    names = storage.listdir(runs_dir)
    committed = {n for n in names if storage.isfile(storage.join(runs_dir, n, MANIFEST))}
    complete = [n for n in sorted(committed)
                if not with_filter or storage.isfile(storage.join(filter_dir(root, n), FILTER_MANIFEST))]
    kept = set(complete[-keep:]) | ({current} if current else set())
    view = storage.join(root, "latest", MANIFEST)
    if storage.isfile(view):                                       # a view out of step with latest.json still reads files
        kept |= _runs_of(storage.read_json(view), storage.join(root, "latest"), runs_dir)
    frontier = sorted(kept)
    while frontier:                                      # retention by reference, followed to the end
        name = frontier.pop()
        if name in committed:
            more = referenced_runs(storage.join(runs_dir, name)) - kept
            kept |= more
            frontier += sorted(more)
    # never a run whose claim is alive: a job still writing it (a --job_cmd job, one paused within
    # its lease) would find its folder gone; kept with its filter run and logs, as any kept run
    kept |= {n for n in names if n not in kept and _held(storage.join(runs_dir, n))}
    removed = [n for n in names if n not in kept]
    for name in removed:
        fence()
        storage.delete_tree(storage.join(runs_dir, name))
    for name in storage.listdir(storage.join(root, "filtered")):       # filter runs of runs gone
        if name not in kept:
            fence()
            storage.delete_tree(storage.join(root, "filtered", name))
    for log_name in storage.listdir(storage.join(root, "logs")):      # logs of runs gone, of no-op refreshes
        # <run id>.log, or <run id>.<n>.log: a later attempt's in a bucket (refresh.attempt_log_path)
        owner = log_name[:-len(".log")].split(".", 1)[0] if log_name.endswith(".log") else log_name
        if owner not in kept | {log_of}:
            fence()
            storage.delete(storage.join(root, "logs", log_name))
    return removed
