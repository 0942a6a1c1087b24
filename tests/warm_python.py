"""Job processes forked from a warm interpreter, for the tests that start many jobs (crash points,
faults, common mistakes and 17 more files): a job process spent 3-5 s of CPU importing torch, Beam
and fairseq before it read a record and over a second tearing them down at its end, most of what
a 40-pair job costs.

A zygote process (``python -m tests.warm_python``, one per test process) imports the jobs' modules
once. For each job it forks a monitor, which forks the job and reports the job's pid and then its
exit status. The job is a process of its own, as ``python -m MODULE ARGS`` would be: its own pid
(and session with start_new_session), the environment, working directory, argv, sys.path,
stdin/stdout/stderr and warning filters it was given, the module run as ``__main__``, its exit
status (a signal's; an uncaught exception's traceback and 1), its threads joined and atexit
handlers run; then it ends without the tear-down. What it does not repeat is the import of the
modules the zygote has: a test of what a fresh process imports, prints while importing, or reads
at its start runs a real ``python -m`` (:func:`needs_fresh` sends a job whose environment changes
what is read at start to one; our modules read their settings when called, not at import;
tests/test_warm_python.py checks the parity on real jobs).

:class:`WarmPopen` is ``subprocess.Popen`` with its start replaced, so pipes, ``communicate``,
timeouts and signals work as usual; :func:`popen` and :func:`run` fall back to a real process for
a command that is neither ``python -m`` of a preloaded module nor ``python SCRIPT.py``.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# what the jobs the suite starts many times import (each pulls in torch, Beam, fairseq, pyarrow)
PRELOAD = ("beam_pipelines.generate", "beam_pipelines.filter", "beam_pipelines.refresh", "embeddings.train",
           "embeddings.sts", "embeddings.lexicon", "models.nmt.importing", "models.nmt.translate", "models.nmt.train")
# run warm too, not preloaded: the fairseq baselines the bench scripts start (fairseq itself is)
ALSO_WARM = ("fairseq_cli.preprocess", "models.nmt.model_files.fairseq_compat")
_LIMIT = 1 << 20
# a job given this (the zygote's socket, address()) starts its own python -m jobs as forks too
ADDRESS_VARIABLE = "PARAGEN_WARM_ZYGOTE"


# ------------------------------------------------------------------------------- the zygote

def _serve(sock: socket.socket, listener: socket.socket) -> None:
    """Fork a job for each request: from the test process (SOCK) and from the jobs it gave
    ADDRESS_VARIABLE (a bench script run by the smoke tier starts its own jobs warm too)."""
    import selectors

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)          # monitors are reaped by the kernel
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(listener, selectors.EVENT_READ)
    hello = json.dumps(dict(os.environ)).encode()          # what needs_fresh compares a job's env with
    while True:
        for key, _ in sel.select():
            conn = key.fileobj
            if conn is listener:
                client, _ = listener.accept()
                client.send(hello)
                sel.register(client, selectors.EVENT_READ)
                continue
            msg, fds, _flags, _addr = socket.recv_fds(conn, _LIMIT, 4)
            if not msg:
                if conn is sock:
                    return                                  # the test process closed its end
                sel.unregister(conn)
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            if os.fork() == 0:
                for other in list(sel.get_map().values()):
                    other.fileobj.close()
                sel.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                _monitor(json.loads(msg), fds)              # does not return
            for fd in fds:
                os.close(fd)


def _monitor(request: dict, fds: list[int]) -> None:
    stdin, stdout, stderr, status = fds
    started, start = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(status)
        os.close(started)
        _become_job(request, stdin, stdout, stderr, start)  # does not return
    for fd in (stdin, stdout, stderr, start):
        os.close(fd)
    # the pid once the job has its session and files, as subprocess.Popen returns after exec: a
    # killpg(pid) at once reaches it
    os.read(started, 1)
    os.close(started)
    os.write(status, f"{pid}\n".encode())
    _, code = os.waitpid(pid, 0)
    os.write(status, f"{code}\n".encode())
    os._exit(0)


def _become_job(request: dict, stdin: int, stdout: int, stderr: int, start: int) -> None:
    """Turn this fork into the job's process: its files, session, place, environment and argv;
    then run the module as __main__ and end as a fresh interpreter would (:func:`_exit`)."""
    import runpy
    import tempfile
    import warnings

    if request["new_session"]:
        os.setsid()
    for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.close(start)                                         # the monitor reports the pid now
    env = request["env"]
    if env.get("PYTHONWARNINGS", "") != os.environ.get("PYTHONWARNINGS", ""):
        for option in filter(None, env.get("PYTHONWARNINGS", "").split(",")):
            warnings._setoption(option)             # what the interpreter does with each -W at start
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    if env.get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    base = [p for p in sys.path[1:] if p not in extra]
    script = request.get("script")
    # sys.path[0]: python -m's working directory, python SCRIPT's folder
    sys.path[:] = [os.path.dirname(os.path.abspath(script)) if script else request["cwd"], *extra, *base]
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None                                 # TMPDIR read again
    try:
        if script:
            sys.argv = [script, *request["args"]]
            runpy.run_path(script, run_name="__main__")
        else:
            sys.argv = [request["module"], *request["args"]]
            sys.modules.pop(request["module"], None)       # as in a fresh process: only its __main__ copy
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = _exit_status(exc.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code = -signal.SIGINT
    except BaseException:                                   # noqa: B036: what the interpreter does with it
        sys.excepthook(*sys.exc_info())
        code = 1
    _exit(code)


def _exit_status(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _exit(code: int) -> None:
    """End the job as the interpreter ends: its threads joined (threading's exit callbacks: a
    thread pool's shutdown), its atexit handlers, stdio flushed; then the process, without the
    tear-down of every module the zygote imported (over a second of CPU a job, for nothing: the
    process ends). A KeyboardInterrupt ends it by SIGINT, as Python does."""
    import atexit
    import threading as threads

    threads._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if code == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _main() -> None:
    import threading as threads

    for name in PRELOAD:
        __import__(name)
    if threads.active_count() != 1:                         # a fork keeps only the forking thread
        raise SystemExit(f"warm_python: the preloaded modules started threads: {threads.enumerate()}")
    sock = socket.socket(fileno=int(sys.argv[1]))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(sys.argv[2])                              # in a folder only this user can enter
    listener.listen()
    sock.send(b"ready")
    _serve(sock, listener)


# --------------------------------------------------------------------------- the test's side

def zygote_env() -> dict:
    """The environment a zygote started now has: this process's, ROOT on its PYTHONPATH."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (ROOT, os.environ.get("PYTHONPATH"))))}


def _read_at_start(env: dict) -> dict:
    return {k: v for k, v in env.items() if k.startswith(_AT_START) and k not in _SET_IN_THE_FORK}


class _Zygote:
    def __init__(self):
        import tempfile

        here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = self.env = zygote_env()
        self.folder = tempfile.mkdtemp(prefix="warm-python-")      # mode 0700: this user's jobs only
        if len(self.folder) > 90:                                  # a socket's path has 107 bytes at most
            os.rmdir(self.folder)
            self.folder = tempfile.mkdtemp(prefix="warm-python-", dir="/tmp")
        self.address = os.path.join(self.folder, "zygote")
        self.log = tempfile.TemporaryFile()             # the zygote's own stderr: why it did not start
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.warm_python", str(there.fileno()), self.address],
                                     cwd=ROOT, env=env, pass_fds=(there.fileno(),), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self.log, start_new_session=True)
        there.close()
        self.sock, self.lock = here, threading.Lock()
        if self.sock.recv(16) != b"ready":
            self.proc.wait()
            self.log.seek(0)
            raise RuntimeError(f"warm_python: the zygote did not start (exit status {self.proc.returncode}): "
                               f"{self.log.read()[-2000:].decode(errors='replace')}")

    def current(self) -> bool:
        """Alive, and started with what this process's environment has now at start (the
        CTranslate2 engine, loaded in a test's process, sets OMP_WAIT_POLICY)."""
        return self.proc.poll() is None and _read_at_start(self.env) == _read_at_start(zygote_env())

    def start(self, request: dict, fds: list[int]) -> None:
        with self.lock:
            socket.send_fds(self.sock, [json.dumps(request).encode()], fds)

    def close(self) -> None:
        import shutil

        self.sock.close()                                   # the zygote's recv ends: it exits
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


