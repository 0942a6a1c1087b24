"""A store that cannot be reached is a mistake said at once (issue 57): each job (generation,
filter, embedding, refresh) given a bucket it cannot reach (a refused port, a host name that does
not resolve, a server that accepts and never answers, GCS with no credentials and no network,
HDFS without Hadoop) ends in its check phase in one ``error:`` line, having written nothing, and
one that never answers is given up on after its first-contact budget (PARAGEN_FIRST_CONTACT_SECONDS),
which the line names. (GCS without credentials used to retry "could not create an OAuth2 access
token" for the whole 300-s budget, about 6 minutes.) No test here bounds the wall-clock time: a
loaded machine stretches a process's start by tens of seconds; that the budget is the process's
own is what the message checks; bench/bench_unreachable.py measures how long each job takes.
"""
import os
import socket
import subprocess
import sys
import threading

import pytest

from tests.jobs import ROOT
from tests import warm_python

pytestmark = pytest.mark.slow          # a process a case
BUDGET = "3"                           # PARAGEN_FIRST_CONTACT_SECONDS here: the default 25 s is a setting, not a behaviour


def _clean_env(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "GOOGLE_", "STORAGE_EMULATOR", "CLOUD_STORAGE", "JAVA_HOME", "HADOOP",
                                "ARROW_LIBHDFS"))}
    return {**env, "PYTHONPATH": ROOT, **extra}


def _commands(url: str, models: str) -> dict:
    local = ["--forward_model", os.path.join(models, "cs-en"), "--backward_model", os.path.join(models, "en-cs")]
    return {"generate": ["beam_pipelines.generate", "--input", f"{url}/in.tsv", "--output", f"{url}/out", *local],
            "filter": ["beam_pipelines.filter", "--input", f"{url}/run", "--output", f"{url}/filtered"],
            "embeddings": ["embeddings.train", "--input", f"{url}/run", "--output", f"{url}/encoder"],
            "refresh": ["beam_pipelines.refresh", "--root", f"{url}/root", "--", "--input", f"{url}/bitext", *local]}


def _run(module_args: list[str], env: dict) -> subprocess.CompletedProcess:
    # the timeout only keeps a hung job from hanging the suite; it is no bound on the behaviour
    return warm_python.run([sys.executable, "-m", *module_args], cwd=ROOT, capture_output=True, text=True,
                           timeout=600, env=env)


STORES = {
    "s3, a refused port": ("s3://bucket", {"AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_ACCESS_KEY_ID": "k",
                                           "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1"}, "127.0.0.1:1"),
    "s3, no such host": ("s3://bucket", {"AWS_ENDPOINT_URL": "http://no-such-host.invalid:9000",
                                         "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
                                         "AWS_REGION": "us-east-1"}, "no-such-host.invalid"),
    "gs, no credentials": ("gs://bucket", {}, "storage.googleapis.com"),
    "hdfs, no Hadoop": ("hdfs://namenode:8020/data", {}, "hdfs://"),
    "webhdfs, a refused port": ("webhdfs://127.0.0.1:1/data", {}, "NameNode at http://127.0.0.1:1"),
}


@pytest.mark.parametrize("store", sorted(STORES))
def test_each_job_refuses_a_store_it_cannot_reach_in_one_line(store, tiny_nmt_models, tmp_path):
    url, extra, named = STORES[store]
    env = _clean_env({**extra, "PARAGEN_FIRST_CONTACT_SECONDS": BUDGET})
    for job, args in _commands(url, tiny_nmt_models).items():
        done = _run(args, env)
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert done.returncode not in (0, None) and len(errors) == 1, (job, done.returncode, done.stderr[-3000:])
        assert "Traceback" not in done.stderr and named in errors[0], (job, errors)


def test_a_store_that_accepts_and_never_answers_is_given_up_on_after_its_budget(tiny_nmt_models):
    """A blackholed endpoint (connections accepted, nothing ever answered: a firewall dropping
    the traffic, a proxy that hangs): each try waits for its own timeout and the client library
    retries inside itself; the check phase gives up on the first answer after its budget in all
    (PARAGEN_FIRST_CONTACT_SECONDS; 3 s here, 25 by default), and says so."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        endpoint = f"127.0.0.1:{listener.getsockname()[1]}"
        env = _clean_env({"AWS_ENDPOINT_URL": f"http://{endpoint}", "AWS_ACCESS_KEY_ID": "k",
                          "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1",
                          "PARAGEN_FIRST_CONTACT_SECONDS": BUDGET})
        done = _run(_commands("s3://bucket", tiny_nmt_models)["generate"], env)
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode != 0 and len(errors) == 1 and endpoint in errors[0], done.stderr[-3000:]
    assert f"did not answer within {BUDGET}s (PARAGEN_FIRST_CONTACT_SECONDS)" in errors[0], errors
    assert held, "the job's client connected (and waited) before it gave up"
