"""Conditional writes: a file created only if absent, replaced or removed only if it is still the
version the caller read. They make publishing one atomic step (a manifest replaced only if it is
the one a run planned on: compare and swap, as Delta Lake and Iceberg commit) and fence a claim
whose holder was paused past its lease: the store itself refuses the stale writer, whatever the
writer believes. Each store's guarantee, in one place:

=========  ==========================================  ===========================================  ==========
store      create only if absent                       replace / remove only if unchanged           version
=========  ==========================================  ===========================================  ==========
local      a fully written hidden file linked to the   under the directory's lock file (created     sha256 of
           name (``link`` fails if the name exists)    only if absent; taken from a holder paused   the bytes
                                                       10 s): the current file's sha256 compared,
                                                       the lock looked at again, then a rename
S3         ``PutObject`` with ``If-None-Match: *``     ``PutObject`` / ``DeleteObject`` with        ETag
                                                       ``If-Match: <ETag>``
GCS        ``ifGenerationMatch=0`` (google-cloud-      ``ifGenerationMatch=<generation>``           generation
           storage: pyarrow exposes no preconditions)
HDFS       a temporary file renamed to the name        the current file renamed aside (one renamer  sha256 of
           (HDFS's rename fails if the name exists)    wins), compared, the new one renamed in      the bytes
=========  ==========================================  ===========================================  ==========

A conditional write retried after the store had applied it (its answer lost) is refused the
second time (412); the file is then read back, and equal bytes mean this writer's write
(manifests and claim records carry a unique run id or token, so equal bytes are never another
writer's). An S3-compatible store that answers 501 to a conditional header is refused in one line:
publishing there cannot be fenced (``PARAGEN_UNFENCED_STORES=1`` accepts that, with a warning).
HDFS's replace is not one operation: a stop between its two renames leaves the file absent and
the previous version beside it under a hidden name, which the next :func:`read_versioned`
puts back.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import uuid
from dataclasses import dataclass, field

from common import processes
from common.atomic import staged_name
from common.crash_points import storage_op
from common.storage import webhdfs
from common.storage.paths import _gcs_emulator, _s3_endpoint, basename, is_url
from common.storage.retries import StorageError, retrying, timeout_seconds
from common.storage.stores import _cached, resolve
from common.storage.writing import _fsync_dir, _staged

log = logging.getLogger("paragen.storage")
UNFENCED_ENV = "PARAGEN_UNFENCED_STORES"


class Conflict(FileExistsError):
    """The file is not the version the writer expected: another writer created, replaced or
    removed it first. Never transient: asking again cannot help (retries.is_transient)."""


@dataclass(frozen=True)
class Version:
    """Which version of a file a caller read: TAG (sha256, ETag or generation; None: the file was
    absent) and MTIME, the store's own modification time in seconds (None when absent): a lease's
    age by the store's clock, not its holder's."""
    tag: str | None
    mtime: float | None = field(default=None, compare=False)

    @property
    def absent(self) -> bool:
        return self.tag is None


ABSENT = Version(None)


def _scheme(path: str) -> str:
    return path.split("://", 1)[0].lower() if is_url(path) and not path.lower().startswith("file://") else "local"


def read_versioned(path: str) -> tuple[bytes | None, Version]:
    """(the bytes of PATH, their version), or (None, ABSENT) when there is no such file."""
    scheme = _scheme(path)
    if scheme == "local":
        return _local_read(resolve(path)[1])
    if scheme == "s3":
        return retrying(path, _s3_read, *_s3_key(path))
    if scheme in ("gs", "gcs"):
        return retrying(path, _gcs_read, *_gcs_blob(path))
    if scheme == "webhdfs":
        return retrying(path, _hdfs_read, path)
    return _hdfs_read(path)


def create_new(path: str, data: bytes) -> Version:
    """Write DATA as PATH only if nothing is there: its version, or Conflict when PATH exists."""
    return write_if(path, data, ABSENT)


def write_if(path: str, data: bytes, expected: Version) -> Version:
    """Write DATA as PATH only if PATH is still at version EXPECTED (ABSENT: only if there is no
    such file), in one step no other writer can split; the new version. Conflict otherwise."""
    storage_op("write", path)
    scheme = _scheme(path)
    if scheme == "local":
        return _local_write(resolve(path)[1], data, expected)
    if scheme == "s3":
        return _applied_or_conflict(path, data, lambda: retrying(path, _s3_put, *_s3_key(path), data, expected))
    if scheme in ("gs", "gcs"):
        return _applied_or_conflict(path, data, lambda: retrying(path, _gcs_put, *_gcs_blob(path), data, expected))
    return _hdfs_write(path, data, expected)


def delete_if(path: str, expected: Version) -> bool:
    """Remove PATH only if it is still at version EXPECTED: True when removed, False when it was
    another version or gone."""
    storage_op("delete", path)
    scheme = _scheme(path)
    try:
        if scheme == "local":
            _local_delete(resolve(path)[1], expected)
        elif scheme == "s3":
            retrying(path, _s3_delete, *_s3_key(path), expected)
        elif scheme in ("gs", "gcs"):
            retrying(path, _gcs_delete, *_gcs_blob(path), expected)
        else:
            _hdfs_delete(path, expected)
    except (Conflict, FileNotFoundError):
        return False
    return True


def _applied_or_conflict(path: str, data: bytes, put) -> Version:
    """PUT(); a Conflict after a retry may be this writer's own earlier attempt, which the store
    applied before its answer was lost: equal bytes there say so."""
    try:
        return put()
    except Conflict:
        current, version = read_versioned(path)
        if current == data:
            return version
        raise


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---- a local disk -------------------------------------------------------------------------------

LOCK_NAME = ".paragen-cas.lock"
LOCK_STALE_SECONDS = 10.0     # a lock older than this: its holder is paused (SIGSTOP, a VM pause) or dead
_HELD: set = set()            # the locks this process holds (released by release_held_locks at a stop)


class _DirectoryLock:
    """The conditional writers of a directory take turns through a lock file created only if
    absent (O_EXCL). Unlike an flock, it can be taken from a holder paused inside its few
    milliseconds of compare and rename (a suspended job would otherwise block every writer, the
    claim's takeover included): a lock older than LOCK_STALE_SECONDS is renamed aside (one taker
    wins) and taken. The holder looks again that the lock is still its own just before its rename
    or unlink (:meth:`check`), so a holder resumed after its lock was taken writes nothing. A lock
    of a process of this machine that is gone (killed) is taken at once; a stop releases the locks
    its process holds (:func:`release_held_locks`)."""

    def __init__(self, directory: str):
        self.path = os.path.join(directory, LOCK_NAME)
        self.token = json.dumps({**processes.identity(), "token": uuid.uuid4().hex}).encode()

    def __enter__(self):
        import time

        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        while True:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                self._take_if_stale(time.time())
                time.sleep(0.005)
                continue
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(self.token)
            except OSError as exc:           # a full disk: no half-written lock left, and the file named
                with contextlib.suppress(FileNotFoundError):
                    os.remove(self.path)
                raise OSError(exc.errno, exc.strerror, self.path) from exc
            _HELD.add(self)
            return self

    def _take_if_stale(self, now: float) -> None:
        try:
            age = now - os.stat(self.path).st_mtime
            with open(self.path, "rb") as f:
                holder = f.read()
        except FileNotFoundError:
            return
        if age > LOCK_STALE_SECONDS or (age > 0.5 and processes.ended(_holder(holder))):
            aside = f"{self.path}.stale.{uuid.uuid4().hex}"
            with contextlib.suppress(FileNotFoundError):        # another taker was first
                os.rename(self.path, aside)
                os.remove(aside)
                log.warning("%s: took a lock held for %.0f s (its holder paused or killed)", self.path, age)

    def check(self) -> None:
        """Conflict unless the lock is still this holder's (it was taken while this one was paused)."""
        try:
            with open(self.path, "rb") as f:
                mine = f.read() == self.token
        except FileNotFoundError:
            mine = False
        if not mine:
            raise Conflict(f"{os.path.dirname(self.path)}: this writer was paused past "
                           f"{LOCK_STALE_SECONDS:g} s inside its conditional write and another took its turn")

    def __exit__(self, *exc):
        _HELD.discard(self)
        with contextlib.suppress(FileNotFoundError, Conflict):
            self.check()
            os.remove(self.path)


