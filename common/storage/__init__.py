"""One storage layer for every path the jobs read or write: a local path or a URL.

Built on ``pyarrow.fs``: pyarrow is already a dependency of Beam and of this project (Parquet),
its wheels carry native S3 and GCS clients, and ``pyarrow.parquet`` / ``pyarrow.dataset`` read
and write through the same filesystem objects, so one layer serves files, Parquet and listings
with nothing else to install on workers. (Beam's ``FileSystems`` needs the ``gcp``/``aws`` extras
and has no Parquet integration; fsspec needs s3fs/gcsfs on top.)

Paths: ``/local/path`` or ``relative/path``, ``file:///path``, ``s3://bucket/key``,
``gs://bucket/key`` (or ``gcs://``), ``webhdfs://namenode:9870/path`` (HDFS over its REST
interface, from Python alone: :mod:`common.storage.webhdfs`), and whatever else
``pyarrow.fs.FileSystem.from_uri`` knows (``hdfs://``, which needs Java and libhdfs). Object stores are configured the usual way: S3 by ``AWS_*`` variables
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

Records that change (a claim, a manifest, ``latest``) are numbered versions, each created once with
the store's put-if-absent (:mod:`common.storage.versions` over :mod:`common.storage.conditional`:
``link(2)``, S3 ``If-None-Match``, GCS ``ifGenerationMatch=0``, an HDFS rename): of two writers that
read one version, one creates the next, however long the other was paused.

The package, one concern a module: ``paths`` (joining, naming the store), ``retries`` (timeouts,
the retry budget, one error line), ``stores`` (one pyarrow filesystem per store), ``reading``,
``writing`` (whole files, staged or spooled), ``conditional`` (each store's put-if-absent, the
store's clock), ``versions`` (records as numbered versions), ``webhdfs``
(HDFS's REST client) and
``model_cache`` (copies of remote models on this machine). Callers use ``from common import
storage`` and the names below.
"""
from common.storage.conditional import PROBE_NAME, Conflict, create_new, probe_in_flight, store_now
from common.storage.model_cache import cache_root, local_copy
from common.storage.paths import absolute, basename, endpoint_of, has_wildcards, is_local, is_url, join, parent
from common.storage.reading import (exists, glob, isdir, isfile, list_files, listdir, open_input, open_random_access,
                                    parquet_dataset, parquet_file, read_bytes, read_json, sha256, size, stat)
from common.storage.retries import (StorageError, first_contact, is_transient, retry_seconds, retrying,
                                    timeout_seconds)
from common.storage.stores import resolve
from common.storage.versions import ABSENT, Version, delete_if, history, read_versioned, write_if
from common.storage.writing import (copy_file, delete, delete_tree, fence_writes, makedirs, open_output,
                                    remove_staged_in_flight, stage_like, staged_in_flight, take_back,
                                    unfence_writes, upload_dir, write_bytes, write_json)

__all__ = ["ABSENT", "PROBE_NAME", "Conflict", "StorageError", "Version", "absolute", "basename", "cache_root", "copy_file",
           "create_new", "delete", "delete_if", "delete_tree", "endpoint_of", "exists", "fence_writes", "first_contact", "glob",
           "has_wildcards", "is_local", "is_transient", "is_url", "isdir", "isfile", "join", "list_files", "listdir",
           "probe_in_flight", "remove_staged_in_flight", "stage_like", "staged_in_flight", "take_back",
           "local_copy", "makedirs", "open_input", "open_output", "open_random_access", "parent", "parquet_dataset",
           "parquet_file", "read_bytes", "read_json", "read_versioned", "history", "resolve", "store_now", "retry_seconds",
           "retrying",
           "sha256", "size", "stat", "timeout_seconds", "unfence_writes", "upload_dir", "write_bytes", "write_if", "write_json"]
