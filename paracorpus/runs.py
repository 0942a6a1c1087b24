"""Finding the rows a downstream job reads: a committed run's files, or plain Parquet.

The filter and embedding jobs (and the lexicon) take a path that is one of

* a generation run (``OUT`` with ``_manifest.json``, or its ``paraphrases/``): the paraphrase files
  its manifest lists;
* a filter run (``OUT`` with ``_filter_manifest.json``, or its ``scored/``): the scored files;
* any other Parquet file or directory (every ``*.parquet`` under it): data of the user's own.

A run directory without its manifest (an unfinished or failed run) is refused: its files are not
a committed corpus.
"""
from __future__ import annotations

from dataclasses import dataclass

from common import storage
from common.cli import UsageError
from common.storage.versions import LOG
from paracorpus.commit import WORK, committed_files
from paracorpus.schema import FILTER_MANIFEST, MANIFEST, table_relative

_RUN_TABLES = ((MANIFEST, "paraphrases"), (FILTER_MANIFEST, "scored"))


@dataclass(frozen=True)
class ParquetInput:
    path: str                    # what the user gave
    root: str                    # the table's root: OUT/paraphrases, OUT/scored, or the plain directory
    files: tuple                 # full paths (or URLs) of the Parquet files to read, sorted
    manifest: dict | None        # the run's manifest, or None for plain Parquet
    kind: str                    # "generation", "filter" or "parquet"
    relatives: tuple = ()        # each file's path inside its table (what a job mirrors in its output)


def _run_dir(path: str) -> tuple[str, str, str] | None:
    """(run directory, manifest name, table) when PATH is a run or a run's table directory."""
    for manifest, table in _RUN_TABLES:
        if storage.isfile(storage.join(path, manifest)):
            return path, manifest, table
        if storage.basename(path) == table and storage.isfile(storage.join(storage.parent(path), manifest)):
            return storage.parent(path), manifest, table
    return None


def open_input(path: str) -> ParquetInput:
    """The Parquet files PATH stands for (see the module doc). FileNotFoundError when there are
    none, UsageError for an unfinished run."""
    path = storage.absolute(path.rstrip("/")) if path not in ("/", "") else path
    found = _run_dir(path)
    if found:
        run, manifest_name, table = found
        manifest = storage.read_json(storage.join(run, manifest_name))
        files = tuple(committed_files(run, table, manifest_name))
        relatives = tuple(table_relative(f["path"], table) for f in manifest.get("files", {}).get(table, []))
        return ParquetInput(path, storage.join(run, table), files, manifest,
                            "generation" if manifest_name == MANIFEST else "filter", relatives)
    if storage.isfile(path):
        if not path.endswith(".parquet"):
            raise UsageError(f"{path}: not a Parquet file (expected a run directory or .parquet)")
        return ParquetInput(path, storage.parent(path), (path,), None, "parquet", (storage.basename(path),))
    if not storage.isdir(path):
        raise FileNotFoundError(f"{path}: no such file or directory")
    names = storage.listdir(path)
    if any(n in names for n in ("paraphrases", "scored", WORK, LOG)):
        raise UsageError(f"{path}: a run without its manifest (unfinished, failed or still running): "
                         "its files are not a committed corpus")
    files = tuple(p for p in storage.list_files(path) if p.endswith(".parquet")
                  and not any(part.startswith((".", "_")) for part in p[len(path) + 1:].split("/")))
    if not files:
        raise FileNotFoundError(f"{path}: no Parquet files")
    return ParquetInput(path, path, files, None, "parquet", tuple(f[len(path) + 1:] for f in files))