def _holder(record: bytes) -> dict:
    """The identity a lock file names ({} for one this code did not write whole)."""
    try:
        holder = json.loads(record)
    except (ValueError, UnicodeDecodeError):
        return {}
    return holder if isinstance(holder, dict) else {}


def release_held_locks() -> None:
    """Remove the directory locks this process holds: it is ending (a stop's os._exit), and the
    write in progress either happened or did not."""
    for lock in list(_HELD):
        lock.__exit__(None, None, None)


def _local_read(inner: str) -> tuple[bytes | None, Version]:
    try:
        with open(inner, "rb") as f:
            data = f.read()
            mtime = os.fstat(f.fileno()).st_mtime
    except FileNotFoundError:
        return None, ABSENT
    return data, Version(_digest(data), mtime)


def _local_current(inner: str, expected: Version) -> None:
    """Conflict unless the file INNER is at version EXPECTED (called under the directory's lock)."""
    _data, current = _local_read(inner)
    if current.tag != expected.tag:
        raise Conflict(f"{inner}: {_changed(expected, current)}")


def _local_write(inner: str, data: bytes, expected: Version) -> Version:
    directory = os.path.dirname(inner)
    with _DirectoryLock(directory) as lock:
        def place(tmp, dst, how=os.link if expected.absent else os.replace):
            lock.check()                  # still this writer's turn, after any pause
            how(tmp, dst)
        if expected.absent:
            try:
                with _staged(inner, place) as f:
                    f.write(data)
            except FileExistsError:
                raise Conflict(f"{inner}: exists (another writer created it)") from None
        else:
            _local_current(inner, expected)
            with _staged(inner, place) as f:
                f.write(data)
        return Version(_digest(data), os.stat(inner).st_mtime)


