"""Input shards: find them, hash them, and read them record by record without trusting the bytes.

Three input formats, all yielding :class:`RawRecord` in file order:

* ``tsv``: ``src<TAB>tgt`` lines, plain or compressed (``.gz``, ``.bz2``, ``.xz``, ``.zst``);
* ``moses``: two line-aligned files ``PREFIX.<src_lang>[.gz|...]`` and ``PREFIX.<tgt_lang>[.gz|...]``;
* ``parquet``: a Parquet file with two string columns.

A record that cannot be decoded is still yielded, with ``error`` set, so that it lands in the
rejects table instead of disappearing.
"""
from __future__ import annotations

import bz2
import gzip
import io
import lzma
from dataclasses import dataclass
from typing import Iterator

from common import storage
from common.cli import UsageError
from common.names import check_lang_code, check_path_component

DEFAULT_MAX_LINE_CHARS = 20_000
MIN_LINE_CHARS = 3               # 'a<TAB>b': a smaller --max_line_chars rejects every record
SNIPPET_CHARS = 1000           # of an overlong record kept for its reject row (enough to find it)
_READ_CHUNK = 1 << 16


@dataclass(frozen=True)
class ShardSpec:
    format: str          # tsv | moses | parquet (the manifest's read records call it "kind")
    paths: tuple         # one path, or (src_path, tgt_path) for moses
    name: str            # stable name used in pair ids (file name, not the full path)


@dataclass(frozen=True)
class RawRecord:
    shard: str
    index: int
    source: str | None            # the foreign side (None when unreadable)
    reference: str | None         # the English side
    error: str | None = None      # a reject reason from schema.REJECT_REASONS
    detail: str | None = None


COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")


def open_binary(path: str, digest=None):
    """PATH (a local path or a URL) opened for reading bytes, decompressed by its suffix (.gz,
    .bz2, .xz, .zst). With DIGEST (a hashlib object), the stored bytes are hashed as they are read."""
    raw = storage.open_input(path)
    return _decompressed(io.BufferedReader(_Tap(raw, digest), 1 << 20) if digest is not None else raw, path)


class _Tap(io.RawIOBase):
    """A read-only stream over RAW that counts the bytes read and feeds them to DIGEST (if any)."""

    def __init__(self, raw, digest=None):
        self.raw, self.digest, self.bytes = raw, digest, 0

    def readable(self):
        return True

    def readinto(self, buffer) -> int:
        data = self.raw.read(len(buffer))
        buffer[:len(data)] = data
        if self.digest is not None:
            self.digest.update(data)
        self.bytes += len(data)
        return len(data)

    def close(self):
        self.raw.close()
        super().close()


def _decompressed(raw, name: str):
    if name.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw)
    if name.endswith(".bz2"):
        return bz2.BZ2File(raw)
    if name.endswith(".xz"):
        return lzma.LZMAFile(raw)
    if name.endswith(".zst"):
        return io.BufferedReader(_ZstdStream(raw), 1 << 20)
    return raw


class _ZstdStream(io.RawIOBase):
    """A .zst stream read frame after frame, which raises EOFError when the bytes end inside a
    frame, as gzip, bz2 and lzma do (zstandard's stream_reader returns what it decoded and stops
    without a word, so a truncated shard would lose its tail silently)."""

    def __init__(self, raw):
        import zstandard

        self.raw, self._dctx, self._frame = raw, zstandard.ZstdDecompressor(), None
        self._out, self._at = b"", 0

    def readable(self):
        return True

    def readinto(self, buffer) -> int:
        while self._at >= len(self._out):
            data = b""
            if self._frame is not None and self._frame.eof:
                data, self._frame = self._frame.unused_data, None
            if not data:
                data = self.raw.read(1 << 16)
                if not data:
                    if self._frame is not None:
                        raise EOFError("Compressed file ended before the end of its zstd frame")
                    return 0
            if self._frame is None:
                self._frame = self._dctx.decompressobj()
            self._out, self._at = self._frame.decompress(data), 0
        n = min(len(buffer), len(self._out) - self._at)
        buffer[:n] = self._out[self._at:self._at + n]
        self._at += n
        return n

    def close(self):
        self.raw.close()
        super().close()


