"""Writing a file whole or not at all: a local file is staged under a hidden name, synced and
renamed; a remote one is spooled locally and uploaded whole (an object appears only when its
upload completes), again from the spool after a failure; on HDFS, which shows a file while it is
written, uploaded under a hidden name and renamed into place. Deletes and copies."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time

import pyarrow.fs as pafs

from common.atomic import staged_name
from common.crash_points import storage_op
from common.storage import webhdfs
from common.storage.paths import is_local, is_url, join
from common.storage.reading import _info, open_input, stat
from common.storage.retries import StorageError, retrying
from common.storage.stores import resolve

log = logging.getLogger("paragen.storage")
_FENCES: dict = {}              # folder -> a check every write and delete under it runs first (fence_writes)


def fence_writes(folder: str, check) -> None:
    """From now on, every write and delete under FOLDER in this process runs CHECK() first (a
    claim's check when it is due: paracorpus.commit.Claim), so a holder resumed after a pause
    looks at its claim before its next visible step, whatever step that is."""
    _FENCES[_key(folder)] = check


def unfence_writes(folder: str) -> None:
    _FENCES.pop(_key(folder), None)


def _key(path: str) -> str:
    return path.rstrip("/") if is_url(path) else os.path.abspath(path)


def check_fences(path: str) -> None:
    """The checks fence_writes registered for a folder above PATH, run now: what every write,
    create and delete runs first."""
    _fenced(path)


def _fenced(path: str) -> None:
    if not _FENCES:
        return
    key = _key(path)
    for folder, check in list(_FENCES.items()):
        if key == folder or key.startswith(folder + "/"):
            check()


def fenced_after(path: str, made: str | None = None) -> None:
    """The fence looked at again once PATH is written: a writer paused between its first look and
    its rename or upload (another thread's stop freezes every thread wherever it is) finds its
    claim gone here, and takes back what it wrote before it says so: the file, and the local
    folders the write made (MADE: the topmost, missing_top), which retention may have removed
    while it was paused (else a run folder without a manifest is left)."""
    try:
        _fenced(path)
    except BaseException:
        take_back(path, made)
        raise


def take_back(path: str, made: str | None = None) -> None:
    """Remove PATH, a file this process wrote and no run lists, after its fence refused it: not
    through the fence (it would refuse this too), and never raising (the refusal is what the
    caller must see); and the local folders the write made (MADE: the topmost, missing_top)."""
    with contextlib.suppress(Exception):
        fs, inner = resolve(path)
        with contextlib.suppress(Exception):
            fs.delete_file(inner)
        _unmake(os.path.dirname(inner), made)   # also when the file was gone already


def missing_top(directory: str) -> str | None:
    """The topmost folder of the local DIRECTORY's chain that does not exist (what a write that
    makes its folders would make), or None; only looked for while a fence is set."""
    if not _FENCES:
        return None
    top = None
    while not os.path.isdir(directory):
        top, parent = directory, os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    return top


def _unmake(directory: str, top: str | None) -> None:
    """Remove the empty folders from DIRECTORY up to TOP (the ones a write made), deepest first."""
    if top is None:
        return
    while True:
        try:
            os.rmdir(directory)
        except OSError:
            return
        if directory == top or os.path.dirname(directory) == directory:
            return
        directory = os.path.dirname(directory)


@contextlib.contextmanager
def open_output(path: str):
    """Write PATH as a whole: yields a binary stream; readers see the old file (or none) until the
    block succeeds, then the new one. Local: a hidden temporary name, then a rename. Object stores:
    the upload completes (and the object appears) when the stream closes without an error. HDFS
    (webhdfs://): the spool written under a hidden name, then renamed over PATH.
    Local files are on the disk (fsync of the file, then of its directory after the rename)
    before this returns: a manifest written after them never lists a file a power loss empties."""
    _fenced(path)
    storage_op("write", path)
    fs, inner = resolve(path)
    if fs.type_name == "local":
        made = missing_top(os.path.dirname(inner))
        with _staged(inner, os.replace) as f:
            yield f
        fenced_after(path, made)
        return
    # Spooled to a local file, then uploaded whole: an upload that fails half-way is made again
    # from the spool (idempotent: the object appears only when an upload completes).
    with tempfile.TemporaryFile(prefix="paragen-upload-", dir=os.environ.get("PARAGEN_SPOOL_DIR")) as spool:
        yield spool
        spool.flush()
        client = webhdfs.client_of(fs)
        if client is not None:              # HDFS shows a file as it is written: a hidden name, then a rename
            _put_renamed(path, client, inner, spool)
            fenced_after(path)
            return
        try:
            retrying(path, _upload, fs, inner, spool)
        except StorageError as exc:
            # A completion retried after the store had completed the upload (its answer lost):
            # MinIO and Ceph forget a completed upload and answer NoSuchUpload. The object is there.
            if not re.search(r"NoSuchUpload|NO_SUCH_UPLOAD", str(exc)) or not _uploaded(path, spool):
                raise
            log.info("%s: the upload's completion was retried after it had succeeded (%s); the object is there",
                     path, exc.detail or "NoSuchUpload")
        fenced_after(path)


_IN_FLIGHT: set = set()      # local hidden temporaries being written or placed now, by any thread


def staged_in_flight(path: str) -> bool:
    """True when the local hidden temporary PATH is one this process is writing now (a clean-up of
    killed writes' leftovers leaves it: its heartbeat's next version, say)."""
    return resolve(path)[1] in _IN_FLIGHT


_STAGING = threading.Lock()     # _IN_FLIGHT and _ENDING change together under it
_ENDING: set = set()            # the thread ending the process (and its helpers): from then on, only they stage


def remove_staged_in_flight() -> None:
    """Remove the hidden temporaries this process is writing: a process that ends itself from
    another thread (a lost claim, a second signal) leaves none of its own behind, whatever its
    writing threads were doing (a killed process's are swept by the next clean-up). From now on
    every other thread that would stage a file waits for the end instead (a thread whose staged
    file was just removed would stage it again, and the exit would leave that one behind); the
    calling thread still writes (error.log, its claim's release)."""
    with _STAGING:
        _ENDING.add(threading.get_ident())
        for tmp in list(_IN_FLIGHT):
            with contextlib.suppress(OSError):
                os.remove(tmp)


def stage_like(parent: int) -> None:
    """This thread, started by thread PARENT to run part of its work (a bounded clean-up step),
    stages files when PARENT may, the process ending or not."""
    with _STAGING:
        if parent in _ENDING:
            _ENDING.add(threading.get_ident())


def _open_staged(tmp: str):
    """TMP opened for writing and counted in flight; in a thread other than the one ending the
    process, once it has begun to end, never: the thread waits for the exit."""
    with _STAGING:
        if not _ENDING or threading.get_ident() in _ENDING:
            f = open(tmp, "wb")
            _IN_FLIGHT.add(tmp)
            return f
    while True:                     # the ending thread calls os._exit (its deadline bounds it)
        time.sleep(3600)


@contextlib.contextmanager
def _staged(inner: str, place, make_dirs: bool = True):
    """A hidden temporary file beside the local path INNER to write in the block; once written, on
    the disk (fsync) and PLACE(tmp, INNER) puts it there (os.replace, or os.link: which fails if
    INNER exists), then the directory is synced too. The temporary file never stays behind.
    MAKE_DIRS False: a missing folder is FileNotFoundError, not made."""
    directory = os.path.dirname(inner)
    if make_dirs:
        os.makedirs(directory, exist_ok=True)
    tmp = staged_name(inner)
    f = _open_staged(tmp)
    try:
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        storage_op("rename", inner)             # a crash point of its own: written and synced, not yet in place
        place(tmp, inner)
        _fsync_dir(directory)
    except OSError as exc:
        if exc.filename is None and exc.errno is not None:      # a write's or flush's: name the file it was for
            raise OSError(exc.errno, exc.strerror or os.strerror(exc.errno), inner) from exc
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        _IN_FLIGHT.discard(tmp)


def _put_renamed(path: str, client, inner: str, spool) -> None:
    """The spool written to HDFS under a hidden name beside INNER, then renamed over INNER (one
    NameNode operation): readers see the old file or the new one, never a part."""
    tmp = staged_name(inner)
    size = os.fstat(spool.fileno()).st_size

    def put():
        spool.seek(0)
        client.put(tmp, spool)

    def rename():
        try:
            client.mv(tmp, inner)
        except FileNotFoundError:           # a retry after a rename whose answer was lost: done
            if client.exists(tmp) or client.info(inner)["size"] != size:
                raise
    try:
        retrying(path, put)
        storage_op("rename", path)
        retrying(path, rename)
    finally:
        with contextlib.suppress(Exception):
            if client.exists(tmp):
                client.rm(tmp)


def _uploaded(path: str, spool) -> bool:
    """True when the object PATH is there with the spool's size (what the lost answer said)."""
    try:
        return stat(path)[0] == os.fstat(spool.fileno()).st_size
    except (OSError, StorageError):
        return False


def _fsync_dir(directory: str) -> None:
    """The directory's entries on the disk (a rename or a new name survives a power loss)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        pass                      # some file systems cannot sync a directory; the file itself is synced
    finally:
        os.close(fd)


def _upload(fs, inner: str, spool) -> None:
    spool.seek(0)
    stream = fs.open_output_stream(inner, compression=None)
    try:
        shutil.copyfileobj(spool, stream, 1 << 20)
    except BaseException:
        # pyarrow's S3/GCS streams upload on close(); abort() drops the upload instead
        with contextlib.suppress(Exception):
            stream.abort() if hasattr(stream, "abort") else None
        raise
    stream.close()


def write_bytes(path: str, data: bytes) -> str:
    with open_output(path) as f:
        f.write(data)
    return path


def write_json(path: str, obj, indent: int | None = 2, **dump_kw) -> str:
    return write_bytes(path, json.dumps(obj, indent=indent, **dump_kw).encode("utf-8"))


def delete(path: str) -> None:
    """Remove the file PATH (no error if it is already gone)."""
    _fenced(path)
    storage_op("delete", path)
    fs, inner = resolve(path)
    with contextlib.suppress(FileNotFoundError):
        retrying(path, fs.delete_file, inner)


def delete_tree(path: str) -> None:
    """Remove the directory or prefix PATH and everything under it (no error if absent)."""
    _fenced(path)
    storage_op("delete_tree", path)
    fs, inner = resolve(path)
    info = _info(path)
    if info.type == pafs.FileType.File:
        delete(path)
    elif info.type == pafs.FileType.Directory:
        try:
            retrying(path, fs.delete_dir, inner)
        except FileNotFoundError:
            pass        # GCS: the objects went, then the never-created "dir/" marker was not found


def makedirs(path: str) -> None:
    """Create the directory PATH (on object stores there is nothing to create)."""
    if is_local(path):
        os.makedirs(resolve(path)[1], exist_ok=True)


def copy_file(src: str, dst: str) -> str:
    """Copy SRC to DST (either may be a URL), DST written as a whole."""
    with open_input(src) as fin, open_output(dst) as fout:
        for block in iter(lambda: fin.read(1 << 20), b""):
            fout.write(block)
    return dst


def upload_dir(local: str, remote: str, last: str | None = None) -> None:
    """Copy every file under LOCAL to REMOTE (a URL), the file named LAST at the end (readers
    take it as the mark of a whole directory)."""
    files = sorted(os.path.relpath(os.path.join(d, n), local) for d, _, ns in os.walk(local) for n in ns)
    for rel in sorted(files, key=lambda r: r == last):
        copy_file(os.path.join(local, rel), join(remote, rel.replace(os.sep, "/")))