def _local_delete(inner: str, expected: Version) -> None:
    directory = os.path.dirname(inner)
    if not os.path.isdir(directory):
        raise FileNotFoundError(inner)
    with _DirectoryLock(directory) as lock:
        _local_current(inner, expected)
        lock.check()
        os.remove(inner)
        _fsync_dir(directory)


def _changed(expected: Version, current: Version) -> str:
    if current.absent:
        return "removed by another writer"
    if expected.absent:
        return "exists (another writer created it)"
    return "replaced by another writer"


# ---- S3 -----------------------------------------------------------------------------------------

def _s3_key(path: str):
    bucket, _, key = resolve(path)[1].partition("/")
    return path, _cached("boto3-s3", _boto3_s3), bucket, key


def _boto3_s3():
    import boto3
    from botocore.config import Config

    t = timeout_seconds()
    return boto3.client("s3", endpoint_url=_s3_endpoint(), region_name=os.environ.get("AWS_REGION")
                        or os.environ.get("AWS_DEFAULT_REGION") or None,
                        config=Config(connect_timeout=t / 3, read_timeout=t / 3, retries={"max_attempts": 1}))


def _s3_error(path: str, exc, expected: Version | None = None) -> OSError:
    """What a botocore error means here: Conflict (412; 404 for a conditional replace), a refusal
    of conditional writes (501), or an OSError that retrying() sorts into transient or not."""
    from botocore.exceptions import ClientError

    if not isinstance(exc, ClientError):
        return OSError(f"S3: {exc}")
    err, meta = exc.response.get("Error", {}), exc.response.get("ResponseMetadata", {})
    status, code = meta.get("HTTPStatusCode"), err.get("Code")
    if status == 412 or code == "PreconditionFailed":
        return Conflict(f"{path}: " + ("exists (another writer created it)" if expected is not None and expected.absent
                                       else "not the version this writer read (HTTP 412)"))
    if status == 404 and expected is not None and not expected.absent:
        return Conflict(f"{path}: removed by another writer")
    if status == 404:
        return FileNotFoundError(f"{path}: no such object")
    if status == 501 or code == "NotImplemented":
        return _Unsupported(path)
    if status == 409:                      # another conditional write in flight: ask again
        return OSError(f"S3 {code} (HTTP 409, a conditional write in flight): retry")
    return OSError(f"S3 {code}: {err.get('Message')} (HTTP status {status})")


