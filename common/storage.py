"""One storage layer for every path the jobs read or write: a local path or a URL.

Built on ``pyarrow.fs``: pyarrow is already a dependency of Beam and of this project (Parquet),
its wheels carry native S3 and GCS clients, and ``pyarrow.parquet`` / ``pyarrow.dataset`` read
and write through the same filesystem objects, so one layer serves files, Parquet and listings
with nothing else to install on workers. (Beam's ``FileSystems`` needs the ``gcp``/``aws`` extras
and has no Parquet integration; fsspec needs s3fs/gcsfs on top.)

Paths: ``/local/path`` or ``relative/path``, ``file:///path``, ``s3://bucket/key``,
``gs://bucket/key`` (or ``gcs://``), and whatever else ``pyarrow.fs.FileSystem.from_uri``
knows (``hdfs://``). Object stores are configured the usual way: S3 by ``AWS_*`` variables
(``AWS_ENDPOINT_URL`` for an S3-compatible server), GCS by application-default credentials, or
``STORAGE_EMULATOR_HOST`` for an emulator.

Writes: :func:`open_output` gives readers the whole file or nothing: on a local disk it writes a
temporary name and renames; an object store makes an object visible only when its upload
completes. There is no rename on object stores, so the jobs commit runs with manifests written
last (paracorpus/commit.py), never by renaming directories.

Faults: a remote store's transient errors (503 SlowDown, 500, a connection reset or refused, a
timeout) are retried with exponential backoff for up to ``PARAGEN_STORAGE_RETRY_SECONDS`` (300
by default) per operation, so a flaky store or one that is down for a few minutes slows a run but
does not end it; permanent ones (403, 404, bad credentials, no such bucket) fail at once. Every
operation is safe to repeat: reads re-read a range, a write is spooled to a local file and
uploaded again whole (an object appears only when its upload completes), deletes of what is
gone succeed. Past the budget the operation fails with one StorageError line naming the store.
"""
from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import io
import json
import logging
import os
import random
import re
import shutil
import tempfile
import threading
import time
import uuid
from urllib.parse import urlparse

import pyarrow.fs as pafs

from common.crash_points import storage_op

log = logging.getLogger("paragen.storage")
_FS_CACHE: dict = {}
_FS_LOCK = threading.Lock()
_SCHEMES = {"s3", "gs", "gcs", "hdfs", "viewfs", "file"}


def is_url(path: str) -> bool:
    """True for scheme://... paths (object stores, HDFS, file://)."""
    return "://" in path and path.split("://", 1)[0].lower() in _SCHEMES


def is_local(path: str) -> bool:
    return not is_url(path) or path.lower().startswith("file://")


DEFAULT_TIMEOUT = 60.0


class StorageError(OSError):
    """A remote store that did not answer (in time) or refused: one line naming the endpoint.
    TRANSIENT: whether asking again may help; DETAIL: the store's own words, shortened."""

    def __init__(self, message: str, transient: bool = False, detail: str = ""):
        super().__init__(message)
        self.transient, self.detail = transient, detail or message


def timeout_seconds() -> float:
    """How long a remote store may take to answer before a command gives up: $PARAGEN_STORAGE_TIMEOUT
    seconds (default 60). pyarrow's own defaults retry for about 15 minutes without a word."""
    value = os.environ.get("PARAGEN_STORAGE_TIMEOUT", "")
    try:
        seconds = float(value) if value else DEFAULT_TIMEOUT
    except ValueError:
        raise StorageError(f"PARAGEN_STORAGE_TIMEOUT={value!r} is not a number of seconds") from None
    if not 0 < seconds < 86400:
        raise StorageError(f"PARAGEN_STORAGE_TIMEOUT={value!r} must be between 0 and 86400 seconds")
    return seconds


DEFAULT_RETRY_SECONDS = 300.0
_RETRY_FIRST_S, _RETRY_MAX_S = 0.5, 30.0       # backoff: doubled each try, jittered, capped
# what a store answers when asking again cannot help: refusals, missing things, bad requests
_PERMANENT = re.compile(
    r"ACCESS_DENIED|AccessDenied|Forbidden|NO_SUCH_|NoSuch|INVALID_ACCESS_KEY|InvalidAccessKey"
    r"|SIGNATURE_DOES_NOT_MATCH|SignatureDoesNotMatch|PERMISSION_DENIED|UNAUTHENTICATED|NOT_FOUND|INVALID_ARGUMENT"
    r"|HTTP status (40[0-7]|409|41[0-9])\b"                      # 408 (request timeout) and 429 are retried
    r"|[Ii]nvalid bucket name|BUCKET_ALREADY|[Ee]xpected a (file|directory)|[Nn]ot a directory|[Ii]s a directory")


