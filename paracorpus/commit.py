"""Publishing a run without renames: data files under unique names, a manifest written last.

Object stores cannot rename a directory, so a run is never "moved into place". Instead:

* every data file gets a name no other attempt uses (``part-u000042-3f9a1c2e.parquet``: work
  unit and attempt), written whole (common/storage.open_output);
* a run in progress keeps its bookkeeping under ``OUT/_work/<run id>/`` (its plan and one
  completion record per finished work unit, for --resume);
* the run is published by creating the next version of its manifest last
  (``OUT/_log/<n>-_manifest.json``, put-if-absent: common/storage/versions.py), numbered one above
  the version the run planned on, then copying it to ``OUT/<manifest>`` for readers: the filter
  and embedding jobs (:func:`committed_files`) read only what it lists, so they never see a
  partial file or one an abandoned attempt left, and a run that another published over in the
  meantime finds its number taken and publishes nothing (exit 75);
* after the manifest is written, files it does not list (the previous run's, dead attempts') and
  the run's ``_work`` are removed, each delete fenced (:class:`Fence`); ``_work/<run id>`` goes
  last, so while it is there the clean-up is unfinished and the next start finishes it.

A committed run stays readable until a new run commits over it, so a rerun that fails destroys
nothing. The claim (``OUT/_log/<n>-_owner.json``: a random token, host, pid) names the run writing
in OUT; each renewal of its heartbeat creates the next version: a holder paused past its lease
(SIGSTOP, a suspended SLURM job, a VM pause) finds its next number taken and stops (exit 75), and
its publish, whose number is taken too, creates nothing, whatever it believes. A lease is taken
over when its holder's process is gone from this host, or when its newest version is older than
the lease by the store's own clock (the store's time now, read from a probe file, less the time
the store stamped on the version: no two machines' clocks compared); two takers of one stale
version race for one number, and one wins.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import posixpath
import re
import threading
import time
import uuid

from common import processes, storage
from common.cli import OutputBusy, UsageError
from common.names import check_run_id
from common.settings import env_seconds

log = logging.getLogger("paragen")
OWNER = "_owner.json"
WORK = "_work"
LEASE_ENV = "PARAGEN_LEASE_SECONDS"
DEFAULT_LEASE_SECONDS = 300.0     # an owner record not renewed this long (by the store's clock) is taken for dead
FENCE_SECONDS = 2.0               # a clean-up looks again at its claim and manifest after this long (or a pause)


def lease_seconds() -> float:
    """How long an owner record may go unrenewed before its holder is taken for dead:
    $PARAGEN_LEASE_SECONDS (default 300; 2-86400); the heartbeat renews it ten times as often."""
    return env_seconds(LEASE_ENV, DEFAULT_LEASE_SECONDS, 2, 86400, UsageError)


def heartbeat_seconds() -> float:
    return lease_seconds() / 10


def new_run_id() -> str:
    """A unique, sortable run id: UTC timestamp plus a short random part."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


def attempt_id() -> str:
    """A name part no other attempt of any work unit uses."""
    return uuid.uuid4().hex[:8]


def work_dir(output: str, run_id: str) -> str:
    return storage.join(output, WORK, check_run_id(run_id))


