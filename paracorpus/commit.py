"""Publishing a run without renames: data files under unique names, a manifest written last.

Object stores cannot rename a directory, so a run is never "moved into place". Instead:

* every data file gets a name no other attempt uses (``part-u000042-3f9a1c2e.parquet``: work
  unit and attempt), written whole (common/storage.open_output);
* a run in progress keeps its bookkeeping under ``OUT/_work/<run id>/`` (its plan and one
  completion record per finished work unit, for --resume);
* the run is published by writing ``OUT/<manifest>`` last: it lists every committed file, and
  readers (the filter and embedding jobs, :func:`committed_files`) read only what it lists, so they
  never see a partial file or one an abandoned attempt left;
* after the manifest is written, files it does not list (the previous run's, dead attempts') and
  the run's ``_work`` are removed.

A committed run stays readable until a new run commits over it, so a rerun that fails destroys
nothing. ``OUT/_owner.json`` names the run writing in OUT (a random token, host, pid, a heartbeat
renewed every 30 s), created only if absent (a local link, S3's ``If-None-Match: *``); a second
writer is refused while it is alive, and the holder checks the token is still its own before
the manifest and before any delete. On stores without a conditional create here (GCS, HDFS) the
record is written and read back: two runs that start within the same instant may both pass, and
the checks stop the one whose token was overwritten (exit 75) before it writes a manifest or
removes a file.
"""
from __future__ import annotations

import contextlib
import json
import os
import posixpath
import socket
import threading
import time
import uuid

import logging

from common import storage
from common.cli import OutputBusy
from common.names import check_run_id

log = logging.getLogger("paragen")
OWNER = "_owner.json"
WORK = "_work"
HEARTBEAT_SECONDS = 30.0
STALE_SECONDS = 300.0          # an owner silent this long is taken for dead