class _Connection(_Zygote):
    """A job's way to the zygote that forked it (ADDRESS_VARIABLE in its environment): a bench
    script run by the smoke tier starts the jobs it measures as forks too."""

    def __init__(self, address: str):
        self.sock, self.lock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET), threading.Lock()
        self.sock.connect(address)
        self.env = json.loads(self.sock.recv(_LIMIT))

    def current(self) -> bool:
        return True

    def close(self) -> None:
        self.sock.close()


_ZYGOTE: list = []
_ZYGOTE_LOCK = threading.Lock()


def _zygote() -> _Zygote:
    with _ZYGOTE_LOCK:
        if _ZYGOTE and not _ZYGOTE[0].current():
            _ZYGOTE.pop().close()
        if not _ZYGOTE:
            address = os.environ.get(ADDRESS_VARIABLE)
            _ZYGOTE[:] = [_Connection(address) if address else _Zygote()]
        return _ZYGOTE[0]


def address() -> str:
    """Where a job given it as ADDRESS_VARIABLE asks this process's zygote for jobs of its own."""
    zygote = _zygote()
    if isinstance(zygote, _Connection):
        return os.environ[ADDRESS_VARIABLE]
    return zygote.address


def stop() -> None:
    """End this process's zygote (a fixture's teardown; atexit does it otherwise)."""
    with _ZYGOTE_LOCK:
        if _ZYGOTE:
            _ZYGOTE.pop().close()