def boottime() -> float:
    """Seconds by this machine's clock that keeps counting while the host is suspended
    (CLOCK_BOOTTIME; the monotonic clock does not count a suspend): what the fences' throttles
    measure, so a holder resumed after any pause looks at the store before its next step."""
    return time.clock_gettime(time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic()


def _owner_alive(owner: dict, version: storage.Version, now: float) -> tuple[bool, str]:
    """(alive?, why) for the claim record OWNER at VERSION. Its age is the store's time NOW less
    the time the store stamped on the version (storage.store_now): one clock, the store's, so a
    holder or a taker whose clock runs ahead or behind cannot make a record look fresh or stale."""
    if processes.ended(owner):
        return False, f"its process {owner['pid']} on this host has ended"
    if version.mtime is None:
        return True, f"host {owner.get('host')}, pid {owner.get('pid')}"
    age = now - version.mtime
    if age > lease_seconds():
        return False, f"its record was last renewed {age:.0f} s ago by the store's clock (lease {lease_seconds():.0f} s)"
    return True, f"host {owner.get('host')}, pid {owner.get('pid')}, renewed {max(age, 0):.0f} s ago"


def holder(output: str, name: str = OWNER, now: float | None = None) -> tuple[dict, bool, str] | None:
    """Who holds OUTPUT: (its claim record, alive?, why), or None when nobody does. A holder is
    gone when its process on this host has ended or its record outlived the lease by the store's
    clock (NOW: storage.store_now of OUTPUT's store, probed when not given)."""
    raw, version = storage.read_versioned(storage.join(output, name))
    owner = _parse_owner(raw)
    if owner is None:
        return None
    alive, why = _owner_alive(owner, version, storage.store_now(output) if now is None else now)
    return owner, alive, why


def claim_record(output: str, name: str = OWNER) -> dict | None:
    """The claim on OUTPUT now (its newest version's record), or None when nobody holds it
    (released, or never claimed)."""
    return _parse_owner(storage.read_versioned(storage.join(output, name))[0])


def _parse_owner(raw: bytes | None) -> dict | None:
    try:
        owner = json.loads(raw.decode("utf-8")) if raw is not None else None
    except (UnicodeDecodeError, ValueError, RecursionError):
        return {}                   # not a record this code wrote: judged by its age alone
    return owner if isinstance(owner, dict) else ({} if raw is not None else None)


class Fence:
    """The one check of every writer of a run before a write or a delete others would see (the
    driver, its worker processes, Dask workers, the jobs a refresh runs): the claim on OUTPUT (its
    record NAME, a sequence of versions: storage.versions) still carries TOKEN and was not released
    in this process, and each record WATCHED (path, version number, what it is) is still at that
    version. OutputBusy (exit 75) otherwise. It looks at the store again when FENCE_SECONDS have
    passed since its last look by CLOCK_BOOTTIME, which counts a pause and a suspend too, so a
    holder resumed after any pause looks before its next step. Picklable: it travels with the
    DoFns. An empty TOKEN checks no claim (tools that write a run by hand). THROTTLE False: every
    call looks (a worker's, before and after each unit's files: a few looks a unit)."""

    def __init__(self, output: str, token: str, name: str = OWNER, watched: tuple = (), throttle: bool = True):
        self.output, self.token, self.name, self.watched = output, token, name, tuple(watched)
        self.throttle = throttle
        self._last: float | None = None

    def watching(self, path: str, version: storage.Version, what: str = "") -> "Fence":
        """This fence and PATH still at VERSION (WHAT names it in the refusal)."""
        return Fence(self.output, self.token, self.name, self.watched + ((path, version.number, what),), self.throttle)

    def __getstate__(self):
        return {**self.__dict__, "_last": None}

    def __call__(self, force: bool = False) -> None:
        if self.token and self.token in _RELEASED:
            raise OutputBusy(f"{self.output}: this run's claim was released (the job is ending); nothing more is "
                             "written")
        if not force and self.throttle and self._last is not None and boottime() - self._last < FENCE_SECONDS:
            return
        for _ in range(3):
            began = boottime()
            self._look()
            if boottime() - began < FENCE_SECONDS:
                break           # else what it read may be from before a pause: look again (a slow store: 3 looks)
        self._last = began      # when the look began: a pause inside it is counted, not hidden

    def _look(self) -> None:
        if self.token:
            owner = _parse_owner(storage.read_versioned(storage.join(self.output, self.name))[0])
            if not owner or owner.get("token") != self.token:
                who = f"run {owner.get('run_id')} holds it now" if owner else "its claim record is gone"
                raise OutputBusy(f"{self.output}: this run lost its claim ({who}); it stops without writing or "
                                 "removing anything more")
        for path, number, what in self.watched:
            current = storage.read_versioned(path)[1].number
            if current != number:
                raise OutputBusy(f"{what or path} ({path}) changed while this run ran (version {number}, now "
                                 f"{current}: another run wrote it); this one writes and removes nothing more: run the "
                                 "same command again to build on the new one")


class Claim:
    """This run's claim on OUT: a record (OUT/NAME) kept as numbered versions, each created once
    (storage.versions): acquiring creates the next version over a free or dead holder's, the
    heartbeat thread creates the next over its own, and releasing creates a tombstone. A holder
    whose next number another took has lost, on every store, however long it was paused: its
    renewal is refused and ON_LOST(why) is called (the job stops, exit 75, touching nothing).
    :attr:`fence` is what every write of this run checks first."""

    def __init__(self, output: str, run_id: str, name: str = OWNER, on_lost=None):
        self.output, self.run_id = output, run_id
        self.path = storage.join(output, name)
        self.token = uuid.uuid4().hex
        self.on_lost = on_lost
        self.fence = Fence(output, self.token, name)
        self.version: storage.Version | None = None     # what this claim last wrote
        self._lock = threading.Lock()                    # a renewal and a release take turns
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = time.time()
        self._made = False                               # OUT was empty or absent when acquire() began
        self._first: int | None = None                   # this claim's first version, when it was over a free one

    def _record(self) -> bytes:
        return json.dumps({"run_id": self.run_id, "token": self.token, **processes.identity(),
                           "started": self._started, "heartbeat": time.time()}, indent=2).encode()

    def _busy(self, owner: dict, why: str) -> OutputBusy:
        return OutputBusy(f"{self.output} is being written by run {owner.get('run_id')} ({why}); wait for it to "
                          "finish (a second writer would mix their files); a holder stopped without a word "
                          f"(SIGKILL, a lost node) is taken over once its record is {lease_seconds():.0f} s old "
                          f"by the store's clock ({LEASE_ENV})")

    def acquire(self) -> "Claim":
        """Create the next version of the claim record over a free or dead holder's; OutputBusy
        (exit status 75: try again later) if another live run holds OUT (another process of the
        same run, the same command started twice, too). The store's put-if-absent is checked
        first (storage.store_now), and its clock read for the lease."""
        self._made = not storage.exists(self.output)
        now = storage.store_now(self.output)
        for _ in range(5):
            raw, version = storage.read_versioned(self.path)
            owner = _parse_owner(raw)
            if owner is not None:
                alive, why = _owner_alive(owner, version, now)
                if alive:
                    raise self._busy(owner, why)
                log.info("taking over %s from run %s: %s", self.output, owner.get("run_id"), why)
            try:                                   # one taker wins; the others read its version next
                self.version = storage.write_if(self.path, self._record(), version, copy=False)
                self._first = self.version.number if owner is None else None
                break
            except storage.Conflict:
                continue
        else:
            owner = _parse_owner(storage.read_versioned(self.path)[0]) or {}
            raise OutputBusy(f"{self.output}: another run ({owner.get('run_id')}) claimed it at the same time")
        self._stop.clear()
        self.fence._last = boottime()
        storage.fence_writes(self.output, self.check_if_due)     # every later write of this process looks first
        self._thread = threading.Thread(target=self._beat, name="paragen-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _lost(self, owner: dict | None) -> OutputBusy:
        who = f"run {owner.get('run_id')} holds it now" if owner else "its claim record is gone"
        return OutputBusy(f"{self.output}: this run ({self.run_id}) lost its claim ({who}); it stops without "
                          "writing or removing anything")

    def check(self) -> None:
        """OutputBusy (exit 75) unless the claim record still carries this claim's token."""
        self.fence(force=True)

    def check_if_due(self) -> None:
        """:meth:`check` when FENCE_SECONDS have passed since the last look (by CLOCK_BOOTTIME):
        what every write and delete under OUT runs first (storage.fence_writes)."""
        self.fence(force=False)

    def rename(self, run_id: str) -> None:
        """Name RUN_ID in the record from now on (the run a plan under the claim chose), renewed
        at once so that a refused start names the right run."""
        if run_id == self.run_id:
            return
        self.run_id = run_id
        with self._lock:
            try:
                self.version = storage.write_if(self.path, self._record(), self.version, copy=False)
            except storage.Conflict:
                raise self._lost(_parse_owner(_read_quietly(self.path))) from None

    def _beat(self) -> None:
        while not self._stop.wait(heartbeat_seconds()):
            try:
                with self._lock:
                    if self._stop.is_set():
                        return
                    self.version = storage.write_if(self.path, self._record(), self.version, copy=False)
            except storage.Conflict:
                lost = self._lost(_parse_owner(_read_quietly(self.path)))
                if self.on_lost is not None:
                    self.on_lost(str(lost))
                return
            except OutputBusy as exc:          # a fence refused: this claim's own, or a refresh's lease over it
                if self.on_lost is not None and self.token not in _RELEASED:    # not this claim being released
                    self.on_lost(str(exc))
                return
            except Exception:  # noqa: BLE001: a missed renewal is retried; the job goes on
                pass

    def release(self) -> None:
        """Stop renewing (the writers of this process see it at once: Fence) and create a
        tombstone over the version this claim wrote (nothing when another took it since)."""
        _RELEASED.add(self.token)
        storage.unfence_writes(self.output)
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        with self._lock:
            version, self.version = self.version, None
        if version is None:
            return
        try:
            released = storage.delete_if(self.path, version, copy=False)
        except OutputBusy:          # a fence above it refused (the refresh running this job lost its lease)
            released = False
        except OSError as exc:      # a store that is away: the record goes stale, the next run takes over
            log.warning("could not release the claim %s (%s); the next run takes it over once it is stale",
                        self.path, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            released = False
        if released and self._first is not None:
            self._forget_own(version.number + 1)
        if released and self._made and self._first is not None:
            _remove_if_empty(self.output)       # an output the claim made and nothing filled (nothing to do)

    def _forget_own(self, tombstone: int) -> None:
        """Remove this claim's own versions, its tombstone last, when it was taken over a free
        record (never after a takeover: a paused holder could then create a number again): the
        record is as it was before, so a refused or no-op run leaves nothing behind. A taker that
        read a version removed here is refused by its own check and reads again."""
        with contextlib.suppress(OSError, storage.StorageError, OutputBusy):
            for number in range(self._first, tombstone + 1):
                with contextlib.suppress(FileNotFoundError):
                    storage.delete(storage.versions.version_path(self.path, number))
            log_dir = storage.versions.log_dir(self.path)
            if storage.is_local(log_dir) and not storage.listdir(log_dir):
                os.rmdir(storage.resolve(log_dir)[1])

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
        return False


_RELEASED: set = set()            # tokens of the claims released in this process


def _remove_if_empty(output: str) -> None:
    """Remove OUTPUT's folder when nothing is left in it after a claim that made it forgot its own
    versions (_forget_own): a run that found nothing to do leaves no empty output behind. Only
    empty folders go: a version another claimant created meanwhile (it read this claim's
    tombstone) stays, and with it the numbering it continues. In a bucket the folder is the empty
    marker object pyarrow made for the log, removed when nothing is under it."""
    if not storage.is_local(output):
        log_dir = storage.join(output, storage.versions.LOG)
        with contextlib.suppress(OSError, storage.StorageError, OutputBusy):
            in_bucket = "/" in output.split("://", 1)[-1].strip("/")      # never a bucket itself
            for folder in (log_dir, output) if in_bucket else (log_dir,):   # pyarrow may make the parent's marker again
                if not storage.listdir(folder):
                    storage.delete_tree(folder)
        return
    local = storage.resolve(output)[1]
    with contextlib.suppress(OSError):
        os.rmdir(os.path.join(local, storage.versions.LOG))
    with contextlib.suppress(OSError):
        os.rmdir(local)


def _read_quietly(path: str) -> bytes | None:
    with contextlib.suppress(Exception):
        return storage.read_versioned(path)[0]
    return None


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
    return read_manifest_versioned(output, name)[0]


def read_manifest_versioned(output: str, name: str) -> tuple[dict | None, storage.Version]:
    """(OUTPUT/NAME's manifest or None, the version read): what a run plans on, and what its
    publish then requires to be still there."""
    path = storage.join(output, name)
    raw, version = storage.read_versioned(path)
    if raw is None:
        return None, version
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ValueError(f"{path}: not a JSON manifest") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{path}: not a JSON manifest")
    return manifest, version


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
            expected: storage.Version | None = None, guard=contextlib.nullcontext, fence: Fence | None = None
            ) -> list[str]:
    """Publish MANIFEST (it lists the run's files under 'files') as the next version of
    OUTPUT/MANIFEST_NAME after EXPECTED, the one the run planned on (another run that published in
    the meantime took that number: OutputBusy, exit 75, nothing written); then remove what it does
    not list (remove_unlisted, each delete fenced; a stop during it leaves the rest to the next
    start: beam_pipelines/commit.finish_cleanup). The version is created inside GUARD() (a signal
    waits for it, and is told once the run is public). FENCE (the claim's) runs before the
    manifest and, watching the manifest too, before each delete. EXPECTED None: over whatever is
    there now (tools that publish by hand). Returns the removed files."""
    path = storage.join(output, manifest_name)
    if expected is None:
        expected = storage.read_versioned(path)[1]
    with guard() as guarded:
        if fence is not None:
            fence(force=True)
        try:
            written = storage.write_if(path, json.dumps(manifest, indent=2).encode("utf-8"), expected)
        except storage.Conflict:
            other = _read_quietly(path)
            try:
                other_id = json.loads(other).get("run_id") if other else None
            except (ValueError, AttributeError):
                other_id = None
            raise OutputBusy(f"{output}: another run ({other_id or 'its manifest removed'}) published here after this run "
                             f"({manifest.get('run_id')}) planned on {'an empty output' if expected.absent else 'the run before'}; "
                             "this run publishes nothing (its finished units are kept)") from None
        if guarded is not None:
            guarded.published(f"run {manifest.get('run_id')} is published")
    fence = fence or Fence(output, "")
    return remove_unlisted(output, manifest, tables, fence.watching(path, written, "this run's manifest"))


STAGED_LEFTOVER = re.compile(r"^\..+\.[0-9a-f]{32}\.tmp$")     # common/storage/writing._staged's names


def remove_staged(folder: str, fence=None) -> None:
    """Remove the hidden temporary files killed writes left in FOLDER (on a local disk), and the
    store probes killed processes left there (on every store) (FENCE() before each), never one
    this process is writing or probing with now (its claim's heartbeat: a version whose staged
    file went would read as a lost claim). Another live process's write that loses its staged file
    stages it again, and its probe probes again (common/storage/conditional.py)."""
    local = storage.is_local(folder)
    for name in storage.listdir(folder):
        if not (storage.PROBE_NAME.match(name) or (local and STAGED_LEFTOVER.match(name))):
            continue
        path = storage.join(folder, name)
        if storage.staged_in_flight(path) or storage.probe_in_flight(path) or not storage.isfile(path):
            continue
        if fence is not None:
            fence()
        storage.delete(path)


def remove_unlisted(output: str, manifest: dict, tables: tuple[str, ...], fence=None) -> list[str]:
    """Remove what MANIFEST does not list under OUTPUT/<table> (an earlier run's files, a dead
    attempt's), the hidden temporary files a killed write left in OUTPUT, and OUTPUT/_work: the
    other runs' first, this run's own last, so that while ``_work/<its run id>`` is there the
    clean-up is known to be unfinished. FENCE() runs before each delete (Fence: this run still
    holds OUTPUT and its manifest is still there). The removed files; safe to cut short and to
    run again.

    What is kept is decided by where each listed file really is, so a file the manifest reuses
    from the run it replaces (``--previous OUT --output OUT``) stays, however it is named."""
    fence = fence or (lambda force=False: None)
    for table in manifest.get("files", {}):
        storage.makedirs(storage.join(output, table))       # a table with no rows is still there, empty
    keep = {file_location(output, f) for files in manifest.get("files", {}).values() for f in files}
    removed = []
    for table in tables:
        root = storage.join(output, table)
        for path in storage.list_files(root):
            if _canonical(path) not in keep:
                fence()
                storage.delete(path)
                removed.append(table + "/" + _relative(root, path))
    remove_staged(output, fence)
    if storage.is_local(output):
        remove_staged(storage.join(output, storage.versions.LOG), fence)      # a version's, killed before its link
    work = storage.join(output, WORK)
    mine = manifest.get("run_id")
    for name in sorted(storage.listdir(work), key=lambda n: n == mine):
        fence()
        storage.delete_tree(storage.join(work, name))
    storage.delete_tree(work)
    return removed


def cleanup_pending(output: str, manifest: dict | None) -> bool:
    """True when OUTPUT's committed run (MANIFEST) was stopped during its clean-up: its
    ``_work/<run id>``, removed last, is still there."""
    try:
        return bool(manifest) and storage.exists(work_dir(output, manifest.get("run_id")))
    except UsageError:             # not a run id this code wrote: no _work of it
        return False


def _relative(root: str, path: str) -> str:
    if storage.is_url(root):
        return path[len(root.rstrip("/")) + 1:]
    return os.path.relpath(path, root).replace(os.sep, "/")
