"""HDFS over WebHDFS: ``webhdfs://namenode:9870/path``. Every NameNode serves Hadoop's REST
interface on its HTTP port (``dfs.webhdfs.enabled``, on by default; 9870 since Hadoop 3), so the
jobs reach HDFS from Python alone: no Java, no Hadoop client and no libhdfs on the machine
(pyarrow's ``hdfs://`` needs all three, and no package registry ships libhdfs).

fsspec's client does the talking; this module adds what the storage layer relies on:

- a timeout on every request (fsspec's has none: a NameNode that accepts and never answers would
  hang a worker for ever);
- a file written in one request, from a local spool (fsspec's writer creates an empty file and
  appends to it, four requests, the file visible and partial in between); :mod:`writing` writes
  under a hidden name and renames, so readers see the whole file or none;
- renames that fail when they did not happen (fsspec's ``mv`` ignores WebHDFS's
  ``{"boolean": false}``): :meth:`Client.mv` replaces the destination in one NameNode operation
  (HDFS's ``rename`` with ``OVERWRITE``, what pyarrow's ``move`` promises), :meth:`Client.rename_new`
  renames only if the name is free, which one renamer wins (the conditional writes' create);
- the modification time, which pyarrow reads as ``mtime``;
- listings that survive a directory made while they look (:class:`Handler`).

The user is ``HADOOP_USER_NAME`` (Hadoop's own variable), else this process's user (simple
authentication; Kerberos is not supported).
"""
from __future__ import annotations

import datetime
import getpass
import os

import pyarrow.fs as pafs
import requests
from fsspec.implementations.webhdfs import WebHDFS

from common.storage.retries import StorageError

DEFAULT_PORT = 9870           # the NameNode's HTTP port since Hadoop 3 (50070 before)


class _Timeouts(requests.adapters.HTTPAdapter):
    """Every request of the session ends after TIMEOUT seconds without an answer."""

    def __init__(self, timeout: float):
        super().__init__()
        self.timeout = timeout

    def send(self, request, **kwargs):
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = self.timeout
        return super().send(request, **kwargs)


def _with_mtime(info: dict) -> dict:
    if info.get("modificationTime") is not None:
        info["mtime"] = datetime.datetime.fromtimestamp(info["modificationTime"] / 1000, datetime.timezone.utc)
    return info