def estimate_records(shards: list["ShardSpec"], sample_bytes: int = 4 << 20,
                     max_sampled: int = 16) -> tuple[dict[str, int], bool]:
    """({shard name: records}, exact?) without reading the shards through (for planning work
    units and for progress lines). Parquet: row counts from the footers. Text: the newlines in
    the first SAMPLE_BYTES (decompressed) of up to MAX_SAMPLED shards; a shard read whole is
    exact, the others are estimated at the sampled records per stored byte, times their size."""
    counts: dict[str, int] = {}
    sizes: dict[str, int] = {}
    exact = True
    lines = consumed = 0
    for i, spec in enumerate(shards):
        if spec.format == "parquet":
            counts[spec.name] = _parquet_file(spec.paths[0]).metadata.num_rows
            continue
        path = spec.paths[0]
        if i >= max_sampled:
            sizes[spec.name] = storage.size(path)
            continue
        data, broken = b"", False
        with storage.open_input(path) as raw:
            tap = _Tap(raw)
            stream = _decompressed(io.BufferedReader(tap, 1 << 20), path)
            try:
                while len(data) < sample_bytes:
                    chunk = stream.read(min(1 << 16, sample_bytes - len(data)))
                    if not chunk:
                        break
                    data += chunk
            except Exception:  # noqa: BLE001: a corrupt shard is the readers' business; this is an estimate
                broken = True
            read = tap.bytes
        n = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
        if len(data) < sample_bytes:          # read whole (or up to where it breaks)
            counts[spec.name] = n
            exact = exact and not broken
            continue
        lines, consumed = lines + n, consumed + read
        sizes[spec.name] = storage.size(path)
    per_byte = lines / consumed if consumed else (
        sum(counts.values()) / max(1, sum(shard_size(s) for s in shards if s.name in counts)))
    for name, size in sizes.items():
        counts[name] = int(size * per_byte)
        exact = False
    return counts, exact


def bounded_lines(stream, max_bytes: int) -> Iterator[tuple[bytes, bool]]:
    """Yield (line without newline, overlong) without ever holding more than max_bytes of a line.

    A hostile file may contain one multi-gigabyte line; its tail is read and dropped in chunks.
    """
    while True:
        line = stream.readline(max_bytes + 1)
        if not line:
            return
        if line.endswith(b"\n"):
            yield line[:-1].rstrip(b"\r"), False
            continue
        if len(line) <= max_bytes:     # last line of the file, no newline
            yield line.rstrip(b"\r"), False
            return
        while True:                    # skip the rest of an overlong line
            rest = stream.readline(_READ_CHUNK)
            if not rest or rest.endswith(b"\n"):
                break
        yield line[:max_bytes], True


def _decode(data: bytes) -> tuple[str | None, str | None]:
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return None, f"invalid UTF-8 at byte {exc.start}"


def _snippet(data: bytes, limit: int = 1000) -> str:
    return data[:limit].decode("utf-8", errors="replace")


def _read_tsv(spec: ShardSpec, max_line_chars: int, digests: list) -> Iterator[RawRecord]:
    # Characters are at most 4 UTF-8 bytes; the exact character limit is checked after decoding.
    with open_binary(spec.paths[0], digests[0]) as stream:
        for index, (line, overlong) in enumerate(bounded_lines(stream, 4 * max_line_chars)):
            if overlong:
                yield RawRecord(spec.name, index, _snippet(line), None, "overlong_line",
                                f"line longer than {4 * max_line_chars} bytes")
                continue
            text, err = _decode(line)
            if text is None:
                yield RawRecord(spec.name, index, _snippet(line), None, "bad_utf8", err)
                continue
            if len(text) > max_line_chars:
                yield RawRecord(spec.name, index, text[:SNIPPET_CHARS], None, "overlong_line",
                                f"{len(text)} characters > {max_line_chars}")
                continue
            cells = text.split("\t")
            if len(cells) < 2:
                yield RawRecord(spec.name, index, text, None, "missing_column", "no tab in line")
            elif len(cells) > 2:
                yield RawRecord(spec.name, index, cells[0], cells[1], "extra_column",
                                f"{len(cells)} columns")
            else:
                yield RawRecord(spec.name, index, cells[0], cells[1])


def _read_moses(spec: ShardSpec, max_line_chars: int, digests: list) -> Iterator[RawRecord]:
    src_path, tgt_path = spec.paths
    limit = 4 * max_line_chars
    with open_binary(src_path, digests[0]) as fs, open_binary(tgt_path, digests[1]) as ft:
        src_lines, tgt_lines = bounded_lines(fs, limit), bounded_lines(ft, limit)
        index = 0
        while True:
            s, t = next(src_lines, None), next(tgt_lines, None)
            if s is None and t is None:
                return
            if s is None or t is None:
                present = s if s is not None else t
                side = "source" if s is None else "target"
                yield RawRecord(spec.name, index, _snippet(present[0]) if s else None,
                                _snippet(present[0]) if t else None, "missing_column",
                                f"{side} file ended before line {index}")
                index += 1
                continue
            yield _pair_from_cells(spec.name, index, s, t, max_line_chars)
            index += 1