class _Unsupported(StorageError):
    def __init__(self, path: str):
        super().__init__(f"{path}: the store at {_s3_endpoint() or 'S3'} does not support conditional writes "
                         "(If-None-Match / If-Match answered HTTP 501), so a run's publishing cannot be fenced there; "
                         f"use a store that does (AWS S3, MinIO, GCS), or set {UNFENCED_ENV}=1 to accept unfenced "
                         "writes (one writer at a time is then up to you)")


def _unfenced_allowed(path: str) -> bool:
    if os.environ.get(UNFENCED_ENV, "") not in ("1", "true", "yes"):
        return False
    log.warning("%s: conditional writes are not supported by this store; writing unfenced (%s=1)", path,
                UNFENCED_ENV)
    return True


def _s3_read(path, client, bucket, key):
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        got = client.get_object(Bucket=bucket, Key=key)
        data = got["Body"].read()
    except (ClientError, BotoCoreError) as exc:
        err = _s3_error(path, exc)
        if isinstance(err, FileNotFoundError):
            return None, ABSENT
        raise err from None
    return data, Version(got["ETag"], got["LastModified"].timestamp())


def _s3_put(path, client, bucket, key, data: bytes, expected: Version) -> Version:
    from botocore.exceptions import BotoCoreError, ClientError

    condition = {"IfNoneMatch": "*"} if expected.absent else {"IfMatch": expected.tag}
    try:
        put = client.put_object(Bucket=bucket, Key=key, Body=data, **condition)
    except (ClientError, BotoCoreError) as exc:
        err = _s3_error(path, exc, expected)
        if not isinstance(err, _Unsupported) or not _unfenced_allowed(path):
            raise err from None
        _data, current = _s3_read(path, client, bucket, key)      # checked, then written: not one step
        if current.tag != expected.tag:
            raise Conflict(f"{path}: {_changed(expected, current)}") from None
        put = client.put_object(Bucket=bucket, Key=key, Body=data)
    return Version(put["ETag"])          # the answer's own: a read after it could see another writer's


def _s3_delete(path, client, bucket, key, expected: Version) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        client.delete_object(Bucket=bucket, Key=key, IfMatch=expected.tag)
    except (ClientError, BotoCoreError) as exc:
        err = _s3_error(path, exc, expected)
        if not isinstance(err, _Unsupported) or not _unfenced_allowed(path):      # refused like the put
            raise err from None
        # a store without conditional deletes, accepted unfenced: compared, then removed (not one step)
        _data, current = _s3_read(path, client, bucket, key)
        if current.tag != expected.tag:
            raise Conflict(f"{path}: {_changed(expected, current)}") from None
        client.delete_object(Bucket=bucket, Key=key)


# ---- GCS ----------------------------------------------------------------------------------------

def _gcs_client():
    from google.cloud import storage as gcs

    project = os.environ.get("GOOGLE_CLOUD_PROJECT")
    emulator = _gcs_emulator()
    if emulator:           # the client reads STORAGE_EMULATOR_HOST itself; no credentials there
        from google.auth.credentials import AnonymousCredentials

        return gcs.Client(project=project or "emulator", credentials=AnonymousCredentials())
    return gcs.Client(project=project)


