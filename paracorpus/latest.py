"""A refresh root's current run (``latest``: numbered versions, the commit point), its copies
``latest.json`` and the ``latest/`` view, and retention by age and by reference.

    ROOT/_log/<n>-latest.json                 version n of latest: the highest is the truth
    ROOT/latest.json                          a copy of the newest version: which run is current
    ROOT/latest/_manifest.json                the current run's manifest, its paths opening from latest/
    ROOT/latest/filtered/_filter_manifest.json  the same for its filter run (when it has one)

A refresh moves latest by creating the version one above the one it read under its lease
(put-if-absent: common/storage/versions.py): a refresh paused past its lease that resumes finds
its number taken and moves nothing (exit 75). The copies are written after the version; the view
in an order that never shows two runs at once: the old filter view is removed, the run's
manifest written, then its filter view; a reader of ``latest/`` sees the old run whole, the new
run whole, or a run whose filter view is not there yet (a stop in between, repaired by the next
refresh), never one run's rows beside another's filter run.

Retention (:func:`prune`) keeps the newest KEEP complete runs, the run ``latest`` names, every
run a version of latest written in the last --retain hours named (a reader that opened it may
still be reading: Delta Lake's VACUUM keeps 7 days), every run whose claim is alive, and every run
any kept run or the view takes files from, followed transitively: what a kept manifest
references is never removed, whatever the filter settings.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time

from common import storage
from common.cli import OutputBusy
from paracorpus.commit import entry_path, file_location, holder, is_under, read_manifest, remove_staged
from paracorpus.schema import FILTER_MANIFEST, MANIFEST

log = logging.getLogger("paragen.refresh")
LATEST = "latest.json"


def filter_dir(root: str, run_id: str) -> str:
    """Where run RUN_ID's first filter run is: ROOT/filtered/<run id>, or inside the run in roots
    that earlier versions wrote (the filter job now refuses an output inside the run it reads)."""
    legacy = storage.join(root, "runs", run_id, "filtered")
    if storage.isfile(storage.join(legacy, FILTER_MANIFEST)):
        return legacy
    return storage.join(root, "filtered", run_id)


def filter_target(root: str, run_id: str, plan_key: str) -> str:
    """Where run RUN_ID's filter run of plan PLAN_KEY goes: its first folder (filter_dir) unless
    that holds a committed filter run of another plan (the refresh's --filter_args changed), then
    ROOT/filtered/<run id>.<plan key>: the filter run latest names is never replaced in place,
    so a reader of the latest/ view keeps every file it opened."""
    first = filter_dir(root, run_id)
    if committed_plan(first) in (None, plan_key):
        return first
    return storage.join(root, "filtered", f"{run_id}.{plan_key}")


def committed_plan(filtered: str) -> str | None:
    """The plan key of the filter run committed in FILTERED ("?" for an unreadable manifest), or
    None when none is."""
    try:
        committed = read_manifest(filtered, FILTER_MANIFEST)
    except ValueError:
        return "?"
    return None if committed is None else str(committed.get("plan_key"))


def run_of_filter_folder(name: str) -> str:
    """The run a folder of ROOT/filtered belongs to: <run id>, or <run id>.<plan key> (16 hex
    digits; a run id may hold dots itself)."""
    later = re.fullmatch(r"(.+)\.[0-9a-f]{16}", name)
    return later.group(1) if later else name


def run_of_log(name: str) -> str:
    """The run a file of ROOT/logs belongs to: <run id>.log, or <run id>.<n>.log, a continued
    run's later attempt's in a bucket (refresh.attempt_log_path)."""
    return name[:-len(".log")].split(".", 1)[0] if name.endswith(".log") else name


def _manifest_copy(manifest: dict, run_dir: str, copy_dir: str) -> dict:
    """MANIFEST (of the run in RUN_DIR) with every file path rewritten to open from COPY_DIR."""
    files = {table: [{**f, "path": entry_path(copy_dir, file_location(run_dir, f))} for f in entries]
             for table, entries in manifest.get("files", {}).items()}
    return {**manifest, "files": files, "copy_of": entry_path(copy_dir, run_dir)}


def _encode(obj: dict) -> bytes:
    return json.dumps(obj, indent=2).encode("utf-8")


class Latest:
    """ROOT's ``latest`` as this refresh read it under its lease: a record kept as numbered
    versions (``ROOT/_log/<n>-latest.json``, storage.versions), the highest the truth; latest.json
    and the latest/ view are copies written from it. Moving it creates the version one above the
    one this refresh read: a refresh paused past its lease finds that number taken (OutputBusy,
    exit 75) and moves nothing."""

    def __init__(self, root: str):
        self.root = root
        self.named_path = storage.join(root, LATEST)
        self.view = storage.join(root, "latest")
        self.view_run = storage.join(self.view, MANIFEST)
        self.view_filter = storage.join(self.view, "filtered", FILTER_MANIFEST)
        raw, self.version = storage.read_versioned(self.named_path)
        self.named = json.loads(raw.decode("utf-8")) if raw is not None else None

    @property
    def run_id(self) -> str | None:
        """The run latest names (as read), or None."""
        return self.named.get("run_id") if isinstance(self.named, dict) else None

    @property
    def run_dir(self) -> str | None:
        return storage.join(self.root, "runs", self.run_id) if self.run_id else None

    def _busy(self, what: str) -> OutputBusy:
        return OutputBusy(f"{self.named_path}: moved by another refresh since this one read it ({what}; this one was "
                          "paused past its lease, or another took the root over); this refresh moves and removes "
                          "nothing more")

    @property
    def filter_path(self) -> str | None:
        """The filter run latest names: its ``filtered`` entry, else its run's first filter folder
        (versions written before the entry existed); None without a run."""
        if not self.run_id:
            return None
        named = self.named.get("filtered")
        return storage.join(self.root, named) if named else filter_dir(self.root, self.run_id)

    def _wanted(self, run_id: str, filtered: str | None) -> dict:
        """The view's two manifests for run RUN_ID and its filter run in FILTERED (default: its
        first folder); the filter view None when there is no filter run there."""
        # from each manifest's newest version, the truth: its plain copy can lag (a job stopped
        # between the two), and a view made from it would lag until the next repair
        run_dir = storage.join(self.root, "runs", run_id)
        manifest = read_manifest(run_dir, MANIFEST)
        if manifest is None:
            raise FileNotFoundError(f"{storage.join(run_dir, MANIFEST)}: run {run_id} is not published")
        wanted = {self.view_run: _manifest_copy(manifest, run_dir, self.view), self.view_filter: None}
        filtered = filtered or filter_dir(self.root, run_id)
        filter_manifest = read_manifest(filtered, FILTER_MANIFEST)
        if filter_manifest is not None:
            wanted[self.view_filter] = _manifest_copy(filter_manifest, filtered, storage.join(self.view, "filtered"))
        return wanted

    def write_view(self, run_id: str, fence=None, filtered: str | None = None) -> bool:
        """Make latest/ the view of run RUN_ID and its filter run in FILTERED (default: its first
        folder), leaving what already says so alone: the filter view removed first, the run's
        manifest written, then its filter view (never two runs' or two filter runs' at once),
        FENCE() before each. True when something was written or removed."""
        fence = fence or (lambda force=False: None)
        if storage.is_local(self.root):
            link = storage.resolve(self.view)[1]
            if os.path.islink(link):              # earlier versions made latest a symlink
                os.remove(link)
        wanted = self._wanted(run_id, filtered)
        current = {path: _read_json_or_none(path) for path in wanted}
        if current == wanted:
            return False
        if current[self.view_filter] is not None:
            fence(force=True)
            storage.delete(self.view_filter)
        if current[self.view_run] != wanted[self.view_run]:
            fence(force=True)
            storage.write_bytes(self.view_run, _encode(wanted[self.view_run]))
        if wanted[self.view_filter] is not None:
            fence(force=True)
            storage.write_bytes(self.view_filter, _encode(wanted[self.view_filter]))
        return True

    def publish(self, run_id: str, fence=None, filtered: str | None = None) -> None:
        """Make run RUN_ID (with its filter run in FILTERED, when it has one) current for every
        reader: the next version of latest (the commit point; OutputBusy when another refresh took
        its number), then its copies (latest.json, the latest/ view). A refresh that finds a newer
        version after writing the view (it was paused in between) makes the view the newer one's
        again and stops (OutputBusy)."""
        record = {"run_id": run_id, "path": f"runs/{run_id}", "published_at": time.time()}
        if filtered and read_manifest(filtered, FILTER_MANIFEST) is not None:
            record["filtered"] = entry_path(self.root, filtered)
        try:
            self.version = storage.write_if(self.named_path, _encode(record), self.version, keep=None)
        except storage.Conflict:
            raise self._busy("its next version was taken") from None
        self.named = record
        self.write_view(run_id, fence, self.filter_path)
        if storage.read_versioned(self.named_path)[1].number != self.version.number:
            Latest(self.root).repair()
            raise self._busy("a newer version appeared while the view was written")

    def repair(self) -> None:
        """A refresh stopped while publishing left latest.json or latest/ a copy of another run
        than latest's newest version names (or half of one): made that run's again."""
        storage.versions.repair_copy(self.named_path)
        if self.run_id and self.write_view(self.run_id, filtered=self.filter_path):
            log.warning("latest/ did not match latest (a refresh stopped while publishing): made it run %s again",
                        self.run_id)

    def fence(self, lease_fence):
        """The lease's fence, watching latest too: what retention checks before each delete."""
        return lease_fence.watching(self.named_path, self.version, "latest")