def _pair_from_cells(name, index, s, t, max_line_chars) -> RawRecord:
    (sb, s_over), (tb, t_over) = s, t
    if s_over or t_over:
        return RawRecord(name, index, _snippet(sb), _snippet(tb), "overlong_line",
                         f"line longer than {4 * max_line_chars} bytes")
    src, e1 = _decode(sb)
    tgt, e2 = _decode(tb)
    if src is None or tgt is None:
        return RawRecord(name, index, src if src is not None else _snippet(sb),
                         tgt if tgt is not None else _snippet(tb), "bad_utf8", e1 or e2)
    if max(len(src), len(tgt)) > max_line_chars:
        return RawRecord(name, index, src[:SNIPPET_CHARS], tgt[:SNIPPET_CHARS], "overlong_line",
                         f"{max(len(src), len(tgt))} characters > {max_line_chars}")
    return RawRecord(name, index, src, tgt)


def _read_parquet(spec: ShardSpec, max_line_chars: int, src_column: str, tgt_column: str,
                  batch_size: int = 8192) -> Iterator[RawRecord]:
    pf = _parquet_file(spec.paths[0])
    _check_parquet_columns(spec.paths[0], pf.schema_arrow, src_column, tgt_column)
    index = 0
    # Read as binary so that invalid UTF-8 in a cell becomes a reject, not a crash of the reader.
    for batch in pf.iter_batches(batch_size=batch_size, columns=[src_column, tgt_column]):
        for s, t in zip(*(_as_bytes(batch.column(i)) for i in range(2))):
            if s is None or t is None:
                yield RawRecord(spec.name, index, None if s is None else _snippet(s),
                                None if t is None else _snippet(t), "missing_column", "null cell")
            else:
                yield _pair_from_cells(spec.name, index, (s, False), (t, False), max_line_chars)
            index += 1


def _parquet_file(path: str):
    import pyarrow.parquet as pq

    return pq.ParquetFile(storage.open_random_access(path))


def _check_parquet_columns(path: str, schema, src_column: str, tgt_column: str) -> None:
    import pyarrow as pa

    missing = [c for c in (src_column, tgt_column) if c not in schema.names]
    if missing:
        raise ShardError(f"{path}: Parquet shard lacks column(s) {missing}; "
                         f"has {sorted(schema.names)} (set --src_column/--tgt_column)")
    for c in (src_column, tgt_column):
        t = schema.field(c).type
        if not any(check(t) for check in (pa.types.is_string, pa.types.is_large_string,
                                          pa.types.is_binary, pa.types.is_large_binary)):
            raise ShardError(f"{path}: column {c!r} is {t}, not text (string or binary)")


def _as_bytes(column) -> list:
    import pyarrow as pa

    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.view(pa.binary() if pa.types.is_string(column.type) else pa.large_binary())
    return column.to_pylist()


def read_shard(spec: ShardSpec, max_line_chars: int = DEFAULT_MAX_LINE_CHARS,
               src_column: str = "src", tgt_column: str = "tgt", digests: list | None = None) -> Iterator[RawRecord]:
    """The records of SPEC in file order. If the file cannot be read to its end (a truncated or
    corrupt compressed stream, a damaged Parquet page), the records read so far are kept and one
    last record with error 'read_error' stands for the rest of the shard. DIGESTS (one hashlib
    object per path of a text shard) are fed the stored bytes as they are read."""
    digests = digests or [None] * len(spec.paths)
    if spec.format == "tsv":
        records = _read_tsv(spec, max_line_chars, digests)
    elif spec.format == "moses":
        records = _read_moses(spec, max_line_chars, digests)
    elif spec.format == "parquet":
        records = _read_parquet(spec, max_line_chars, src_column, tgt_column)
    else:
        raise ValueError(f"unknown shard format {spec.format!r}")
    return _stop_at_read_error(spec, records)


def _stop_at_read_error(spec: ShardSpec, records: Iterator[RawRecord]) -> Iterator[RawRecord]:
    index = 0
    try:
        for rec in records:
            index = rec.index + 1
            yield rec
    except ShardError:
        raise                     # a shard that is wrong as a whole (e.g. its schema): the driver checks these
    except Exception as exc:      # noqa: BLE001: whatever the decompressor or Parquet reader raises
        detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        yield RawRecord(spec.name, index, None, None, "read_error",
                        f"cannot read the shard past record {index} ({detail[:300]}); earlier records kept")


class ShardError(UsageError):
    """An input shard that cannot be read at all (does not open, wrong Parquet columns)."""