def new_run_id() -> str:
    """A unique, sortable run id: UTC timestamp plus a short random part."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


def attempt_id() -> str:
    """A name part no other attempt of any work unit uses."""
    return uuid.uuid4().hex[:8]


def work_dir(output: str, run_id: str) -> str:
    return storage.join(output, WORK, check_run_id(run_id))


def _process_identity() -> dict:
    """What tells this process apart from one with the same pid elsewhere: the host name, the
    kernel's boot id and the pid namespace (pods with host networking share a host name, not
    their pids)."""
    ident = {"host": socket.gethostname(), "pid": os.getpid()}
    with contextlib.suppress(OSError):
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            ident["boot_id"] = f.read().strip()
    with contextlib.suppress(OSError):
        ident["pid_ns"] = os.stat("/proc/self/ns/pid").st_ino
    return ident


def _same_pid_space(owner: dict) -> bool:
    """True when OWNER's pid means a process of this machine's pid namespace."""
    mine = _process_identity()
    if owner.get("host") != mine["host"] or not owner.get("pid"):
        return False
    return all(owner.get(k) == mine.get(k) for k in ("boot_id", "pid_ns") if k in owner or k in mine)


def _owner_alive(owner: dict) -> tuple[bool, str]:
    """(alive?, why) for the owner record OWNER."""
    age = time.time() - float(owner.get("heartbeat", 0))
    if _same_pid_space(owner):
        try:
            os.kill(int(owner["pid"]), 0)
        except ProcessLookupError:
            return False, f"its process {owner['pid']} on this host has ended"
        except PermissionError:
            pass                   # alive, another user's
    if age > STALE_SECONDS:
        return False, f"its heartbeat is {age:.0f} s old"
    return True, f"host {owner.get('host')}, pid {owner.get('pid')}, heartbeat {age:.0f} s ago"


class Claim:
    """This run's claim on OUT: the owner record (OUT/NAME) with a random token, created only if
    absent (storage.create_new: a local link, S3's If-None-Match; read back on stores without a
    conditional create) and renewed by a heartbeat thread until released; a lease others respect
    while its holder is alive and its heartbeat fresh. The holder checks that the record still
    carries its token before every step others would see (:meth:`check`: before the manifest,
    before deleting); a heartbeat that finds another token calls ON_LOST(why) (the job stops,
    exit status 75, touching nothing)."""

    def __init__(self, output: str, run_id: str, name: str = OWNER, on_lost=None):
        self.output, self.run_id = output, run_id
        self.path = storage.join(output, name)
        self.token = uuid.uuid4().hex
        self.on_lost = on_lost
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = time.time()

    def _record(self) -> dict:
        return {"run_id": self.run_id, "token": self.token, **_process_identity(), "started": self._started,
                "heartbeat": time.time()}

    def _busy(self, owner: dict, why: str) -> OutputBusy:
        return OutputBusy(f"{self.output} is being written by run {owner.get('run_id')} ({why}); wait for it to "
                          "finish (a second writer would mix their files); a holder stopped without a word "
                          f"(SIGKILL, a lost node) is taken over once its heartbeat is {STALE_SECONDS:.0f} s old")

    def acquire(self) -> "Claim":
        """Create the owner record, or OutputBusy (exit status 75: try again later) if another live
        run holds OUT (another process of the same run, the same command started twice, too)."""
        for _ in range(5):
            created = storage.create_new(self.path, json.dumps(self._record(), indent=2).encode())
            owner = _read_owner(self.path)
            if owner is not None and owner.get("token") == self.token:
                break                              # ours (a retried create that had succeeded, too)
            if created or owner is None:           # a rival replaced or removed it in between: look again
                time.sleep(0.05)
                continue
            alive, why = _owner_alive(owner)
            if alive:
                raise self._busy(owner, why)
            log.info("taking over %s from run %s: %s", self.output, owner.get("run_id"), why)
            again = _read_owner(self.path)
            if again is not None and again.get("token") == owner.get("token"):
                storage.delete(self.path)          # the stale record; a rival taking over too: one create wins
        else:
            owner = _read_owner(self.path) or {}
            raise OutputBusy(f"{self.output}: another run ({owner.get('run_id')}) claimed it at the same time")
        self._thread = threading.Thread(target=self._beat, name="paragen-heartbeat", daemon=True)
        self._thread.start()
        return self

    def check(self) -> None:
        """OutputBusy (exit 75) unless the owner record still carries this claim's token."""
        owner = _read_owner(self.path)
        if owner is None or owner.get("token") != self.token:
            who = f"run {owner.get('run_id')} holds it now" if owner else "its owner record is gone"
            raise OutputBusy(f"{self.output}: this run ({self.run_id}) lost its claim ({who}); it stops without "
                             "writing or removing anything")

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                self.check()
                storage.write_json(self.path, self._record())
            except OutputBusy as lost:
                if self.on_lost is not None:
                    self.on_lost(str(lost))
                return
            except Exception:  # noqa: BLE001: a missed heartbeat is retried; the job goes on
                pass

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        try:
            owner = _read_owner(self.path) if storage.exists(self.path) else None
            if owner and owner.get("token") == self.token:
                storage.delete(self.path)
        except OSError as exc:      # a store that is away: the record goes stale, the next run takes over
            log.warning("could not remove the owner record %s (%s); the next run takes it over once it is stale",
                        self.path, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
        return False


def _read_owner(path: str) -> dict | None:
    try:
        owner = storage.read_json(path)
    except (FileNotFoundError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def resumable_run(output: str, same) -> str | None:
    """The newest unfinished run in OUTPUT whose plan SAME(plan record) accepts (same inputs,
    config and models), or None."""
    found = []
    for run_id in storage.listdir(storage.join(output, WORK)):
        plan_path = storage.join(output, WORK, run_id, "plan.json")
        if storage.isfile(plan_path):
            plan = storage.read_json(plan_path)
            if same(plan):
                found.append(run_id)
    return sorted(found)[-1] if found else None


def read_manifest(output: str, name: str) -> dict | None:
    path = storage.join(output, name)
    return storage.read_json(path) if storage.isfile(path) else None


def _canonical(path: str) -> str:
    """PATH with '.' and '..' resolved: symlinks followed on a local disk (so 'ROOT/latest/..'
    is where the kernel would go), lexically in a URL's key."""
    if not storage.is_url(path):
        return os.path.realpath(path)
    scheme, rest = path.split("://", 1)
    bucket, _, key = rest.partition("/")
    key = posixpath.normpath(key) if key else ""
    return f"{scheme}://{bucket}" + (f"/{key}" if key and key != "." else "")


def file_location(manifest_dir: str, entry: dict) -> str:
    """Where a manifest ENTRY's file is, the manifest being in MANIFEST_DIR: ``path`` is relative
    to that directory (it may climb out of it with '..' into an earlier run on the same disk) or a
    full URL. Contract 2 manifests named an earlier run's file by a ``root`` (a sibling run's
    name, or its full path or URL) beside its path; they are still read."""
    path, root = entry["path"], entry.get("root")
    if root:
        if storage.is_url(root) or os.path.isabs(root):
            return _canonical(storage.join(root, path))
        return _canonical(storage.join(storage.parent(_canonical(manifest_dir)), root, path))
    if storage.is_url(path) or os.path.isabs(path):
        return _canonical(path)
    return _canonical(storage.join(_canonical(manifest_dir), path))


def entry_path(manifest_dir: str, location: str) -> str:
    """How a manifest in MANIFEST_DIR names the file at LOCATION (a path or URL): relative to
    MANIFEST_DIR on a local disk (with '..' to reach another run) and under it in a bucket,
    else (another bucket, or outside MANIFEST_DIR in a bucket: keys have no '..') the full URL."""
    base, location = _canonical(manifest_dir), _canonical(location)
    if storage.is_url(base) != storage.is_url(location):
        return location
    if not storage.is_url(base):
        return os.path.relpath(location, base).replace(os.sep, "/")
    return location[len(base) + 1:] if location.startswith(base + "/") else location


def is_under(path: str, directory: str) -> bool:
    """True when the (canonical) PATH lies inside DIRECTORY."""
    path, directory = _canonical(path), _canonical(directory)
    return path.startswith(directory.rstrip("/") + "/")


def committed_files(output: str, table: str, manifest_name: str = "_manifest.json") -> list[str]:
    """The files of TABLE that OUTPUT's manifest lists, as full paths or URLs. FileNotFoundError
    when OUTPUT holds no committed run."""
    manifest = read_manifest(output, manifest_name)
    if manifest is None:
        raise FileNotFoundError(f"{output}: no {manifest_name}, so no committed run (unfinished, or not a run)")
    return [file_location(output, f) for f in manifest.get("files", {}).get(table, [])]


def publish(output: str, manifest_name: str, manifest: dict, tables: tuple[str, ...],
            guard=contextlib.nullcontext, check=None) -> list[str]:
    """Write MANIFEST (it lists the run's files under 'files') as OUTPUT/MANIFEST_NAME (inside
    GUARD(): a signal waits for it, and is told once the run is public), then remove what it does
    not list (remove_unlisted; a stop during it leaves the rest to the next start:
    beam_pipelines/commit.finish_cleanup). CHECK() (Claim.check) runs before the manifest and
    before the first delete: a run that lost its claim writes and removes nothing. Returns the
    removed files."""
    with guard() as guarded:
        if check is not None:
            check()
        storage.write_json(storage.join(output, manifest_name), manifest)
        if guarded is not None:
            guarded.published(f"run {manifest.get('run_id')} is published")
    if check is not None:
        check()
    return remove_unlisted(output, manifest, tables)


def remove_unlisted(output: str, manifest: dict, tables: tuple[str, ...]) -> list[str]:
    """Remove what MANIFEST does not list under OUTPUT/<table> (an earlier run's files, a dead
    attempt's) and all of OUTPUT/_work; the removed files. Safe to cut short and to run again.

    What is kept is decided by where each listed file really is, so a file the manifest reuses
    from the run it replaces (``--previous OUT --output OUT``) stays, however it is named."""
    for table in manifest.get("files", {}):
        storage.makedirs(storage.join(output, table))       # a table with no rows is still there, empty
    keep = {file_location(output, f) for files in manifest.get("files", {}).values() for f in files}
    removed = []
    for table in tables:
        root = storage.join(output, table)
        for path in storage.list_files(root):
            if _canonical(path) not in keep:
                storage.delete(path)
                removed.append(table + "/" + _relative(root, path))
    storage.delete_tree(storage.join(output, WORK))
    return removed


def _relative(root: str, path: str) -> str:
    if storage.is_url(root):
        return path[len(root.rstrip("/")) + 1:]
    return os.path.relpath(path, root).replace(os.sep, "/")
