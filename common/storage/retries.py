"""How long a store may take and stay away: timeouts, the retry budget of one operation, which
errors are transient, and one StorageError line naming the store when it gives up."""
from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import threading
import time

from common.settings import env_seconds
from common.storage.paths import endpoint_of, is_local, is_url

log = logging.getLogger("paragen.storage")

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
    return env_seconds("PARAGEN_STORAGE_TIMEOUT", DEFAULT_TIMEOUT, 0.1, 86400, StorageError)


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
    return env_seconds("PARAGEN_STORAGE_RETRY_SECONDS", DEFAULT_RETRY_SECONDS, 0, 86400 * 7, StorageError)


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
# Credentials that could not be had at all (no key, no metadata server, an OAuth2 token refused):
# a store that cannot be asked, said at once in a check phase, not retried as if it were away.
_NO_CREDENTIALS = re.compile(r"OAuth2|[Aa]ccess token|NoCredentials|[Uu]nable to locate credentials|"
                             r"[Cc]ould not (load|find) (the )?default credentials|[Mm]etadata server")
_FIRST_CONTACT = [0]            # > 0 inside first_contact(): a store never answered gets no retry budget
DEFAULT_FIRST_CONTACT_SECONDS = 25.0    # a check phase waits this long for a store's first answer, all tries together


def first_contact_seconds() -> float:
    """How long a check phase waits for a store's first answer, all tries together:
    $PARAGEN_FIRST_CONTACT_SECONDS (default 25; 1-3600)."""
    return env_seconds("PARAGEN_FIRST_CONTACT_SECONDS", DEFAULT_FIRST_CONTACT_SECONDS, 1, 3600, StorageError)


@contextlib.contextmanager
def first_contact():
    """A job's check phase: a store that has not answered in this process yet is most likely a
    mistake (an endpoint, a network, credentials, a host name), said in one line before anything
    is written: a connection that cannot be made or credentials that cannot be had fail at once,
    anything else is retried for first_contact_seconds() at most, all tries together (one try that
    hangs too: a blackholed route). A store that answered once in this run keeps the whole budget
    for when it goes away later."""
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
    first = bool(_FIRST_CONTACT[0]) and store not in _ANSWERED
    started, limit = time.monotonic(), first_contact_seconds() if _FIRST_CONTACT[0] else 0.0
    while True:
        try:
            with _explained(path):
                result = _within(started + limit, path, fn, *args, **kwargs) if first \
                    else fn(*args, **kwargs)
            _AWAY.discard(store)
            _ANSWERED.add(store)
            return result
        except StorageError as exc:
            if not exc.transient:
                raise
            detail = exc.detail or str(exc)
            if first and (_NO_CONNECTION.search(detail) or _NO_CREDENTIALS.search(detail)
                          or time.monotonic() >= started + limit):
                raise StorageError(f"{exc}; it never answered in this run (not retried before anything is written: "
                                   "check the endpoint, the network and the credentials)") from None
            now = time.monotonic()
            # a store that already stayed away past the budget in this process is tried once more,
            # not waited for again: the job's last steps (its claim, its error log) end in seconds
            budget = 0.0 if store in _AWAY else retry_seconds()
            if first:
                budget = min(budget, started + limit - now)
            deadline = deadline if deadline is not None else now + budget
            if now >= deadline:          # the whole budget waited: the line's "retried for" is true
                _AWAY.add(store)
                raise StorageError(f"{exc}; retried for {retry_seconds():g}s (PARAGEN_STORAGE_RETRY_SECONDS)",
                                   transient=True) from None
            _RETRY_LOG.note(path, exc.detail)
            time.sleep(min(delay * random.uniform(0.5, 1.0), deadline - now))     # never past the deadline
            delay = min(delay * 2, _RETRY_MAX_S)


_ABANDONED: list = []           # first-contact calls given up on, perhaps still waiting inside a client library


def abandoned_calls() -> bool:
    """True while a call given up on is still running: the process should exit without waiting
    for it (common/cli.py)."""
    return any(t.is_alive() for t in _ABANDONED)


def _within(deadline: float, path: str, fn, *args, **kwargs):
    """FN(*ARGS, **KWARGS) if it returns before the monotonic DEADLINE; else a transient
    StorageError (the call goes on in a daemon thread the job's exit ends: a client library's own
    retries and timeouts cannot be cut short from outside)."""
    import threading

    out: list = []

    def call():
        try:
            out.append((True, fn(*args, **kwargs)))
        except BaseException as exc:  # noqa: BLE001: handed to the caller's thread
            out.append((False, exc))
    worker = threading.Thread(target=call, name="paragen-first-contact", daemon=True)
    worker.start()
    worker.join(max(0.0, deadline - time.monotonic()))
    if not out:
        _ABANDONED.append(worker)
        raise StorageError(f"{path}: the store at {endpoint_of(path)} did not answer within "
                           f"{first_contact_seconds():g}s (PARAGEN_FIRST_CONTACT_SECONDS){_credentials_hint(path)}",
                           transient=True, detail="no answer")
    ok, value = out[0]
    if not ok:
        raise value
    return value


def _credentials_hint(path: str) -> str:
    """Where PATH's store would take credentials from, when nothing obvious is set (a client that
    cannot get a token retries inside itself without a word)."""
    scheme = path.split("://", 1)[0].lower()
    if scheme in ("gs", "gcs") and not (os.environ.get("GOOGLE_APPLICATION_CREDENTIALS") or
                                        os.environ.get("STORAGE_EMULATOR_HOST")):
        return (" (no GOOGLE_APPLICATION_CREDENTIALS and no STORAGE_EMULATOR_HOST: Google's default credentials, "
                "from gcloud or a metadata server, were tried)")
    if scheme == "s3" and not (os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get("AWS_PROFILE")):
        return " (no AWS_ACCESS_KEY_ID and no AWS_PROFILE: AWS's default credential chain was tried)"
    return ""


@contextlib.contextmanager
def _explained(path: str):
    """Turn what a remote store raises for PATH (a network error, a timeout) into one
    StorageError line naming the endpoint. FileNotFoundError, PermissionError and local paths
    pass as they are."""
    try:
        yield
    except (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError, StorageError):
        raise                       # FileExistsError: a conditional write refused (conditional.Conflict)
    except OSError as exc:
        if not is_url(path) or is_local(path):
            raise
        detail = _first_line(exc)
        if not is_transient(exc):
            raise StorageError(f"{path}: the store at {endpoint_of(path)} refused ({detail})", detail=detail) from None
        raise StorageError(f"{path}: the store at {endpoint_of(path)} did not answer or refused "
                           f"({detail}); timeout {timeout_seconds():g}s (PARAGEN_STORAGE_TIMEOUT)",
                           transient=True, detail=detail) from None