def check_shard(spec: ShardSpec, src_column: str = "src", tgt_column: str = "tgt") -> None:
    """What can be checked of SPEC without reading it through, before a job writes anything: each
    file opens and its first bytes decompress; a Parquet shard's footer and text columns are
    valid. Raises ShardError."""
    for path in spec.paths:
        try:
            if spec.format == "parquet":
                _check_parquet_columns(path, _parquet_file(path).schema_arrow, src_column, tgt_column)
            else:
                with open_binary(path) as f:       # the head only: a shard may be gigabytes
                    try:
                        f.read(1024)
                    except EOFError:
                        # a compressed stream cut short: its readable records are kept and the
                        # rest becomes a read_error reject when it is read, however short it is
                        pass
        except ShardError:
            raise
        except Exception as exc:  # noqa: BLE001: any failure to open is reported the same way
            raise ShardError(f"input shard {path} cannot be read: {type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''}") from None


def _strip_compression(path: str) -> str:
    for suffix in COMPRESSED_SUFFIXES:
        if path.endswith(suffix):
            return path[:-len(suffix)]
    return path


def _existing(base: str) -> str | None:
    """BASE or BASE with a compression suffix, whichever exists first."""
    return next((p for p in (base, *(base + s for s in COMPRESSED_SUFFIXES)) if storage.isfile(p)), None)


def discover_shards(inputs: list[str], src_lang: str, tgt_lang: str) -> list[ShardSpec]:
    """Expand --input values (files, globs, directories, Moses prefixes) into sorted shard specs.
    SRC_LANG and TGT_LANG must be checked language codes (common.names): they become parts
    of the Moses file names looked for.

    ``X.<src_lang>[.gz]`` with a twin ``X.<tgt_lang>[.gz]`` becomes one Moses shard; ``*.parquet``
    is Parquet; anything else is TSV.
    """
    check_lang_code(src_lang, "--src_lang")
    check_lang_code(tgt_lang, "--tgt_lang")
    paths: list[str] = []
    for item in inputs:
        # every --input must stand for at least one file: one that yields nothing is a mistake
        # whether it is given alone or beside others
        if storage.has_wildcards(item):
            found = storage.glob(item)
            if not found:
                raise FileNotFoundError(f"input {item!r}: the pattern matches no file")
        elif storage.isdir(item):
            found = [p for p in storage.list_files(item, recursive=False)
                     if not storage.basename(p).startswith((".", "_"))]
            if not found:
                raise FileNotFoundError(f"input {item!r}: a directory with no input shard directly in it "
                                        "(subdirectories are not read; a run's output is not bitext)")
        elif storage.isfile(item):
            found = [item]
        else:
            # A Moses prefix: corpus -> corpus.cs + corpus.en (optionally gzipped).
            prefix = _existing(f"{item}.{src_lang}")
            if not prefix:
                raise FileNotFoundError(f"input {item!r} matches no file, glob, directory or "
                                        f"Moses prefix ({item}.{src_lang}[.gz|.bz2|.xz|.zst])")
            found = [prefix]
        paths += found
    specs, seen = [], set()
    for path in paths:
        path = storage.absolute(path)
        if path in seen:
            continue
        base = _strip_compression(path)
        if base.endswith(f".{src_lang}") or base.endswith(f".{tgt_lang}"):
            prefix = base.rsplit(".", 1)[0]
            twins = []
            for lang in (src_lang, tgt_lang):
                twins.append(_existing(f"{prefix}.{lang}"))
            if twins[0] and twins[1]:
                seen.update(twins)
                specs.append(ShardSpec("moses", tuple(twins), storage.basename(prefix)))
                continue
            if base.endswith(f".{tgt_lang}"):
                raise FileNotFoundError(f"{path}: Moses file without its {src_lang} twin")
            raise FileNotFoundError(f"{path}: Moses file without its {tgt_lang} twin")
        seen.add(path)
        fmt = "parquet" if base.endswith(".parquet") else "tsv"
        specs.append(ShardSpec(fmt, (path,), storage.basename(path)))
    for spec in specs:        # the name goes into pair ids, reject rows and _counts/<name>.json
        check_path_component(spec.name, "input shard name")
    names = [s.name for s in specs]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ValueError(f"input shards must have distinct file names (they seed pair ids): {sorted(dupes)}")
    return sorted(specs, key=lambda s: s.name)


def shard_size(spec: ShardSpec) -> int:
    return sum(storage.size(p) for p in spec.paths)


def shard_identity(spec: ShardSpec) -> list[list]:
    """What tells this shard's files from others of the same names: each file's size and
    modification time (a local file's mtime, an object's last-modified time: a rewrite changes
    it, even to the same size). One metadata request a file, no read."""
    return [list(storage.stat(p)) for p in spec.paths]


__all__ = ["ShardSpec", "ShardError", "RawRecord", "read_shard", "check_shard", "discover_shards", "estimate_records",
           "shard_identity", "shard_size"]