def retry_seconds() -> float:
    """How long one operation on a remote store is retried through transient errors before the
    command gives up: $PARAGEN_STORAGE_RETRY_SECONDS (default 300; 0: no retry)."""
    value = os.environ.get("PARAGEN_STORAGE_RETRY_SECONDS", "")
    try:
        seconds = float(value) if value else DEFAULT_RETRY_SECONDS
    except ValueError:
        raise StorageError(f"PARAGEN_STORAGE_RETRY_SECONDS={value!r} is not a number of seconds") from None
    if not 0 <= seconds < 86400 * 7:
        raise StorageError(f"PARAGEN_STORAGE_RETRY_SECONDS={value!r} must be between 0 and 604800 seconds")
    return seconds


def is_transient(exc: BaseException) -> bool:
    """True for a remote store's error that asking again may cure (throttling, a server error, a
    dropped or refused connection, a timeout); False for refusals and what does not exist."""
    if isinstance(exc, StorageError):
        return exc.transient
    if not isinstance(exc, OSError) or isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError,
                                                        NotADirectoryError, FileExistsError)):
        return False
    return not _PERMANENT.search(str(exc))


class _RetryLog:
    """At most one warning line per 30 s per process about transient store errors being retried."""

    def __init__(self):
        self.lock, self.last, self.count = threading.Lock(), 0.0, 0

    def note(self, path: str, detail: str) -> None:
        with self.lock:
            self.count += 1
            now = time.monotonic()
            if now - self.last < 30:
                return
            self.last, count = now, self.count
        log.warning("%s: the store at %s did not answer (%s); retrying for up to %gs (PARAGEN_STORAGE_RETRY_SECONDS); "
                    "%d transient error(s) so far in this process", path, endpoint_of(path), detail, retry_seconds(),
                    count)


_RETRY_LOG = _RetryLog()
_AWAY: set = set()              # stores that stayed away past the retry budget in this process
_ANSWERED: set = set()          # stores that answered in this process
# A connection that could not be made at all (refused, no route, no such host, a connect timeout),
# as opposed to a store that answered with an error or dropped a connection it had accepted.
_NO_CONNECTION = re.compile(r"[Cc]ouldn'?t connect|[Cc]ould not connect|[Cc]onnection refused|[Cc]ould not resolve"
                            r"|resolve host|[Nn]o route to host|[Ff]ailed to connect|curlCode: (6|7|28)\b"
                            r"|[Cc]onnect timeout|EndpointConnectionError|Connect timeout")
_FIRST_CONTACT = [0]            # > 0 inside first_contact(): a store never answered gets no retry budget


@contextlib.contextmanager
def first_contact():
    """A job's check phase: a store that has not answered in this process yet and fails with a
    transient error (no route, refused, a timeout) is not retried for the whole budget: it is most
    likely a mistake (an endpoint, a network, credentials), said in one line within the timeout,
    before anything is written. A store that answered once in this run keeps the budget for when
    it goes away later."""
    _FIRST_CONTACT[0] += 1
    try:
        yield
    finally:
        _FIRST_CONTACT[0] -= 1


def _first_line(exc: BaseException, limit: int = 160) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return first if len(first) <= limit else first[:limit - 3] + "..."


