"""A real HDFS on loopback for the tests: Hadoop's own MiniDFSCluster (a NameNode and one DataNode
in one JVM, tests/hdfs/MiniHdfs.java) on the classpath scripts/install_hdfs.sh fetched from Maven
Central into .hdfs/lib. The jobs reach it as users reach a cluster's HDFS: ``webhdfs://`` URLs to
the NameNode's HTTP port (common/storage/webhdfs.py).

The fixture ``hdfs_store`` (session scope: one JVM a worker) has the interface of
tests/object_stores.py's stores: ``scheme``, ``env`` and ``make_bucket()`` (here a fresh folder,
"127.0.0.1:PORT/test-<hex>"), so a test written for buckets takes HDFS too."""
from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import tempfile
import uuid

import pytest

from tests.object_stores import ServerUnavailable, _die_with_parent, _stop, _tail

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = os.path.join(ROOT, ".hdfs", "lib")
LAUNCHER = os.path.join(ROOT, "tests", "hdfs", "MiniHdfs.java")
START_TIMEOUT_S = 180.0          # a JVM compiling the launcher and formatting a NameNode, on a busy machine


def missing() -> str | None:
    """Why the HDFS tests cannot run here, or None."""
    if not shutil.which("java"):
        return "no java on PATH (the tests' HDFS needs Java 17)"
    if not os.path.isfile(os.path.join(LIB, "hadoop-client-minicluster-3.4.1.jar")):
        return f"Hadoop's MiniDFSCluster is not installed in {LIB} (scripts/install_hdfs.sh)"
    return None


class HdfsStore:
    scheme = "webhdfs"
    env: dict = {}

    def __init__(self, http_port: int, rpc_port: int):
        self.endpoint = f"127.0.0.1:{http_port}"
        self.rpc_port = rpc_port

    def make_bucket(self, name: str | None = None) -> str:
        """A fresh folder's place, "127.0.0.1:PORT/NAME" (HDFS makes the folder on the first write)."""
        return f"{self.endpoint}/{name or 'test-' + uuid.uuid4().hex[:16]}"


@contextlib.contextmanager
def hdfs_server(base: str):
    """A MiniDFSCluster with its data under BASE, stopped (its JVM ended) when the block ends."""
    why = missing()
    if why:
        raise ServerUnavailable(why)
    with tempfile.TemporaryFile() as log:
        tmp = base.rstrip("/") + "-jvm-tmp"     # the JVM's temporaries: Java does not read TMPDIR
        os.makedirs(tmp, exist_ok=True)
        proc = subprocess.Popen(["java", "-Xmx512m", "-XX:+UseSerialGC", f"-Djava.io.tmpdir={tmp}",
                                 "-cp", os.path.join(LIB, "*"), LAUNCHER, base],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                preexec_fn=_die_with_parent)
        try:
            ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
            words = (proc.stdout.readline() if ready else b"").split()
            if len(words) != 3 or words[0] != b"ready":
                _stop(proc)
                raise RuntimeError(f"the MiniDFSCluster did not start within {START_TIMEOUT_S:.0f}s:\n{_tail(log)}")
            yield HdfsStore(int(words[2]), int(words[1]))
        finally:
            _stop(proc, timeout=30)


@pytest.fixture(scope="session")
def hdfs_store(tmp_path_factory):
    """An HdfsStore for the whole session; skips the test when Java or the Hadoop jars are missing."""
    try:
        with hdfs_server(str(tmp_path_factory.mktemp("hdfs"))) as store:
            yield store
    except ServerUnavailable as exc:
        pytest.skip(f"HDFS: {exc}")
