"""Copies of remote models on this machine: downloaded once per machine (worker processes wait on
a file lock) into ``$PARAGEN_CACHE`` and kept while the remote files keep their sizes and times."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil

from common.storage.paths import basename, is_local, join
from common.storage.reading import isfile, list_files, stat
from common.storage.stores import resolve
from common.storage.writing import copy_file

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
