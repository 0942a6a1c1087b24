"""What every command-line entry point shares: one-line errors, logging that shows progress,
checks of output locations, and the versions a run records.

A mistake (a bad option, a missing file, a refused model) is reported as one line on stderr and
exit status 2 before anything is written; a traceback is only shown with PARAGEN_DEBUG=1. A job
that ran but published nothing says why in one line too, with its own exit status (JobFailed:
3 when every record was rejected or none was read, 1 when its counts do not reconcile).
"""
from __future__ import annotations

import errno
import logging
import os
import pickle
import sys
from typing import Callable

from common.storage import StorageError

EXIT_USAGE = 2
EXIT_EMPTY = 3      # the job ran, but its output has no row: every record rejected, or none read
EXIT_STORE_AWAY = 1  # a store that answered before stayed away past PARAGEN_STORAGE_RETRY_SECONDS: retry later
EXIT_BUSY = 75      # EX_TEMPFAIL: the output is being written by another live run; try again later


class UsageError(ValueError):
    """A mistake in how a command was called or in what it was given: one line, exit status 2."""


class JobFailed(Exception):
    """A job that ran and did not publish (or a refresh whose job failed): one line, and the exit
    status CODE, so that a scheduler can tell it from a usage mistake."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


class OutputBusy(JobFailed):
    """The output is claimed by another run that is alive (or was, less than its heartbeat's
    staleness ago): not a mistake, a condition that passes. Exit status EXIT_BUSY (75), so a
    scheduler that retries (a Kubernetes Job, a SLURM requeue) tries again later, by which time a
    dead holder's claim has gone stale and the same command takes over."""

    def __init__(self, message: str):
        super().__init__(message, EXIT_BUSY)


# Mistakes of the caller, not bugs: UsageError (and its subclasses, e.g. a refused model or a bad
# --where clause), the file errors a wrong path gives, and a store that refused or never answered
# in this run (a wrong endpoint or credentials). A store that answered before and then stayed away
# past its retry budget is not a mistake: exit 1, which a Kubernetes Job retries (_cli_main).
USER_ERRORS = (UsageError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError,
               FileExistsError, pickle.UnpicklingError, StorageError)


_DEPTH = [0]                # cli_main calls in progress (a refresh runs its jobs through it too)


def cli_main(run: Callable[[list[str]], object], argv: list[str] | None = None) -> int:
    """Run RUN(argv); a user error becomes 'error: ...' on stderr and exit status 2. A call to a
    store that never answered, still hanging in a thread (common/storage/retries.py), would hold
    the interpreter's exit (pyarrow waits for it): the outermost call then ends the process itself."""
    _DEPTH[0] += 1
    try:
        code = _cli_main(run, argv)
    finally:
        _DEPTH[0] -= 1
    from common.storage.retries import abandoned_calls

    if _DEPTH[0] == 0 and abandoned_calls():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _cli_main(run: Callable[[list[str]], object], argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        result = run(argv)
    except StorageError as exc:
        return _error(exc, EXIT_STORE_AWAY if exc.transient else EXIT_USAGE)
    except USER_ERRORS as exc:
        return _error(exc, EXIT_USAGE)
    except OSError as exc:
        if exc.errno not in DISK_ERRORS or os.environ.get("PARAGEN_DEBUG"):
            raise
        # a full disk or a failing one while the driver plans or commits (a worker's is said by
        # the pipeline's failure line): one line, not a traceback; the committed run is untouched
        print(f"error: {disk_error(exc.errno, exc.filename)}", file=sys.stderr, flush=True)
        return 1
    except JobFailed as exc:
        return _error(exc, exc.code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return 130
    return result if isinstance(result, int) else 0


DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS)


def disk_error(number: int, filename: str | None) -> str:
    """'PATH: No space left on device (ENOSPC)': a disk error in words, with its errno's name."""
    name = errno.errorcode.get(number, str(number))
    return f"{filename + ': ' if filename else ''}{os.strerror(number)} ({name})"


def _error(exc: Exception, code: int) -> int:
    """EXC as one 'error: ...' line on stderr, and CODE; with PARAGEN_DEBUG=1 the traceback."""
    if os.environ.get("PARAGEN_DEBUG"):
        raise exc
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, JobFailed):
        message = str(exc)
    elif isinstance(exc, (FileNotFoundError, PermissionError, NotADirectoryError, IsADirectoryError,
                        FileExistsError)) and exc.filename and exc.strerror:
        message = f"{exc.filename}: {exc.strerror}"
    print(f"error: {message}", file=sys.stderr, flush=True)
    return code


