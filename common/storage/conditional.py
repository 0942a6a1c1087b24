"""Put-if-absent: a file created only if no file has its name, in one step the store itself
decides, on every store. It is the one primitive publishing needs: every record that changes
(a claim, a run's manifest, ``latest``) is a sequence of numbered versions, each created once with
it (common/storage/versions.py, the way Delta Lake's ``_delta_log`` works), so no lock file, no
staleness rule and no replace-if-unchanged is needed anywhere. Each store's guarantee:

=========  ==================================================================================
store      create only if absent
=========  ==================================================================================
local      a fully written hidden file linked to the name: ``link(2)`` fails if the name exists
           (an EEXIST confirmed by stat: on NFS a retried link whose first reply was lost
           answers EEXIST for the writer's own file)
S3         ``PutObject`` with ``If-None-Match: *`` (a store answering 501 is refused, one line)
GCS        ``ifGenerationMatch=0`` (google-cloud-storage: pyarrow exposes no preconditions)
HDFS       a hidden file renamed to the name: HDFS's rename fails if the name exists
=========  ==================================================================================

A create retried after the store had applied it (its answer lost) is refused the second time
(412); the file is then read back, and equal bytes mean this writer's (every record carries a
unique token or run id). A store that accepts the condition and ignores it would let two writers
both win: :func:`store_now` (called by every claim and by retention) creates one name twice and
refuses, in one line, a store whose second create succeeds. It also answers what time it is by the
store's own clock (the new file's modification time), so that a record's age is the store's time
less the store's time, never two machines' clocks compared.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import uuid

from common.atomic import staged_name
from common.crash_points import storage_op
from common.storage import webhdfs
from common.storage.paths import _gcs_emulator, _s3_endpoint, is_url, join
from common.storage.retries import StorageError, retrying, timeout_seconds
from common.storage.stores import _cached, resolve
from common.storage.writing import _staged

log = logging.getLogger("paragen.storage")
UNFENCED_ENV = "PARAGEN_UNFENCED_STORES"


class Conflict(FileExistsError):
    """The name is taken (another writer created it first), or what a writer built on is gone.
    Never transient: asking again cannot help (retries.is_transient)."""


def _scheme(path: str) -> str:
    return path.split("://", 1)[0].lower() if is_url(path) and not path.lower().startswith("file://") else "local"


def read_stamped(path: str) -> tuple[bytes | None, float | None]:
    """(the bytes of PATH, its modification time by the store's clock), or (None, None) when there
    is no such file."""
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


def create_new(path: str, data: bytes, make_dirs: bool = True) -> None:
    """Write DATA as PATH only if no file has that name: Conflict when one has. MAKE_DIRS False: a
    local folder that is gone stays gone (Conflict), so a writer resumed after retention removed
    its folder never makes it again. The fences over PATH (fence_writes: a claim, a refresh's lease)
    look first, as before every other write: a holder that lost its claim creates nothing, no new
    version and no folder."""
    from common.storage.writing import fenced_after, missing_top, check_fences

    check_fences(path)
    storage_op("write", path)
    scheme = _scheme(path)
    if scheme == "local":
        inner = resolve(path)[1]
        made = missing_top(os.path.dirname(inner)) if make_dirs else None
        _local_create(inner, data, make_dirs)
        if made is not None:            # folders made after a pause past the fence's look: looked at again
            fenced_after(path, made)
        return None
    if scheme == "s3":
        return _applied_or_conflict(path, data, lambda: retrying(path, _s3_create, *_s3_key(path), data))
    if scheme in ("gs", "gcs"):
        return _applied_or_conflict(path, data, lambda: retrying(path, _gcs_create, *_gcs_blob(path), data))
    return _hdfs_create(path, data)


def _applied_or_conflict(path: str, data: bytes, put) -> None:
    """PUT(); a Conflict after a retry may be this writer's own earlier attempt, which the store
    applied before its answer was lost: equal bytes there say so."""
    try:
        put()
    except Conflict:
        if read_stamped(path)[0] != data:
            raise


_HONOURED: set = set()          # stores (scheme and bucket) seen to refuse a second create
PROBE_NAME = re.compile(r"^\.probe\.[0-9a-f]{32}\.tmp$")     # store_now's probe files
PROBE_TRIES = 3
_PROBING: set = set()           # this process's probe files now, by any thread


def probe_in_flight(path: str) -> bool:
    """True when PATH is a probe file this process is using now (a clean-up leaves it)."""
    return resolve(path)[1] in _PROBING


def store_now(directory: str) -> float:
    """The store's own time now, read from a probe file created (and removed) in DIRECTORY; and,
    once per store, proof that it honours put-if-absent: the probe created a second time must be
    refused. StorageError, in one line, for a store that accepts the condition and ignores it.

    A probe a killed process left is removed by the next clean-up of DIRECTORY (a run's or a
    refresh's: paracorpus/commit.remove_staged), which cannot tell it from another live
    process's; a probe removed under its prober (its second create then succeeds, or its read
    finds nothing) is made again under a new name: a store that ignores the condition does so
    every time, a clean-up's race does not repeat."""
    for _ in range(PROBE_TRIES):
        probe = join(directory, f".probe.{uuid.uuid4().hex}.tmp")
        inner = resolve(probe)[1]
        _PROBING.add(inner)
        try:
            stamped, ignored = _probe(directory, probe)
        finally:
            with contextlib.suppress(Exception):
                from common.storage.writing import delete
                delete(probe)
            _PROBING.discard(inner)
        if stamped is not None and not ignored:
            return stamped
        log.info("%s: probe %s %s; probing again", directory, probe,
                 "created twice" if ignored else "gone at once")
    if ignored:
        raise StorageError(f"{directory}: the store accepted a second create of {probe} (it ignores "
                           "If-None-Match / put-if-absent), so two writers could both publish there; use "
                           "a store that honours it (AWS S3, MinIO, GCS, HDFS, a local or NFS disk)")
    raise StorageError(f"{directory}: the store lost its probe file {probe} at once, {PROBE_TRIES} times")


def _probe(directory: str, probe: str) -> tuple[float | None, bool]:
    """(PROBE's time by the store's clock, or None when it is gone; whether its second create was
    accepted), the second create tried once per store."""
    create_new(probe, b"1")
    key = _store_key(directory)
    if key not in _HONOURED:
        try:
            create_new(probe, b"2")
        except Conflict:
            _HONOURED.add(key)
        else:
            return None, True
    return read_stamped(probe)[1], False


def _store_key(directory: str) -> str:
    if not is_url(directory):
        return "local"
    scheme, rest = directory.split("://", 1)
    return f"{scheme}://{rest.split('/', 1)[0]}"


# ---- a local disk -------------------------------------------------------------------------------

def _local_read(inner: str) -> tuple[bytes | None, float | None]:
    try:
        with open(inner, "rb") as f:
            return f.read(), os.fstat(f.fileno()).st_mtime
    except (FileNotFoundError, NotADirectoryError):
        return None, None


def _local_create(inner: str, data: bytes, make_dirs: bool) -> None:
    def link(tmp, dst):
        try:
            os.link(tmp, dst)
        except FileExistsError:
            # NFS: a link retried after its reply was lost answers EEXIST for this writer's own file
            with contextlib.suppress(OSError):
                if os.path.samestat(os.stat(tmp), os.stat(dst)):
                    return
            raise Conflict(f"{dst}: exists (another writer created it)") from None
    for _ in range(3):
        try:
            with _staged(inner, link, make_dirs=make_dirs) as f:
                f.write(data)
            return
        except FileNotFoundError:
            if os.path.isdir(os.path.dirname(inner)):
                continue        # the folder is there: another process's clean-up took the staged file; stage again
            if make_dirs:
                raise
            raise Conflict(f"{inner}: its folder was removed (retention, or another run took it over)") from None
    raise Conflict(f"{inner}: its staged file was removed three times while it was written")


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


def _s3_error(path: str, exc, creating: bool = False) -> OSError:
    """What a botocore error means here: Conflict (412; 404 for a conditional replace), a refusal
    of conditional writes (501), or an OSError that retrying() sorts into transient or not."""
    from botocore.exceptions import ClientError

    if not isinstance(exc, ClientError):
        return OSError(f"S3: {exc}")
    err, meta = exc.response.get("Error", {}), exc.response.get("ResponseMetadata", {})
    status, code = meta.get("HTTPStatusCode"), err.get("Code")
    if status == 412 or code == "PreconditionFailed":
        return Conflict(f"{path}: exists (another writer created it)" if creating else f"{path}: HTTP 412")
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
            return None, None
        raise err from None
    return data, got["LastModified"].timestamp()


def _s3_create(path, client, bucket, key, data: bytes) -> None:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
    except (ClientError, BotoCoreError) as exc:
        err = _s3_error(path, exc, creating=True)
        if not isinstance(err, _Unsupported) or not _unfenced_allowed(path):
            raise err from None
        if _s3_read(path, client, bucket, key)[0] is not None:     # checked, then written: not one step
            raise Conflict(f"{path}: exists (another writer created it)") from None
        client.put_object(Bucket=bucket, Key=key, Body=data)


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


def _gcs_call(path: str, fn):
    """FN() with google-cloud-storage's errors turned into this layer's: Conflict (412), an
    OSError retrying() may retry (429, 5xx, a dropped connection), or a refusal."""
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as aexc

    try:
        return fn()
    except gexc.PreconditionFailed:
        raise Conflict(f"{path}: exists (another writer created it)") from None
    except gexc.NotFound:
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


def _gcs_read(path, bucket, name):
    t = timeout_seconds() / 3
    try:
        blob = _gcs_call(path, lambda: bucket.get_blob(name, timeout=t, retry=None))
        if blob is None:
            return None, None
        # the bytes of exactly that generation (a replace in between answers 404/412)
        data = _gcs_call(path, lambda: blob.download_as_bytes(if_generation_match=blob.generation,
                                                                    timeout=t, retry=None))
    except (FileNotFoundError, Conflict):
        raise OSError(f"GCS: {path} changed while it was read: retry") from None
    return data, blob.updated.timestamp() if blob.updated else None


def _gcs_create(path, bucket, name, data: bytes) -> None:
    _gcs_call(path, lambda: bucket.blob(name).upload_from_string(data, if_generation_match=0,
                                                                 timeout=timeout_seconds() / 3, retry=None))


# ---- HDFS (renames): webhdfs:// tested on a MiniDFSCluster, hdfs:// (libhdfs) through a local stand-in --

def _hdfs_read(path: str) -> tuple[bytes | None, float | None]:
    import pyarrow.fs as pafs

    fs, inner = resolve(path)
    info = fs.get_file_info(inner)
    if info.type == pafs.FileType.NotFound:
        return None, None
    try:
        with fs.open_input_stream(inner) as f:
            data = f.read()
    except FileNotFoundError:
        return None, None
    return data, info.mtime.timestamp() if info.mtime else None


def _hdfs_create(path: str, data: bytes) -> None:
    """A hidden file written whole, then renamed to the name: HDFS's rename fails when the name
    exists, so one creator wins (HDFS shows a file while it is written: never under its name)."""
    fs, inner = resolve(path)
    tmp = staged_name(inner)
    client = webhdfs.client_of(fs)
    try:
        if client is not None:
            client.put(tmp, data)
        else:
            with fs.open_output_stream(tmp) as f:
                f.write(data)
        storage_op("rename", path)
        try:
            if client is not None:
                client.rename_new(tmp, inner)          # pyarrow's move replaces over WebHDFS: not this
            else:
                fs.move(tmp, inner)
        except FileExistsError:
            raise Conflict(f"{path}: exists (another writer created it)") from None
        except FileNotFoundError:
            raise Conflict(f"{path}: its folder was removed") from None
        except OSError:
            if client is not None or fs.get_file_info(inner).type.name == "NotFound":
                raise                                # WebHDFS says which; a name still free is no conflict
            raise Conflict(f"{path}: exists (another writer created it)") from None
    finally:
        with contextlib.suppress(OSError):
            fs.delete_file(tmp)


__all__ = ["Conflict", "UNFENCED_ENV", "create_new", "read_stamped", "store_now"]