def _read_json_or_none(path: str):
    try:
        raw = storage.read_bytes(path)
    except FileNotFoundError:
        return None
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


def latest_run(root: str) -> str | None:
    """The run directory ROOT/latest.json names, or None."""
    run_id = Latest(root).run_id
    return storage.join(root, "runs", run_id) if run_id else None


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


def _held(run_dir: str, now: float) -> bool:
    held = holder(run_dir, now=now)
    if held is not None and held[1]:
        log.info("retention keeps %s: %s holds it (%s)", run_dir, held[0].get("run_id"), held[2])
        return True
    return False


DEFAULT_RETAIN_HOURS = 24.0


def recently_named(root: str, retain_seconds: float, now: float) -> set[str]:
    """The runs a version of latest written in the last RETAIN_SECONDS (by the store's clock,
    NOW) named: a reader that opened one then may still be reading it. The versions older than
    that are forgotten (never the newest)."""
    path = storage.join(root, LATEST)
    named, older = set(), 0
    for version, raw in storage.history(path):
        if version.mtime is not None and now - version.mtime > retain_seconds:
            older = version.number
            continue
        with contextlib.suppress(ValueError, AttributeError, UnicodeDecodeError):
            run_id = json.loads(raw.decode("utf-8")).get("run_id") if raw else None
            if run_id:
                named.add(run_id)
    if older:
        storage.versions.forget(path, below=older + 1)
    return named