class _DropBeamImportNoise(logging.Filter):
    """Drops the warning apache_beam logs on every import when Google's apitools is absent (it is
    only needed for BigQuery, which the jobs do not use): users read it as a fault."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "apitools not found" not in str(record.msg)


def quiet_beam_import() -> None:
    """Install the filter above on the root logger, once, before apache_beam is imported."""
    root = logging.getLogger()
    if not any(isinstance(f, _DropBeamImportNoise) for f in root.filters):
        root.addFilter(_DropBeamImportNoise())


def configure_logging(level: int = logging.INFO, quiet: tuple = ("apache_beam", "fairseq", "distributed")) -> None:
    """INFO lines with timestamps on stderr. force=True: importing Beam already logged a warning,
    which configured the root logger at WARNING, so a plain basicConfig() would be ignored and no
    progress line would show in the in-memory DirectRunner."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    for name in quiet:
        logging.getLogger(name).setLevel(logging.WARNING)


def _comparable(path: str) -> str:
    """PATH as a string that contains another path's exactly when the directory does: local paths
    absolute with symbolic links resolved, URLs lower-cased in their scheme, without a trailing /."""
    from common import storage

    if storage.is_local(path):
        local = storage.resolve(path)[1] if storage.is_url(path) else path
        return os.path.realpath(local)
    scheme, rest = path.split("://", 1)
    return f"{scheme.lower()}://{rest.rstrip('/')}"


def check_apart(output: str, input_: str, output_option: str = "--output", input_option: str = "--input") -> None:
    """Refuse (UsageError) an OUTPUT directory equal to, inside or around the INPUT a job reads:
    two jobs' files in one directory, which a retention or a refresh of one would delete with the
    other's."""
    out, inp = _comparable(output), _comparable(input_)
    sep = "/" if "://" in out else os.sep
    if out == inp:
        where = "is"
    elif out.startswith(inp.rstrip(sep) + sep):
        where = "is inside"
    elif inp.startswith(out.rstrip(sep) + sep):
        where = "contains"
    else:
        return
    raise UsageError(f"{output_option} {output} {where} {input_option} {input_}, the data this job reads: give the "
                     "output a directory of its own (two jobs' files in one directory are deleted together by a "
                     "retention or refresh of either)")


def check_output_location(path: str, option: str = "--output") -> str:
    """PATH (absolute, or the URL unchanged), after checking a directory can be created (or exists)
    there: no existing ancestor is a file, and the nearest existing one is writable; for a URL,
    that its bucket can be listed. Raises UsageError."""
    from common import storage

    if storage.is_url(path) and not storage.is_local(path):
        if path.split("://", 1)[0].lower() in ("hdfs", "viewfs"):
            print(f"warning: {option} {path}: on HDFS a manifest is replaced by two renames, so a reader can find it "
                  "absent for that instant (docs/operations.md: which store gives which guarantee)", file=sys.stderr,
                  flush=True)
        bucket = path.split("://", 1)[0] + "://" + path.split("://", 1)[1].split("/", 1)[0]
        try:
            found = storage.isdir(bucket)
        except storage.StorageError as exc:
            raise UsageError(f"{option} {exc}") from None
        except OSError as exc:
            raise UsageError(f"{option} {path}: cannot reach {bucket} ({str(exc).splitlines()[0]})") from None
        if not found:
            raise UsageError(f"{option} {path}: bucket {bucket} does not exist (or is not visible with these credentials)")
        if storage.isfile(path):
            raise UsageError(f"{option} {path} is a file, not a directory")
        return path.rstrip("/")
    path = storage.resolve(path)[1]
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{option} {path} is a file, not a directory")
    parent = path
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise UsageError(f"{option} {path} cannot be created: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path} cannot be created: {parent} is not writable")
    return path


def versions() -> dict:
    """Versions of the packages that decide a run's output, for its manifest."""
    from importlib import metadata

    out = {"python": sys.version.split()[0]}
    for dist, key in (("paragen", "paragen"), ("apache-beam", "beam"), ("torch", "torch"),
                      ("fairseq-fixed", "fairseq"), ("sentencepiece", "sentencepiece"), ("pyarrow", "pyarrow")):
        try:
            out[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[key] = None
    return out


def command_line(argv: list[str]) -> list[str]:
    """The program and ARGV as they were given (recorded in manifests)."""
    return [os.path.basename(sys.argv[0]) or "python", *argv]


def option_value(args: list[str], name: str) -> str | None:
    """The value of option NAME in ARGS ('NAME VALUE' or 'NAME=VALUE'), or None."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None