def retrying(path: str, fn, *args, **kwargs):
    """FN(*ARGS, **KWARGS), its transient remote errors retried with backoff for up to
    retry_seconds(); past that, or for a permanent error, one StorageError line naming PATH's
    store. Local paths are not retried (a full disk does not empty itself)."""
    if not is_url(path) or is_local(path):
        return fn(*args, **kwargs)
    deadline, delay, store = None, _RETRY_FIRST_S, endpoint_of(path)
    while True:
        try:
            with _explained(path):
                result = fn(*args, **kwargs)
            _AWAY.discard(store)
            _ANSWERED.add(store)
            return result
        except StorageError as exc:
            if not exc.transient:
                raise
            if _FIRST_CONTACT[0] and store not in _ANSWERED and _NO_CONNECTION.search(exc.detail or str(exc)):
                raise StorageError(f"{exc}; it never answered in this run (not retried before anything is written: "
                                   "check the endpoint, the network and the credentials)") from None
            now = time.monotonic()
            # a store that already stayed away past the budget in this process is tried once more,
            # not waited for again: the job's last steps (its claim, its error log) end in seconds
            budget = 0.0 if store in _AWAY else retry_seconds()
            deadline = deadline if deadline is not None else now + budget
            if now >= deadline:          # the whole budget waited: the line's "retried for" is true
                _AWAY.add(store)
                raise StorageError(f"{exc}; retried for {retry_seconds():g}s (PARAGEN_STORAGE_RETRY_SECONDS)",
                                   transient=True) from None
            _RETRY_LOG.note(path, exc.detail)
            time.sleep(min(delay * random.uniform(0.5, 1.0), deadline - now))     # never past the deadline
            delay = min(delay * 2, _RETRY_MAX_S)


def _s3_endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def _gcs_emulator() -> str | None:
    return os.environ.get("STORAGE_EMULATOR_HOST") or os.environ.get("CLOUD_STORAGE_EMULATOR_ENDPOINT")


def endpoint_of(path: str) -> str:
    """The server a URL's store talks to, in words (for error messages)."""
    scheme = path.split("://", 1)[0].lower() if is_url(path) else "file"
    if scheme == "s3":
        return _s3_endpoint() or f"AWS S3 ({os.environ.get('AWS_REGION') or os.environ.get('AWS_DEFAULT_REGION') or 'default region'})"
    if scheme in ("gs", "gcs"):
        return _gcs_emulator() or "storage.googleapis.com"
    return scheme