atexit.register(stop)        # once: whichever zygote is current at exit, not every one ever started


# What a process reads only when it starts (the dynamic loader, libgomp and MKL at load, the
# interpreter's own options): a job given other values than the zygote had must be a fresh process.
_AT_START = ("LD_", "OMP_", "GOMP_", "KMP_", "MKL_", "MALLOC_", "PYTHON")
_SET_IN_THE_FORK = ("PYTHONPATH", "PYTHONWARNINGS", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE")


def needs_fresh(env: dict | None) -> str | None:
    """Why a job with ENV cannot be a fork of the zygote (None: it can): a start-time variable
    that differs from the zygote's, or a folder on its PYTHONPATH that the zygote's lacks (its
    sitecustomize.py runs at start; its modules may shadow what the zygote imported)."""
    env = dict(os.environ) if env is None else env
    # what the zygote has: the one that forked this job, or this process's (as it is or started again)
    base = _zygote().env if os.environ.get(ADDRESS_VARIABLE) else zygote_env()
    mine, its = _read_at_start(env), _read_at_start(base)
    for name in sorted(set(mine) | set(its)):
        if mine.get(name) != its.get(name):
            return name
    known = {os.path.realpath(p) for p in base.get("PYTHONPATH", "").split(os.pathsep) if p}
    for folder in filter(None, env.get("PYTHONPATH", "").split(os.pathsep)):
        if os.path.realpath(folder) not in known:        # its sitecustomize.py, modules that shadow others
            return f"PYTHONPATH {folder}"
    return None


def _target(args) -> dict | None:
    """What a warm job of ARGS runs: {"module": M} for ``python -m M`` (M in PRELOAD or ALSO_WARM), {"script": S}
    for ``python S.py``, with the arguments after them; None for another command."""
    args = [os.fsdecode(a) for a in args] if isinstance(args, (list, tuple)) else []
    if len(args) >= 3 and args[0] == sys.executable and args[1] == "-m" and args[2] in PRELOAD + ALSO_WARM:
        return {"module": args[2], "args": args[3:]}
    if len(args) >= 2 and args[0] == sys.executable and args[1].endswith(".py") and os.path.isfile(args[1]):
        return {"script": args[1], "args": args[2:]}
    return None


class WarmPopen(subprocess.Popen):
    """subprocess.Popen of ``[sys.executable, "-m", MODULE, ...]`` (MODULE in PRELOAD, ALSO_WARM) or
    ``[sys.executable, SCRIPT.py, ...]``, forked from the zygote instead of started afresh."""

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                       creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite,
                       restore_signals, gid, gids, uid, umask, start_new_session, process_group):
        target = _target(args)
        if target is None or preexec_fn or shell or pass_fds or executable:
            raise ValueError(f"WarmPopen runs a .py script or python -m of {PRELOAD + ALSO_WARM}, not {args!r}")
        fresh = needs_fresh(env)
        if fresh:
            raise ValueError(f"WarmPopen: {fresh} is read when a process starts; use popen()")
        status_read, status_write = os.pipe()
        request = {**target, "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(),
                   "env": dict(env) if env is not None else dict(os.environ),
                   "new_session": bool(start_new_session)}
        fds = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1,
               errwrite if errwrite != -1 else 2, status_write]
        try:
            _zygote().start(request, fds)
        finally:
            os.close(status_write)
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
        self._status = os.fdopen(status_read, "rb")
        line = self._status.readline()
        if not line:
            raise OSError(f"warm_python: the zygote did not start {args!r}")
        self.pid = int(line)
        self._child_created = True

    def _finish(self) -> None:
        line = self._status.readline()
        self._status.close()
        self.returncode = os.waitstatus_to_exitcode(int(line)) if line else -9

    def _internal_poll(self, _deadstate=None, _waitpid=None, _WNOHANG=None, _ECHILD=None):
        if self.returncode is None and select.select([self._status], [], [], 0)[0]:
            self._finish()
        return self.returncode

    def _wait(self, timeout):
        if self.returncode is None:
            if not select.select([self._status], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._finish()
        return self.returncode


def popen(args, **kwargs) -> subprocess.Popen:
    """WarmPopen for ``python -m`` of a preloaded module or ``python SCRIPT.py``, else (or where
    :func:`needs_fresh`) subprocess.Popen."""
    warm = _target(args) is not None and not needs_fresh(kwargs.get("env"))
    return (WarmPopen if warm else subprocess.Popen)(args, **kwargs)


def run(args, timeout: float | None = None, capture_output: bool = False, input=None, check: bool = False,
        **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run with :func:`popen`."""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    with popen(args, **kwargs) as proc:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


if __name__ == "__main__":
    _main()
