"""Records that change as numbered versions, each created once: no lock, no clock, no replace.

A record that changes (a run's claim, its manifest, a refresh root's ``latest``) is kept as a
sequence of versions beside it, the way Delta Lake keeps ``_delta_log``::

    OUT/_log/00000000000000000001-_manifest.json     version 1 of OUT/_manifest.json
    OUT/_log/00000000000000000002-_manifest.json     version 2: the current one (the highest)
    OUT/_manifest.json                               a copy of the current version, for readers

Version N+1 is created with the store's put-if-absent (common/storage/conditional.py) by a writer
that read version N: of two writers that read N, exactly one creates N+1, on every store,
whatever either believes and however long either was paused; the other gets Conflict. After its
create a writer looks once more: version N must still be there and nothing above N+1 (a writer
paused so long that old versions were removed could otherwise create a number again); if not, its
version is removed and it gets Conflict. A removed record is a version too (empty: a tombstone).

The highest version is the truth. The plain file beside the log is a copy written after the
version (whole: a reader sees one version or the next, never a mix), for readers that open the
name (pyarrow, DuckDB, the documented paths); a writer that finds a newer version after writing
its copy writes the newer one's, so a copy lags the log only while a writer is between the two.
A name without a log (a run of a version of this code that had none) reads as version 0.

Old versions are removed KEEP_VERSIONS behind the newest (a claim's heartbeat makes one each
renewal), or by their owner (retention keeps ``latest``'s versions for --retain hours).
"""
from __future__ import annotations

import contextlib
import re
import uuid
from dataclasses import dataclass, field

from common.storage.conditional import Conflict, create_new, read_stamped
from common.storage.paths import basename, join, parent
from common.storage.reading import listdir
from common.storage.writing import delete, write_bytes

LOG = "_log"
KEEP_VERSIONS = 8
_TOMBSTONE = b"\x00removed "        # + a unique token: a retried create recognises its own (records are JSON)
_VERSION_NAME = re.compile(r"^(\d{20})-(.+)$")


@dataclass(frozen=True)
class Version:
    """Which version of a record a caller read: NUMBER (0: none yet) and MTIME, when the store
    created it, by the store's own clock (None when unknown)."""
    number: int
    mtime: float | None = field(default=None, compare=False)

    @property
    def absent(self) -> bool:
        """True when no version of the record was ever written."""
        return self.number == 0


ABSENT = Version(0)


def log_dir(path: str) -> str:
    """Where the versions of the record PATH are: the folder ``_log`` beside it."""
    return join(parent(path), LOG)


def version_path(path: str, number: int) -> str:
    """Version NUMBER of the record PATH (its name ends with the record's, so a crash point
    ``~_manifest.json`` stops at the version as it did at the file)."""
    return join(log_dir(path), f"{number:020d}-{basename(path)}")


def numbers(path: str) -> list[int]:
    """The version numbers of the record PATH that exist now, in order."""
    name = basename(path)
    found = []
    for entry in listdir(log_dir(path)):
        m = _VERSION_NAME.match(entry)
        if m and m.group(2) == name:
            found.append(int(m.group(1)))
    return sorted(found)


def read_versioned(path: str) -> tuple[bytes | None, Version]:
    """(the current bytes of the record PATH, their version): the highest version, None for the
    bytes when it is a tombstone. A record without a log is read from PATH itself (version 0)."""
    for _ in range(20):
        found = numbers(path)
        if not found:
            data, mtime = read_stamped(path)
            return data, Version(0, mtime)
        data, mtime = read_stamped(version_path(path, found[-1]))
        if data is not None:              # else removed between the listing and the read: list again
            return _record(data), Version(found[-1], mtime)
    raise OSError(f"{path}: its versions kept changing while it was read: retry")


def history(path: str) -> list[tuple[Version, bytes | None]]:
    """Every version of the record PATH still kept, oldest first, with its bytes (None: a tombstone)."""
    out = []
    for number in numbers(path):
        data, mtime = read_stamped(version_path(path, number))
        if data is not None:
            out.append((Version(number, mtime), _record(data)))
    return out


def _record(data: bytes) -> bytes | None:
    return None if data.startswith(_TOMBSTONE) else data


def write_if(path: str, data: bytes | None, expected: Version, copy: bool = True,
             keep: int | None = KEEP_VERSIONS) -> Version:
    """Make DATA (None: a tombstone) the record PATH's next version, only if EXPECTED is still its
    current one: the new version, or Conflict when another writer's version came first (or
    EXPECTED's versions were removed: the folder went with retention). COPY: the plain file PATH
    written (or removed) after. KEEP: versions more than KEEP behind are removed (None: none)."""
    number = expected.number + 1
    mine = version_path(path, number)
    create_new(mine, data if data is not None else _TOMBSTONE + uuid.uuid4().hex.encode(),
               make_dirs=expected.number == 0)
    found = numbers(path)
    if found[-1] != number or (expected.number and expected.number not in found):
        with contextlib.suppress(Exception):
            delete(mine)
        raise Conflict(f"{path}: version {number} is not the newest, or what it followed is gone (another writer "
                       "went on, or the record was removed)")
    if copy:
        _copy(path, number, data)
    if keep:
        forget(path, found, below=number - keep + 1)
    return Version(number)


def delete_if(path: str, expected: Version, copy: bool = True) -> bool:
    """A tombstone as the record PATH's next version, only over EXPECTED: False when another
    writer's version came first."""
    try:
        write_if(path, None, expected, copy)
    except Conflict:
        return False
    return True


def _copy(path: str, number: int, data: bytes | None) -> None:
    """The plain file PATH made the copy of version NUMBER (DATA); if a newer version appeared
    meanwhile (this writer was paused between its version and its copy), the newest's copy."""
    for _ in range(5):
        if data is None:
            delete(path)
        else:
            write_bytes(path, data)
        newest = numbers(path)
        if not newest or newest[-1] <= number:
            return
        number = newest[-1]
        data = _record(read_stamped(version_path(path, number))[0] or _TOMBSTONE)


def repair_copy(path: str) -> bool:
    """The plain file PATH made the copy of the record's newest version again when it is not (a
    writer stopped between its version and its copy): True when it had to be."""
    found = numbers(path)
    if not found:
        return False
    raw = read_stamped(version_path(path, found[-1]))[0]
    if raw is None:
        return False
    data = _record(raw)
    if read_stamped(path)[0] == data:
        return False
    _copy(path, found[-1], data)
    return True


def forget(path: str, found: list[int] | None = None, below: int = 0) -> None:
    """Remove the versions of the record PATH numbered below BELOW (never the newest)."""
    found = numbers(path) if found is None else found
    for number in found[:-1]:
        if number < below:
            with contextlib.suppress(FileNotFoundError):
                delete(version_path(path, number))


__all__ = ["ABSENT", "KEEP_VERSIONS", "LOG", "Version", "delete_if", "forget", "history", "log_dir", "numbers",
           "read_versioned", "repair_copy", "version_path", "write_if"]