def _gcs_blob(path: str):
    from google.auth import exceptions as aexc

    bucket, _, name = resolve(path)[1].partition("/")
    try:
        client = _cached("gcs-client", _gcs_client)
    except aexc.GoogleAuthError as exc:
        raise StorageError(f"{path}: no credentials for GCS ({str(exc).splitlines()[0][:160]})") from None
    return path, client.bucket(bucket), name


def _gcs_call(path: str, expected: Version | None, fn):
    """FN() with google-cloud-storage's errors turned into this layer's: Conflict (412), an
    OSError retrying() may retry (429, 5xx, a dropped connection), or a refusal."""
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as aexc

    try:
        return fn()
    except gexc.PreconditionFailed:
        raise Conflict(f"{path}: not the version this writer read (another writer got there first)") from None
    except gexc.NotFound:
        if expected is not None and not expected.absent:
            raise Conflict(f"{path}: removed by another writer") from None
        raise FileNotFoundError(f"{path}: no such object") from None
    except (gexc.TooManyRequests, gexc.ServerError) as exc:
        raise OSError(f"GCS: {str(exc).splitlines()[0]}") from None
    except gexc.GoogleAPICallError as exc:
        raise StorageError(f"{path}: the store refused ({str(exc).splitlines()[0][:160]})") from None
    except aexc.GoogleAuthError as exc:
        raise StorageError(f"{path}: no credentials for GCS ({str(exc).splitlines()[0][:160]})") from None
    except (ConnectionError, TimeoutError) as exc:
        raise OSError(f"GCS: could not connect ({exc})") from None
    except Exception as exc:  # noqa: BLE001: requests' own errors (not OSError) are connection failures
        if type(exc).__module__.startswith(("requests", "urllib3")):
            raise OSError(f"GCS: could not connect ({str(exc).splitlines()[0][:160]})") from None
        raise


def _gcs_version(blob) -> Version:
    return Version(str(blob.generation), blob.updated.timestamp() if blob.updated else None)


def _gcs_read(path, bucket, name):
    t = timeout_seconds() / 3
    try:
        blob = _gcs_call(path, None, lambda: bucket.get_blob(name, timeout=t, retry=None))
        if blob is None:
            return None, ABSENT
        # the bytes of exactly that generation (a replace in between answers 404/412)
        data = _gcs_call(path, None, lambda: blob.download_as_bytes(if_generation_match=blob.generation,
                                                                    timeout=t, retry=None))
    except (FileNotFoundError, Conflict):
        raise OSError(f"GCS: {path} changed while it was read: retry") from None
    return data, _gcs_version(blob)


def _gcs_put(path, bucket, name, data: bytes, expected: Version) -> Version:
    blob = bucket.blob(name)
    generation = 0 if expected.absent else int(expected.tag)
    _gcs_call(path, expected, lambda: blob.upload_from_string(data, if_generation_match=generation,
                                                              timeout=timeout_seconds() / 3, retry=None))
    return _gcs_version(blob)


def _gcs_delete(path, bucket, name, expected: Version) -> None:
    # compared first as well: GCS checks ifGenerationMatch on a delete, fake-gcs-server does not
    t = timeout_seconds() / 3
    blob = _gcs_call(path, None, lambda: bucket.get_blob(name, timeout=t, retry=None))
    if blob is None or str(blob.generation) != expected.tag:
        raise Conflict(f"{path}: {'removed' if blob is None else 'replaced'} by another writer")
    _gcs_call(path, expected, lambda: blob.delete(if_generation_match=int(expected.tag), timeout=t, retry=None))


# ---- HDFS (rename-based): webhdfs:// tested on a MiniDFSCluster, hdfs:// (libhdfs) through a local stand-in --

def _aside_names(fs, inner: str) -> list[str]:
    """The hidden names a replace stopped between its two renames left beside INNER."""
    import pyarrow.fs as pafs

    directory, name = inner.rsplit("/", 1)
    infos = fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
    return sorted(i.path for i in infos if i.base_name.startswith(f".{name}.") and i.base_name.endswith(".replaced"))