def prune(root: str, keep: int, with_filter: bool, current: str | None, log_of: str | None = None,
          fence=None, retain_seconds: float = DEFAULT_RETAIN_HOURS * 3600) -> list[str]:
    """Remove from ROOT/runs every run but the newest KEEP complete ones (with WITH_FILTER: those
    with their filter run), CURRENT (latest's target), every run a version of latest written in
    the last RETAIN_SECONDS named (by the store's clock: a reader may still hold its manifest),
    every run a kept run or the latest/ view takes files from, transitively, and every run whose
    claim is alive; their filter runs go with them, and the logs of what was removed (but
    LOG_OF's: a no-op refresh keeps its own log until the next refresh). FENCE() runs before each
    delete."""
    fence = fence or (lambda force=False: None)
    now = storage.store_now(root)
    runs_dir = storage.join(root, "runs")
    names = storage.listdir(runs_dir)
    committed = {n for n in names if storage.isfile(storage.join(runs_dir, n, MANIFEST))}
    complete = [n for n in sorted(committed)
                if not with_filter or storage.isfile(storage.join(filter_dir(root, n), FILTER_MANIFEST))]
    kept = set(complete[-keep:]) | ({current} if current else set())
    kept |= recently_named(root, retain_seconds, now) & set(names)
    view = storage.join(root, "latest", MANIFEST)
    if storage.isfile(view):                                       # a view out of step with latest still reads files
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
    kept |= {n for n in names if n not in kept and _held(storage.join(runs_dir, n), now)}
    removed = [n for n in names if n not in kept]
    for folder in (root, storage.join(root, storage.versions.LOG)):      # killed writes' and probes' hidden files
        remove_staged(folder, fence)
    for name in removed:
        fence()
        storage.delete_tree(storage.join(runs_dir, name))
    for name in storage.listdir(storage.join(root, "filtered")):       # filter runs of runs gone
        if run_of_filter_folder(name) not in kept:
            fence()
            storage.delete_tree(storage.join(root, "filtered", name))
    for log_name in storage.listdir(storage.join(root, "logs")):      # logs of runs gone, of no-op refreshes
        if run_of_log(log_name) not in kept | {log_of}:
            fence()
            storage.delete(storage.join(root, "logs", log_name))
    return removed