def _s3() -> pafs.FileSystem:
    # each attempt's connection and each read may take T/3, three attempts: about T in all
    t = timeout_seconds()
    kwargs = {"connect_timeout": t / 3, "request_timeout": t / 3,
              "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=3)}
    endpoint = _s3_endpoint()
    if endpoint:
        parsed = urlparse(endpoint if "://" in endpoint else "https://" + endpoint)
        kwargs.update(endpoint_override=parsed.netloc, scheme=parsed.scheme)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        kwargs["region"] = region
    return pafs.S3FileSystem(**kwargs)


def _gcs() -> pafs.FileSystem:
    # pyarrow's GCS client ignores STORAGE_EMULATOR_HOST (the variable Google's Python client and
    # emulators use), so it is read here; CLOUD_STORAGE_EMULATOR_ENDPOINT is what its C++ client reads.
    import datetime

    emulator = _gcs_emulator()
    project = os.environ.get("GOOGLE_CLOUD_PROJECT")
    # a listing takes two calls (object, then prefix), each retried up to the limit
    limit = datetime.timedelta(seconds=timeout_seconds() / 2)
    if emulator:
        parsed = urlparse(emulator if "://" in emulator else "http://" + emulator)
        return pafs.GcsFileSystem(anonymous=True, endpoint_override=parsed.netloc, scheme=parsed.scheme,
                                  project_id=project, retry_time_limit=limit)
    return pafs.GcsFileSystem(project_id=project, retry_time_limit=limit)


def _hdfs_ready(path: str) -> None:
    """Refuse hdfs:// (one line) where pyarrow cannot load Hadoop's client: it needs Java
    (JAVA_HOME) and libhdfs (ARROW_LIBHDFS_DIR or HADOOP_HOME), and without them it prints dozens
    of dlopen lines before failing."""
    libdirs = [os.environ.get("ARROW_LIBHDFS_DIR", "")]
    if os.environ.get("HADOOP_HOME"):
        libdirs.append(os.path.join(os.environ["HADOOP_HOME"], "lib", "native"))
    has_lib = any(d and os.path.isfile(os.path.join(d, "libhdfs.so")) for d in libdirs)
    if not os.environ.get("JAVA_HOME") or not has_lib:
        raise StorageError(f"{path}: hdfs:// needs Hadoop's libhdfs and Java on this machine (set JAVA_HOME, and "
                           "HADOOP_HOME or ARROW_LIBHDFS_DIR to where libhdfs.so is); "
                           f"JAVA_HOME {'set' if os.environ.get('JAVA_HOME') else 'unset'}, libhdfs.so "
                           f"{'found' if has_lib else 'not found'}")


@contextlib.contextmanager
def _explained(path: str):
    """Turn what a remote store raises for PATH (a network error, a timeout) into one
    StorageError line naming the endpoint. FileNotFoundError, PermissionError and local paths
    pass as they are."""
    try:
        yield
    except (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, StorageError):
        raise
    except OSError as exc:
        if not is_url(path) or is_local(path):
            raise
        detail = _first_line(exc)
        if not is_transient(exc):
            raise StorageError(f"{path}: the store at {endpoint_of(path)} refused ({detail})", detail=detail) from None
        raise StorageError(f"{path}: the store at {endpoint_of(path)} did not answer or refused "
                           f"({detail}); timeout {timeout_seconds():g}s (PARAGEN_STORAGE_TIMEOUT)",
                           transient=True, detail=detail) from None


def resolve(path: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for PATH. Filesystems are made once per process and scheme."""
    if not is_url(path):
        return _cached("local", pafs.LocalFileSystem), os.path.abspath(path)
    scheme, rest = path.split("://", 1)
    scheme = scheme.lower()
    if scheme == "file":
        return _cached("local", pafs.LocalFileSystem), os.path.abspath(rest)
    rest = rest.rstrip("/") if rest.count("/") else rest
    if scheme == "s3":
        return _cached("s3", _s3), rest
    if scheme in ("gs", "gcs"):
        return _cached("gcs", _gcs), rest
    if scheme in ("hdfs", "viewfs"):
        _hdfs_ready(path)
    with _explained(path):
        fs, inner = pafs.FileSystem.from_uri(path)
    return fs, inner


def _cached(key: str, make):
    env = (os.environ.get("AWS_ENDPOINT_URL"), os.environ.get("AWS_ENDPOINT_URL_S3"),
           os.environ.get("STORAGE_EMULATOR_HOST"), os.environ.get("AWS_REGION"), os.environ.get("AWS_DEFAULT_REGION"),
           os.environ.get("PARAGEN_STORAGE_TIMEOUT"))
    with _FS_LOCK:
        fs = _FS_CACHE.get((key, env))
        if fs is None:
            fs = _FS_CACHE[(key, env)] = make()
        return fs


def join(base: str, *parts: str) -> str:
    """BASE / PARTS for local paths and URLs alike."""
    if not is_url(base):
        return os.path.join(base, *parts)
    out = base.rstrip("/")
    for p in parts:
        out = f"{out}/{p.strip('/')}"
    return out


def parent(path: str) -> str:
    if not is_url(path):
        return os.path.dirname(os.path.abspath(path))
    scheme, rest = path.split("://", 1)
    return f"{scheme}://{rest.rstrip('/').rsplit('/', 1)[0]}" if "/" in rest.rstrip("/") else path


def basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1] if is_url(path) else os.path.basename(path)


def absolute(path: str) -> str:
    """PATH as an absolute local path or an unchanged URL (what workers elsewhere can open)."""
    return path if is_url(path) else os.path.abspath(path)


def _info(path: str):
    fs, inner = resolve(path)
    return retrying(path, fs.get_file_info, inner)


def exists(path: str) -> bool:
    return _info(path).type != pafs.FileType.NotFound


def isfile(path: str) -> bool:
    return _info(path).type == pafs.FileType.File


def isdir(path: str) -> bool:
    """A directory, or on an object store a prefix some object lives under."""
    return _info(path).type == pafs.FileType.Directory


def stat(path: str) -> tuple[int, int | None]:
    """(size in bytes, modification time in ns or None) of the file PATH."""
    info = _info(path)
    if info.type != pafs.FileType.File:
        raise FileNotFoundError(f"{path}: no such file")
    return info.size, info.mtime_ns


def size(path: str) -> int:
    info = _info(path)
    if info.type != pafs.FileType.File:
        raise FileNotFoundError(f"{path}: no such file")
    return info.size


def _url_of(base_url: str, base_inner: str, inner: str) -> str:
    """The URL (or local path) of INNER, found under BASE_INNER while listing BASE_URL."""
    if not is_url(base_url):
        return inner
    rel = inner[len(base_inner):].lstrip("/")
    return join(base_url, rel) if rel else base_url


def list_files(path: str, recursive: bool = True) -> list[str]:
    """Files under the directory (or prefix) PATH, sorted, as paths of the same kind as PATH.
    Hidden names (a part starting with '.' or '_') are included; callers filter."""
    storage_op("list", path)
    fs, inner = resolve(path)
    try:
        infos = retrying(path, fs.get_file_info, pafs.FileSelector(inner, recursive=recursive, allow_not_found=True))
    except FileNotFoundError:
        return []
    return sorted(_url_of(path, inner, i.path) for i in infos if i.type == pafs.FileType.File)


def listdir(path: str) -> list[str]:
    """Names directly under PATH (files and directories), sorted. On object stores from a
    recursive listing: GCS lists no 'directory' that is only a prefix of objects."""
    storage_op("list", path)
    fs, inner = resolve(path)
    try:
        return retrying(path, _listdir, fs, inner)
    except FileNotFoundError:
        return []


def _listdir(fs, inner: str) -> list[str]:
    if fs.type_name == "local":
        return sorted(i.base_name for i in fs.get_file_info(pafs.FileSelector(inner, recursive=False, allow_not_found=True)))
    infos = fs.get_file_info(pafs.FileSelector(inner, recursive=True, allow_not_found=True))
    base = inner.rstrip("/") + "/"
    return sorted({i.path[len(base):].split("/", 1)[0] for i in infos if i.path.startswith(base)} - {""})


def has_wildcards(path: str) -> bool:
    return any(ch in path for ch in "*?[")


def glob(pattern: str) -> list[str]:
    """Files matching PATTERN, sorted. Local patterns follow Python's glob; on object stores the
    prefix before the first wildcard is listed and matched with fnmatch (where '*' also matches
    '/')."""
    if not is_url(pattern):
        import glob as _glob

        return sorted(p for p in _glob.glob(pattern) if os.path.isfile(p))
    first = min(pattern.index(ch) for ch in "*?[" if ch in pattern)
    base = pattern[:first].rsplit("/", 1)[0]
    return [p for p in list_files(base) if fnmatch.fnmatchcase(p, pattern)]


class _RetryingReader(io.RawIOBase):
    """A remote file read range by range, each range retried through transient errors (a fresh
    handle after a failure): a dropped connection in the middle of a large shard costs a retry,
    not the rest of the shard."""

    def __init__(self, path: str, fs, inner: str):
        super().__init__()
        self.path, self._fs, self._inner = path, fs, inner
        self._file = retrying(path, fs.open_input_file, inner)
        self._size, self._pos = self._file.size(), 0

    def _read_at(self, n: int, offset: int) -> bytes:
        try:
            return self._file.read_at(n, offset)
        except OSError:
            self._file = self._fs.open_input_file(self._inner)      # a handle that failed is not trusted again
            raise

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self._size - self._pos)
        if n <= 0:
            return 0
        data = retrying(self.path, self._read_at, n, self._pos)
        buffer[:len(data)] = data
        self._pos += len(data)
        return len(data)

    def readall(self) -> bytes:
        # RawIOBase's own reads 8 KiB at a time: one request each
        parts = []
        while self._pos < self._size:
            part = retrying(self.path, self._read_at, min(8 << 20, self._size - self._pos), self._pos)
            if not part:
                break
            parts.append(part)
            self._pos += len(part)
        return b"".join(parts)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = max(0, {0: offset, 1: self._pos + offset, 2: self._size + offset}[whence])
        return self._pos

    def tell(self) -> int:
        return self._pos

    def size(self) -> int:
        return self._size

    def close(self) -> None:
        if not self.closed:
            self._file.close()
        super().close()


def open_input(path: str):
    """A buffered binary stream of PATH's bytes as stored (no decompression)."""
    fs, inner = resolve(path)
    if fs.type_name == "local":
        return open(inner, "rb")
    return io.BufferedReader(_RetryingReader(path, fs, inner), buffer_size=1 << 20)


def open_random_access(path: str):
    """A seekable file for PATH (what Parquet readers need); a remote one retries each read."""
    fs, inner = resolve(path)
    if fs.type_name == "local":
        return fs.open_input_file(inner)
    return io.BufferedReader(_RetryingReader(path, fs, inner), buffer_size=1 << 20)


@contextlib.contextmanager
def open_output(path: str):
    """Write PATH as a whole: yields a binary stream; readers see the old file (or none) until the
    block succeeds, then the new one. Local: a hidden temporary name, then a rename. Object stores:
    the upload completes (and the object appears) when the stream closes without an error.
    Local files are on the disk (fsync of the file, then of its directory after the rename)
    before this returns: a manifest written after them never lists a file a power loss empties."""
    storage_op("write", path)
    fs, inner = resolve(path)
    if fs.type_name == "local":
        with _staged(inner, os.replace) as f:
            yield f
        return
    # Spooled to a local file, then uploaded whole: an upload that fails half-way is made again
    # from the spool (idempotent: the object appears only when an upload completes).
    with tempfile.TemporaryFile(prefix="paragen-upload-", dir=os.environ.get("PARAGEN_SPOOL_DIR")) as spool:
        yield spool
        spool.flush()
        try:
            retrying(path, _upload, fs, inner, spool)
        except StorageError as exc:
            # A completion retried after the store had completed the upload (its answer lost):
            # MinIO and Ceph forget a completed upload and answer NoSuchUpload. The object is there.
            if not re.search(r"NoSuchUpload|NO_SUCH_UPLOAD", str(exc)) or not _uploaded(path, spool):
                raise
            log.info("%s: the upload's completion was retried after it had succeeded (%s); the object is there",
                     path, exc.detail or "NoSuchUpload")


@contextlib.contextmanager
def _staged(inner: str, place):
    """A hidden temporary file beside the local path INNER to write in the block; once written, on
    the disk (fsync) and PLACE(tmp, INNER) puts it there (os.replace, or os.link: which fails if
    INNER exists), then the directory is synced too. The temporary file never stays behind."""
    directory = os.path.dirname(inner)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(inner)}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        place(tmp, inner)
        _fsync_dir(directory)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


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


def create_new(path: str, data: bytes) -> bool | None:
    """Write DATA as PATH only if nothing is there, in one step no other writer can split: True if
    this call created it, False if PATH existed. A local disk links a fully written temporary file
    to the name (``link`` fails if the name exists); S3 puts with ``If-None-Match: *``
    (conditional writes, 2024; a retried put that had succeeded answers 412 as well, so the
    caller reads PATH back to tell). Stores with no conditional create here (GCS through
    pyarrow, HDFS) write when PATH is absent and return None: two writers in the same instant may
    both write, the last one wins, and the caller must read PATH back to learn which."""
    storage_op("write", path)
    fs, inner = resolve(path)
    if fs.type_name == "local":
        try:
            with _staged(inner, os.link) as f:
                f.write(data)
        except FileExistsError:
            return False
        return True
    if path.split("://", 1)[0].lower() == "s3":
        bucket, _, key = inner.partition("/")
        client = _cached("boto3-s3", _boto3_s3)
        return retrying(path, _put_if_absent, client, bucket, key, data)
    if exists(path):
        return False
    write_bytes(path, data)
    return None


def _boto3_s3():
    import boto3
    from botocore.config import Config

    t = timeout_seconds()
    return boto3.client("s3", endpoint_url=_s3_endpoint(), region_name=os.environ.get("AWS_REGION")
                        or os.environ.get("AWS_DEFAULT_REGION") or None,
                        config=Config(connect_timeout=t / 3, read_timeout=t / 3, retries={"max_attempts": 1}))


def _put_if_absent(client, bucket: str, key: str, data: bytes) -> bool:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        return True
    except ClientError as exc:
        err, meta = exc.response.get("Error", {}), exc.response.get("ResponseMetadata", {})
        status = meta.get("HTTPStatusCode")
        if err.get("Code") == "PreconditionFailed" or status == 412:
            return False
        if status == 501 or err.get("Code") == "NotImplemented":
            # an S3-compatible store without conditional writes: as GCS here (the caller reads back)
            client.put_object(Bucket=bucket, Key=key, Body=data)
            return None
        if status == 409:            # ConditionalRequestConflict: another conditional write in flight
            raise OSError(f"S3 {err.get('Code')} (HTTP 409, a conditional write in flight): retry") from None
        raise OSError(f"S3 {err.get('Code')}: {err.get('Message')} (HTTP status {status})") from None
    except BotoCoreError as exc:
        raise OSError(f"S3: {exc}") from None


def read_bytes(path: str) -> bytes:
    with open_input(path) as f:
        return f.read()


def write_bytes(path: str, data: bytes) -> str:
    with open_output(path) as f:
        f.write(data)
    return path


def read_json(path: str):
    """The JSON document PATH holds; ValueError when it is not one (bad UTF-8, bad JSON, or
    nested too deeply for the parser: a hostile file must not end in a RecursionError)."""
    try:
        return json.loads(read_bytes(path).decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deeply") from None


def write_json(path: str, obj, indent: int | None = 2, **dump_kw) -> str:
    return write_bytes(path, json.dumps(obj, indent=indent, **dump_kw).encode("utf-8"))


def delete(path: str) -> None:
    """Remove the file PATH (no error if it is already gone)."""
    storage_op("delete", path)
    fs, inner = resolve(path)
    with contextlib.suppress(FileNotFoundError):
        retrying(path, fs.delete_file, inner)


def delete_tree(path: str) -> None:
    """Remove the directory or prefix PATH and everything under it (no error if absent)."""
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


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open_input(path) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def copy_file(src: str, dst: str) -> str:
    """Copy SRC to DST (either may be a URL), DST written as a whole."""
    with open_input(src) as fin, open_output(dst) as fout:
        for block in iter(lambda: fin.read(1 << 20), b""):
            fout.write(block)
    return dst


def parquet_dataset(paths: list[str]):
    """A pyarrow dataset over PATHS (local paths or URLs of one store): the files a manifest lists."""
    import pyarrow.dataset as ds

    if not paths:
        raise ValueError("no Parquet files to read")
    fs = resolve(paths[0])[0]
    return ds.dataset([resolve(p)[1] for p in paths], filesystem=fs, format="parquet")


def parquet_file(path: str):
    """A pyarrow.parquet.ParquetFile for PATH (local or URL)."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(open_random_access(path))


def cache_root() -> str:
    """Where copies of remote models live on this machine ($PARAGEN_CACHE, default ~/.cache/paragen)."""
    return os.environ.get("PARAGEN_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "paragen")


@contextlib.contextmanager
def _file_lock(path: str):
    import fcntl

    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def local_copy(path: str, names: list[str] | None = None) -> str:
    """A local path holding PATH: PATH itself when it is local; for a URL, a copy in the cache,
    downloaded once per machine (worker processes wait on a file lock) and kept while the remote
    files keep their sizes and times. For a directory, NAMES limits the copy to those files
    (default: every file under it)."""
    import tempfile

    if is_local(path):
        return resolve(path)[1]
    single = isfile(path)
    if single:
        listing = [(basename(path), *stat(path))]
    else:
        remote = list_files(path)
        rels = [p[len(path.rstrip("/")) + 1:] for p in remote]
        listing = [(rel, *stat(join(path, rel))) for rel in rels if names is None or rel in names]
        if not listing:
            raise FileNotFoundError(f"{path}: no such file or directory")
    key = hashlib.sha256(json.dumps([path.rstrip("/"), listing]).encode()).hexdigest()[:24]
    root = os.path.join(cache_root(), "copies")
    target = os.path.join(root, key)
    with _file_lock(target + ".lock"):
        if not os.path.exists(os.path.join(target, ".complete")):
            tmp = tempfile.mkdtemp(prefix=".download-", dir=root)
            try:
                for rel, _size, _mtime in listing:
                    src = path if single else join(path, rel)
                    copy_file(src, os.path.join(tmp, rel))
                open(os.path.join(tmp, ".complete"), "w").close()
                shutil.rmtree(target, ignore_errors=True)
                os.replace(tmp, target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return os.path.join(target, listing[0][0]) if single else target


def upload_dir(local: str, remote: str, last: str | None = None) -> None:
    """Copy every file under LOCAL to REMOTE (a URL), the file named LAST at the end (readers
    take it as the mark of a whole directory)."""
    files = sorted(os.path.relpath(os.path.join(d, n), local) for d, _, ns in os.walk(local) for n in ns)
    for rel in sorted(files, key=lambda r: r == last):
        copy_file(os.path.join(local, rel), join(remote, rel.replace(os.sep, "/")))
