"""Connecting to each store: one ``pyarrow.fs`` filesystem per process and scheme (local, S3,
GCS, HDFS), configured from the usual variables, with this layer's timeouts."""
from __future__ import annotations

import os
import threading
from urllib.parse import urlparse

import pyarrow.fs as pafs

from common.storage import webhdfs
from common.storage.paths import _gcs_emulator, _s3_endpoint, is_url
from common.storage.retries import StorageError, _explained, timeout_seconds

_FS_CACHE: dict = {}
_FS_LOCK = threading.Lock()


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
                           "HADOOP_HOME or ARROW_LIBHDFS_DIR to where libhdfs.so is), or use "
                           "webhdfs://NAMENODE:9870/path, which needs neither; "
                           f"JAVA_HOME {'set' if os.environ.get('JAVA_HOME') else 'unset'}, libhdfs.so "
                           f"{'found' if has_lib else 'not found'}")


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
    if scheme == "webhdfs":
        try:
            host, port, inner = webhdfs.split(path)
        except ValueError as exc:
            raise StorageError(str(exc)) from None
        return _cached(f"webhdfs://{host}:{port}", lambda: webhdfs.filesystem(host, port, timeout_seconds())), inner
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
