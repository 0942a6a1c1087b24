"""Reading: what is there (listings, sizes), whole files and ranges of remote ones retried read by
read, JSON, hashes and Parquet."""
from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import os

import pyarrow.fs as pafs

from common.crash_points import storage_op
from common.storage.paths import is_url, join
from common.storage.retries import retrying
from common.storage.stores import resolve

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


def read_bytes(path: str) -> bytes:
    with open_input(path) as f:
        return f.read()


def read_json(path: str):
    """The JSON document PATH holds; ValueError when it is not one (bad UTF-8, bad JSON, or
    nested too deeply for the parser: a hostile file must not end in a RecursionError)."""
    try:
        return json.loads(read_bytes(path).decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deeply") from None


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open_input(path) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