class Client(WebHDFS):
    """fsspec's WebHDFS client with timeouts, whole-file writes and renames that say when they failed."""

    def __init__(self, host: str, port: int, timeout: float):
        user = os.environ.get("HADOOP_USER_NAME") or getpass.getuser()
        super().__init__(host, port=port, user=user, skip_instance_cache=True)
        adapter = _Timeouts(timeout)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)

    def _call(self, op, method="get", path=None, data=None, redirect=True, **kwargs):
        """fsspec's request, its errors made the storage layer's: an existing file FileExistsError,
        a NameNode in standby or safe mode and a 5xx transient StorageErrors, other refusals
        permanent ones (fsspec raises RuntimeError, or HTTPError without a word of HDFS's)."""
        try:
            return super()._call(op, method=method, path=path, data=data, redirect=redirect, **kwargs)
        except RuntimeError as exc:
            raise _error(f"{op} {path}", str(exc)) from None
        except requests.HTTPError as exc:
            raise _error(f"{op} {path}", str(exc), exc.response.status_code if exc.response is not None else 0) from None

    def info(self, path, **kwargs):
        return _with_mtime(super().info(path))

    # fsspec's exists/isfile/isdir answer False on any error: a NameNode that is down would look
    # like a missing file (a resume finding no units, a pointer read as absent). Only "not found" is.
    def _type(self, path) -> str | None:
        """"file", "directory", or None when PATH does not exist; other errors raised."""
        try:
            return self.info(path)["type"]
        except FileNotFoundError:
            return None

    def exists(self, path, **kwargs):
        return self._type(path) is not None

    def isfile(self, path):
        return self._type(path) == "file"

    def isdir(self, path):
        return self._type(path) == "directory"

    def ls(self, path, detail=False, **kwargs):
        listed = super().ls(path, detail=detail, **kwargs)
        return [_with_mtime(i) for i in listed] if detail else listed

    def _open(self, path, mode="rb", **kwargs):
        if "r" not in mode:
            raise ValueError(f"{path}: webhdfs:// files are written whole by the storage layer (Client.put), "
                             f"not opened with mode {mode!r}")
        return super()._open(path, mode=mode, **kwargs)

    def put(self, path: str, stream, overwrite: bool = True) -> None:
        """Write the file PATH from STREAM in one request (the NameNode names a DataNode, which takes
        the bytes). Without OVERWRITE, FileExistsError when PATH exists (HDFS decides: one creator
        wins)."""
        where = self._call("CREATE", method="put", path=path, redirect=False,
                           overwrite="true" if overwrite else "false")
        location = self._apply_proxy(where.headers["Location"])
        out = self.session.put(location, data=stream, headers={"content-type": "application/octet-stream"})
        if out.status_code >= 400:
            raise _error(f"CREATE {path}", out.text[:500], out.status_code)

    def mv(self, path1, path2, **kwargs):
        """Rename PATH1 as PATH2, replacing a file there, in one NameNode operation."""
        self._call("RENAME", method="put", path=path1, destination=self._strip_protocol(path2),
                   renameoptions="OVERWRITE")

    def rename_new(self, src: str, dst: str) -> None:
        """Rename SRC as DST only if DST does not exist: FileExistsError when it does (another
        renamer won), FileNotFoundError when SRC is gone."""
        done = self._call("RENAME", method="put", path=src, destination=self._strip_protocol(dst)).json()
        if not done.get("boolean"):
            if self.exists(dst):
                raise FileExistsError(f"{dst}: exists")
            raise FileNotFoundError(f"{src}: not found")


def _error(what: str, words: str, status: int = 0) -> OSError:
    if "FileAlreadyExistsException" in words or "already exists" in words:
        return FileExistsError(f"{what}: exists")
    if "FileNotFoundException" in words or status == 404:
        return FileNotFoundError(f"{what}: not found")
    transient = status >= 500 or status in (408, 429) or any(
        w in words for w in ("StandbyException", "RetriableException", "SafeModeException"))
    return StorageError(f"{what}: WebHDFS answered {status or 'an error'}: {words.strip()[:300]}", transient=transient)


def split(url: str) -> tuple[str, int, str]:
    """(host, port, absolute path) of a webhdfs:// URL; the port defaults to 9870."""
    rest = url.split("://", 1)[1]
    netloc, _, path = rest.partition("/")
    host, _, port = netloc.rpartition(":") if ":" in netloc else (netloc, "", "")
    if not host or (port and not port.isdigit()):
        raise ValueError(f"{url}: expected webhdfs://NAMENODE[:HTTP_PORT]/path")
    return host, int(port or DEFAULT_PORT), "/" + path.strip("/")


class Handler(pafs.FSSpecHandler):
    """pyarrow's handler of an fsspec filesystem, with a listing that survives a race of its own:
    it asks isdir(base), then exists(base), and calls a directory another writer made between the
    two "not a directory" (NotADirectoryError: one of two claims racing for an output failed so
    under load). Asked again, a directory lists; a file still raises."""

    def get_file_info_selector(self, selector, attempts: int = 5):
        for _ in range(attempts - 1):
            try:
                return super().get_file_info_selector(selector)
            except NotADirectoryError:
                if self.fs.isfile(selector.base_dir):
                    raise
        return super().get_file_info_selector(selector)


def filesystem(host: str, port: int, timeout: float):
    """A pyarrow filesystem over WebHDFS at HOST:PORT."""
    return pafs.PyFileSystem(Handler(Client(host, port, timeout)))


def client_of(fs) -> Client | None:
    """The WebHDFS client behind pyarrow filesystem FS, or None for another store."""
    handler = getattr(fs, "handler", None)
    inner = getattr(handler, "fs", None)
    return inner if isinstance(inner, Client) else None