def _hdfs_read(path: str, fs_inner=None) -> tuple[bytes | None, Version]:
    import pyarrow.fs as pafs

    fs, inner = fs_inner or resolve(path)
    info = fs.get_file_info(inner)
    if info.type == pafs.FileType.NotFound:
        aside = _aside_names(fs, inner)
        if not aside:
            return None, ABSENT
        with contextlib.suppress(OSError):            # a replace stopped half-way: the previous version back
            _rename_new(fs, aside[-1], inner)
        info = fs.get_file_info(inner)
        if info.type == pafs.FileType.NotFound:
            return None, ABSENT
    with fs.open_input_stream(inner) as f:
        data = f.read()
    return data, Version(_digest(data), info.mtime.timestamp() if info.mtime else None)


def _hdfs_write(path: str, data: bytes, expected: Version, fs_inner=None) -> Version:
    fs, inner = fs_inner or resolve(path)
    tmp = staged_name(inner)
    client = webhdfs.client_of(fs)
    if client is not None:
        client.put(tmp, data)
    else:
        with fs.open_output_stream(tmp) as f:
            f.write(data)
    try:
        if expected.absent:
            _hdfs_rename(fs, tmp, inner, f"{path}: exists (another writer created it)")
        else:
            aside = _hdfs_take(fs, inner, path, expected, "replaced")
            _hdfs_rename(fs, tmp, inner, f"{path}: created by another writer during the replace")
            fs.delete_file(aside)
    finally:
        with contextlib.suppress(OSError):
            fs.delete_file(tmp)
    return Version(_digest(data))


def _hdfs_delete(path: str, expected: Version, fs_inner=None) -> None:
    fs, inner = fs_inner or resolve(path)
    fs.delete_file(_hdfs_take(fs, inner, path, expected, "deleted"))


def _hdfs_take(fs, inner: str, path: str, expected: Version, why: str) -> str:
    """Rename INNER aside (one renamer wins) and compare it with EXPECTED: the hidden name it is
    under now; put back and Conflict when it is another version."""
    directory = inner.rsplit("/", 1)[0]
    aside = f"{directory}/.{basename(inner)}.{uuid.uuid4().hex}.{why}"
    _hdfs_rename(fs, inner, aside, f"{path}: removed or being replaced by another writer")
    with fs.open_input_stream(aside) as f:
        current = _digest(f.read())
    if current != expected.tag:
        with contextlib.suppress(OSError):
            _rename_new(fs, aside, inner)
        raise Conflict(f"{path}: replaced by another writer")
    return aside


def _rename_new(fs, src: str, dst: str) -> None:
    """HDFS's rename, which fails when DST exists (or SRC does not): one renamer wins. (pyarrow's
    move replaces DST over WebHDFS, as pyarrow promises: the client's own rename_new does not.)"""
    client = webhdfs.client_of(fs)
    if client is not None:
        client.rename_new(src, dst)
    else:
        fs.move(src, dst)


def _hdfs_rename(fs, src: str, dst: str, conflict: str) -> None:
    try:
        _rename_new(fs, src, dst)
    except (FileExistsError, FileNotFoundError):
        raise Conflict(conflict) from None
    except OSError:
        if webhdfs.client_of(fs) is not None:       # WebHDFS says which: a store that did not answer is no conflict
            raise
        raise Conflict(conflict) from None          # libhdfs's rename says only that it failed


def guarantee(path: str) -> str:
    """What PATH's store guarantees for a conditional write, in words (docs, the check phase)."""
    return {"local": "a link or a locked rename: fenced",
            "s3": "If-None-Match / If-Match: fenced (a store answering 501 is refused)",
            "gs": "generation preconditions: fenced", "gcs": "generation preconditions: fenced",
            }.get(_scheme(path), "renames: fenced, but a replace is two renames (a stop between them is "
                                 "repaired by the next read)")


__all__ = ["ABSENT", "Conflict", "Version", "create_new", "delete_if", "guarantee", "read_versioned", "write_if",
           "UNFENCED_ENV"]
