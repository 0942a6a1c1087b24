"""How a job stops when it is told to, or when its pipeline fails: within a grace period, its
worker processes with it, in one line, with what was committed kept for the same command to
continue.

Clusters stop work all the time: a preempted VM or a drained node gets SIGTERM and, 30 s later by
default (Kubernetes' terminationGracePeriodSeconds, GCE Spot, SLURM's KillWait), SIGKILL; the
scheduler then runs the same command again. ``Stopping`` turns SIGTERM and SIGINT into that
contract: the job stops taking work at once (a unit being decoded is dropped, never committed:
its completion record was not written), stops its worker processes (the DirectRunner's
multi_processing workers would otherwise live on, holding a GPU), releases its claim on the
output once they have stopped, says in one line how far it got and exits with 128 + the signal
number, all within ``GRACE_SECONDS`` whatever it was doing: a hard deadline ends the process if a
step hangs. A
commit in progress (the manifest being written) finishes first.

``pipeline_failure`` turns what a failed pipeline raised into one line saying what happened (a
worker process that died, a full disk, an I/O error, a store that stayed away); the traceback
goes to a file in the run's _work directory instead of the terminal.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
import traceback

from common import storage
from common.cli import DISK_ERRORS, JobFailed, disk_error

log = logging.getLogger("paragen")
GRACE_SECONDS = 20.0         # from the signal to the exit, at most (Kubernetes' default grace is 30 s)
DEVICE_FAILURE_EXIT = 70     # a worker's device failed (models/nmt/devices.py DeviceFailure; EX_SOFTWARE)
_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_ACTIVE: list = []           # the Stopping contexts entered in this process, outermost first
_OTHERS: set = set()         # processes this one had started before the job began: not the job's


_ENDING = threading.Lock()
_AT_END: list = []           # what else a stop undoes (worker jobs a SLURM run submitted)


def at_end(fn) -> None:
    """FN() runs when a stop ends this process (after the claim is released, before the line),
    once, bounded by the grace period; registering the same function twice runs it once."""
    if fn not in _AT_END:
        _AT_END.append(fn)


def not_at_end(fn) -> None:
    """FN is done with: a later stop does not run it."""
    with contextlib.suppress(ValueError):
        _AT_END.remove(fn)


def _run_at_end(seconds: float) -> None:
    def quietly(fn):
        with contextlib.suppress(Exception):
            fn()
    for fn in list(_AT_END):
        _bounded(lambda fn=fn: quietly(fn), seconds)


def _once(release: bool = False) -> None:
    """Only one thread ends the job: a second one (the main thread failing because a thread is
    ending the job for a dead worker, say) waits here for the process to end. RELEASE: the caller
    goes on (raising a one-line failure), so the next failure may end the job too."""
    if not _ENDING.acquire(blocking=False):
        while True:
            time.sleep(3600)
    if release:
        _ENDING.release()


def _descendants() -> list:
    import psutil

    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def stop_descendants(timeout: float = 3.0) -> int:
    """SIGTERM every process the job started (and theirs: the runner's worker processes), SIGKILL
    those still alive after TIMEOUT seconds; how many there were (not counting the shells
    between). Processes that were there before the job began (a caller's servers) are left be."""
    import psutil

    children = [c for c in _descendants() if c.pid not in _OTHERS]
    if not children:
        return 0
    workers = 0
    for child in children:
        with contextlib.suppress(psutil.Error):
            workers += child.name() not in ("sh", "dash", "bash")      # Beam starts each worker through a shell
            child.terminate()
    _gone, alive = psutil.wait_procs(children, timeout=timeout)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(alive, timeout=timeout)
    return workers


class Stopping:
    """While active (a context manager), SIGTERM and SIGINT stop the job as the module doc says.
    PROGRESS() -> a few words on what is kept (e.g. '12 of 18 work units committed'), CLEANUP()
    releases what the job holds (its claim); both run under the deadline. Signals are only
    handled in the main thread; elsewhere (a job run from a thread) the defaults stay.

    A signal handler runs in the main thread between two bytecodes, wherever that thread was (in
    the middle of a write, holding a lock): taking locks, logging or I/O there can deadlock or
    re-enter. So the handler does nothing but hold the main thread still (a sleep, which takes
    no lock) unless a step that must finish is running (the manifest's write, :meth:`critical`).
    The signal itself reaches a thread of this class through Python's wakeup file descriptor
    (``signal.set_wakeup_fd``, written by the interpreter's C-level handler): the first signal
    starts the deadline and a thread that ends the job (:meth:`end`: the worker processes stopped,
    then the claim released, one line); a second one prints the line at once and exits."""

    def __init__(self, what: str, progress=None, cleanup=None, grace: float = GRACE_SECONDS):
        self.what, self.progress, self.cleanup, self.grace = what, progress, cleanup, grace
        self._previous: dict = {}
        self._deferred = 0
        self._pending: int | None = None
        self._signalled: int | None = None        # the first signal's number
        self._published: str | None = None        # what the committed manifest made public, once written
        self._pipe: tuple[int, int] | None = None
        self._previous_wakeup = -1
        # a signal and the start of a critical step are ordered: a step never starts after a
        # signal's stop began, and a signal during a step waits for it
        self._order = threading.Lock()

    def __enter__(self):
        if not _ACTIVE:
            _OTHERS.clear()
            _OTHERS.update(c.pid for c in _descendants())
        if threading.current_thread() is threading.main_thread():
            read, write = os.pipe()
            os.set_blocking(write, False)
            self._pipe = (read, write)
            self._previous_wakeup = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
            for sig in _SIGNALS:
                self._previous[sig] = signal.signal(sig, self._on_signal)
            threading.Thread(target=self._read_signals, args=(read,), name="paragen-signals", daemon=True).start()
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self._pipe is not None:
            signal.set_wakeup_fd(self._previous_wakeup)
            os.close(self._pipe[1])              # the reader sees the end of the pipe and returns
            self._pipe = None
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        return False

    def watch(self, what: str, progress=None, cleanup=None) -> None:
        """From now on a stop names WHAT, says PROGRESS() and runs CLEANUP() (the claim once held)."""
        self.what, self.progress, self.cleanup = what, progress, cleanup

    @contextlib.contextmanager
    def critical(self):
        """A step that must not be cut in half (writing the manifest): a signal waits for its end
        (its deadline runs from the signal all the same). Yields this object: the step calls
        :meth:`published` once its result is public, so that a stop after it says so. A step
        that starts after a signal does not start: the job is ending."""
        with self._order:
            stopping = self._signalled is not None and not self._deferred
            if not stopping:
                self._deferred += 1
        if stopping:
            _park()
        try:
            yield self
        finally:
            with self._order:
                self._deferred -= 1
                pending = self._pending if not self._deferred else None
            if pending is not None:
                self._stop(pending)

    def published(self, what: str) -> None:
        """WHAT (e.g. 'run X is published') is public now: a stop from here on says so, and that
        the same command finishes the clean-up."""
        self._published = what

    def _on_signal(self, signum, _frame):
        # The main thread's part: stay still while the job is ended from another thread, unless
        # the manifest is being written (it finishes, then the stop runs: critical()).
        if self._deferred:
            self._pending = signum
            return
        _park()

    def _read_signals(self, read: int) -> None:
        """The signals, from the wakeup pipe: the first starts the deadline and the stop, a second
        ends the process at once."""
        try:
            while True:
                data = os.read(read, 64)
                if not data:
                    return
                for signum in data:
                    if signum in _SIGNALS:
                        self._signal(signum)
        except OSError:
            return
        finally:
            with contextlib.suppress(OSError):
                os.close(read)

    def _signal(self, signum: int) -> None:
        code = 128 + signum
        if self._signalled is not None:            # a second signal: the line now, then out
            kill_descendants(wait=1.0)             # gone before the claim is released
            for active in reversed(_ACTIVE):
                if active.cleanup:
                    _bounded(lambda fn=active.cleanup: _quiet(fn), 2.0)
            _run_at_end(2.0)
            _say(self._line(f"{self.what} stopped by {signal.Signals(signum).name} twice: not waiting for the "
                            "clean-up", "", 0, None))
            os._exit(code)
        _deadline(self.grace, code, lambda: self._line(f"{self.what} stopped by {signal.Signals(signum).name}; the "
                                                       f"clean-up outlasted the {self.grace:.0f}-s grace period",
                                                       "", 0, None))
        with self._order:
            self._signalled = signum
            if self._deferred:
                self._pending = signum             # critical() runs the stop when the step ends
                return
        threading.Thread(target=self._stop, args=(signum,), name="paragen-stop", daemon=True).start()

    def _stop(self, signum: int) -> None:
        self.end(f"{self.what} stopped by {signal.Signals(signum).name}", 128 + signum)

    def on_worker_lost(self, work: str):
        """What RunnerNoise calls when a worker process died: end the job, the threads' words in
        WORK/error.log; exit status 70 when the worker ended for a device failure (70, itself:
        the scheduler runs the same command on a sound device), else 1."""
        import re

        def lost(why, text):
            codes = {int(c) for c in re.findall(r"Worker subprocess exited with return code (-?\d+)", text)}
            self.end(why, DEVICE_FAILURE_EXIT if DEVICE_FAILURE_EXIT in codes else 1, text,
                     storage.join(work, "error.log"))
        return lost

    def _line(self, why: str, kept: str, workers: int, seconds: float | None) -> str:
        if self._published:
            tail = (f"; {self._published}, its clean-up (files it does not list, the run's _work) cut short: run "
                    "the same command again to finish it")
        else:
            tail = (f"; {kept}" if kept else "") + "; run the same command again to continue"
        return (f"error: {why}" + (f"; {workers} worker process(es) stopped" if workers else "")
                + (f" ({seconds:.1f}s)" if seconds is not None else "") + tail)

    def end(self, why: str, code: int, log_text: str = "", log_path: str | None = None) -> None:
        """End the process now, from any thread but a signal handler: the worker processes stopped,
        then what is held released, one line (WHY; what is kept), exit status CODE;
        within the grace period. LOG_TEXT is written to LOG_PATH first (a traceback for a
        person)."""
        _once()
        _deadline(self.grace, code, lambda: self._line(why + f"; the clean-up outlasted the {self.grace:.0f}-s grace "
                                                       "period", "", 0, None))
        started = time.monotonic()
        # what the runner's threads say about the connections to the workers going away is noise now
        logging.disable(logging.CRITICAL)
        threading.excepthook = lambda _args: None
        # the worker processes first, then the claim: no worker of this run writes after the claim is
        # released (threads of this process are refused by the release itself: paracorpus.commit.Fence)
        workers = stop_descendants()
        # a file this process's other threads are creating (its claim lost while the main thread
        # published, say) is not left as a hidden temporary
        storage.remove_staged_in_flight()
        for active in reversed([*_ACTIVE, self] if self not in _ACTIVE else _ACTIVE):   # a refresh's job too
            with contextlib.suppress(Exception):
                if active.cleanup:
                    active.cleanup()
        _run_at_end(max(1.0, self.grace / 4))
        kept = ""
        if not self._published:
            # Listing what is committed may take long on a slow store: what is left of the grace
            # period, less a second for the line, bounds it.
            kept = _bounded(self.progress, self.grace - (time.monotonic() - started) - 1.0) or ""
        if log_path:
            with contextlib.suppress(Exception):
                storage.write_bytes(log_path, log_text.encode("utf-8", "replace"))
                kept += f"; traceback in {log_path}"
        _say(self._line(why, kept, workers, time.monotonic() - started))
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        logging.shutdown()
        os._exit(code)


def end_in_this_process(why: str, code: int) -> None:
    """End the job from inside it (a worker of the in-memory runner runs in the job's process):
    through its Stopping (the claim released, one line, exit status CODE) when one is active
    here; else return (a separate worker process: its caller exits on its own)."""
    if _ACTIVE:
        _ACTIVE[-1].end(why, code)


def _park() -> None:
    """Hold this thread (the main one, in a signal handler) until another ends the process."""
    while True:
        time.sleep(3600)


_DEADLINE: list = []


def _deadline(grace: float, code: int, line) -> None:
    """From now on the process ends within GRACE seconds, whatever hangs: LINE() printed, exit
    status CODE (started once; later calls keep the first)."""
    if _DEADLINE:
        return

    def fire():
        with contextlib.suppress(Exception):
            _say(line())
        os._exit(code)
    timer = threading.Timer(grace, fire)
    timer.daemon = True
    _DEADLINE.append(timer)
    timer.start()


def _quiet(fn) -> None:
    """FN(), whatever it raises kept quiet (the job is ending: the line says what matters)."""
    with contextlib.suppress(Exception):
        fn()


def _bounded(fn, seconds: float) -> str | None:
    """FN() if it returns within SECONDS, else None (it goes on in a thread the exit ends)."""
    if fn is None or seconds <= 0:
        return None
    out: list = []
    parent = threading.get_ident()

    def work():
        storage.stage_like(parent)          # the thread ending the process writes its clean-up through it
        out.append(fn())
    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(seconds)
    return out[0] if out else None


def _say(line: str) -> None:
    """LINE on the terminal and on a refresh's log (sys.stderr), written without the streams'
    locks: the thread that held one may be stopped in the middle of a write."""
    data = (line + "\n").encode("utf-8", "replace")
    fds = {2}
    with contextlib.suppress(Exception):
        fds.add(sys.stderr.fileno())
    for fd in fds:
        with contextlib.suppress(OSError):
            os.write(fd, data)


def kill_descendants(wait: float = 0.0) -> None:
    """SIGKILL every process the job started (a second signal: no time left), and wait up to WAIT
    seconds for them to be gone."""
    import psutil

    killed = []
    for child in _descendants():
        if child.pid not in _OTHERS:
            with contextlib.suppress(psutil.Error):
                child.kill()
                killed.append(child)
    if wait and killed:
        psutil.wait_procs(killed, timeout=wait)


class RunnerNoise(logging.Filter):
    """While a pipeline runs: what the runner's own threads print when its worker processes go
    away (gRPC streams closed, 'Worker subprocess exited ...') is kept here instead of printed. If
    the pipeline fails, the failure's one line says what happened and these go to error.log with
    its traceback; if it succeeds, they are printed after all.

    A DirectRunner worker process that dies (SIGKILL, the OOM killer, a device error) is noticed
    the moment Beam's thread that started it sees its exit status: ON_WORKER_LOST(description,
    what the threads said) is called then, rather than when the other workers' bundles end (the
    runner waits for those before it fails)."""

    def __init__(self, on_worker_lost=None):
        super().__init__()
        self.kept: list[str] = []
        self._records: list[logging.LogRecord] = []
        self.on_worker_lost = on_worker_lost

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("apache_beam") and record.levelno >= logging.ERROR:
            self._records.append(record)
            self.kept.append(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s").format(record))
            return False
        return True

    def _thread_error(self, args) -> None:
        self.kept.append(f"Exception in thread {args.thread.name if args.thread else '?'}:\n" + "".join(
            traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback)))
        if self.on_worker_lost and "Worker subprocess exited with return code" in str(args.exc_value):
            self.on_worker_lost(describe_failure(args.exc_value), "\n".join(self.kept))

    def __enter__(self):
        self._hook = threading.excepthook
        threading.excepthook = self._thread_error
        for handler in logging.getLogger().handlers:
            handler.addFilter(self)
        return self

    def __exit__(self, exc_type, *_):
        threading.excepthook = self._hook
        for handler in logging.getLogger().handlers:
            handler.removeFilter(self)
        if exc_type is None:                  # a finished pipeline: what it said is worth seeing
            for record in self._records:
                logging.getLogger(record.name).handle(record)
            for text in self.kept:
                if text.startswith("Exception in thread"):
                    print(text, file=sys.stderr, flush=True)
        return False


def pipeline_failure(exc: BaseException, work: str | None, kept: str = "", noise: list[str] = (),
                     output: str | None = None) -> JobFailed:
    """One line for what a failed pipeline raised (EXC), its traceback (and NOISE, what the
    runner's threads said) kept in WORK/error.log when it can be written; KEPT: what survives, in
    words."""
    _once(release=True)
    stop_descendants()
    text = "\n".join([*noise, "".join(traceback.format_exception(exc))])
    where = ""
    if work:
        with contextlib.suppress(Exception):
            storage.write_bytes(storage.join(work, "error.log"), text.encode("utf-8", "replace"))
            where = f"; traceback in {storage.join(work, 'error.log')}"
    from common.cli import OutputBusy

    lost = next((e for e in _chain(exc) if isinstance(e, OutputBusy)), None)
    claim_line = next((line.strip() for line in text.splitlines() if "lost its claim" in line
                       or "claim was released" in line), None)
    if lost is not None or claim_line:
        # a worker refused to write for a run that lost its output: exit 75, as the driver's own check
        message = str(lost) if lost is not None else claim_line.split("OutputBusy: ", 1)[-1]
        return OutputBusy(message + (f"; {kept}" if kept else ""))
    cause = describe_failure(exc, noise, output)
    return JobFailed(f"{cause}" + (f"; {kept}" if kept else "") + where
                     + "; run the same command again to continue")


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def describe_failure(exc: BaseException, noise: list[str] = (), output: str | None = None) -> str:
    """What went wrong, in words, from an exception a runner may have wrapped several times
    (Beam re-raises a worker's error as a RuntimeError holding its text) and what its threads said
    (NOISE). A disk error names its file, else OUTPUT (the directory being written)."""
    import re

    text = "\n".join(str(e) for e in _chain(exc))
    stage = re.search(r"\[while running '([^']+)'\]", text)
    during = f" [while running {stage.group(1)}]" if stage else ""
    for inner in _chain(exc):
        if isinstance(inner, storage.StorageError):
            return str(inner)
        if isinstance(inner, OSError) and inner.errno in DISK_ERRORS:
            return disk_error(inner.errno, inner.filename or output) + during
    for number in DISK_ERRORS:
        if f"[Errno {number}]" in text or os.strerror(number) in text:
            return disk_error(number, _filename_in(text, number) or output) + during
    if "the store at" in text and "PARAGEN_STORAGE_RETRY_SECONDS" in text:
        return next(line.strip() for line in text.splitlines() if "the store at" in line)
    if any(s in text for s in ("Channel closed prematurely", "Worker subprocess exited", "Stream removed",
                               "Socket closed", "KilledWorker")):
        codes = sorted({int(c) for c in re.findall(r"Worker subprocess exited with return code (-?\d+)",
                                                     "\n".join([text, *noise]))})
        how = ", ".join(_exit_status(c) for c in codes)
        return (f"a worker process ended while decoding ({how + '; ' if how else ''}killed, out of memory, or a "
                "device error: see the system log)")
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"the pipeline failed: {type(exc).__name__}: {first[:300]}"


def _exit_status(code: int) -> str:
    """A worker's exit status in words: 137 (a shell's 128 + 9) or -9 is SIGKILL."""
    if code == DEVICE_FAILURE_EXIT:
        return f"exit status {code}: its device failed"
    sig = -code if code < 0 else code - 128 if code > 128 else 0
    if sig:
        with contextlib.suppress(ValueError):
            return f"exit status {code}: {signal.Signals(sig).name}"
    return f"exit status {code}"


def _filename_in(text: str, number: int) -> str | None:
    """The file a Beam-wrapped '[Errno N] message: 'path'' names, if it does."""
    import re

    found = re.search(rf"\[Errno {number}\][^:\n]*: '([^'\n]+)'", text)
    return found.group(1) if found else None
