"""Workers never write for a run whose claim is gone (issue 57): a stopped job releases its claim
only after its worker processes have stopped, and a worker that outlives its driver (a Dask task
paused while the driver was killed and the output taken over) writes nothing when it resumes.
Real processes, real signals."""
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.crash_points import leftovers, rows
from tests.claims import claim_record
from tests.jobs import ROOT, quick_args, units_committed, wait_for
from tests import warm_python

pytestmark = pytest.mark.slow


@pytest.fixture
def bitext(tmp_path):
    from tests.toydata import toy_bitext

    path = tmp_path / "in.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in toy_bitext(400, seed=31)[:48]))
    return path


def _alive(pids) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_a_stopped_job_releases_its_claim_only_after_its_workers_stopped(tmp_path, bitext, tiny_nmt_models):
    """SIGTERM to a job with two DirectRunner worker processes: at the instant its claim is
    released, none of them is alive (the old order released the claim first: for a moment the next
    start could take the output while the workers still wrote)."""
    out = tmp_path / "out"
    proc = warm_python.popen([sys.executable, "-m", "beam_pipelines.generate",
                              *quick_args(str(bitext), out, tiny_nmt_models, "--direct_running_mode",
                                          "multi_processing", "--direct_num_workers", "2")],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                             env={**os.environ, "PYTHONPATH": ROOT})
    wait_for(lambda: units_committed(str(out)) >= 1, proc, timeout=600)
    workers = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)
               if c.name() not in ("sh", "dash", "bash")]
    assert len(workers) >= 2
    assert claim_record(out)
    proc.send_signal(signal.SIGTERM)
    alive_at_release = None
    deadline = time.time() + 60
    while time.time() < deadline:
        if not claim_record(out):
            alive_at_release = _alive(workers)
            break
        time.sleep(0.002)
    proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert alive_at_release == [], alive_at_release


def test_a_dask_task_that_outlives_its_driver_writes_nothing_after_a_takeover(tmp_path, bitext, tiny_nmt_models,
                                                                            dask_cluster):
    """A Dask worker is paused (SIGSTOP) in the middle of its units; the driver is killed outright
    and the same command, run again here, takes the output over and publishes; the worker then
    resumes: its unit's files and record are refused (its run's claim is gone), so nothing is left
    behind that the published run does not list (its late writes used to land after the clean-up,
    for good)."""
    out = tmp_path / "out"
    args = quick_args(str(bitext), out, tiny_nmt_models, "--unit_pairs", "12")     # four units of a second or two
    driver = warm_python.popen([sys.executable, "-m", "beam_pipelines.generate", *args, "--runner", "DaskRunner",
                                "--dask_client_address", dask_cluster],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                               env={**os.environ, "PYTHONPATH": ROOT})
    wait_for(lambda: units_committed(str(out)) >= 1, driver, timeout=600)
    workers = [p for p in psutil.process_iter(["cmdline"]) if "spawn_main" in " ".join(p.info["cmdline"] or [])
               and any("dask_worker" in " ".join(a.cmdline()) for a in p.parents())]
    assert workers
    for w in workers:
        w.suspend()                                         # SIGSTOP: mid-unit, with its claim's token
    try:
        os.killpg(driver.pid, signal.SIGKILL)               # the driver, without a word
        driver.communicate(timeout=60)
        again = warm_python.run([sys.executable, "-m", "beam_pipelines.generate", *args], cwd=ROOT, text=True,
                                capture_output=True, timeout=900, env={**os.environ, "PYTHONPATH": ROOT})
        assert again.returncode == 0, again.stderr[-3000:]
        published = rows(str(out))
        assert published and not leftovers(str(out))
    finally:
        for w in workers:
            w.resume()
    _until_tasks_ended(dask_cluster)                        # the resumed tasks ran to their ends
    assert rows(str(out)) == published
    assert not leftovers(str(out)), leftovers(str(out))


def _until_tasks_ended(address: str) -> None:
    """Until no worker of the cluster at ADDRESS runs a task: a listing taken while a resumed task
    still writes would race its renames (it was a fixed 15 s, too short on a loaded machine)."""
    from distributed import Client

    def _tasks_running(dask_worker) -> int:
        # a task whose driver went away is "cancelled" but stays in ``executing`` until its thread
        # returns (distributed's worker state machine); nested: the workers cannot import this module
        return len(dask_worker.state.executing) + len(dask_worker.state.long_running)

    with Client(address, timeout=120) as client:
        deadline = time.time() + 600
        while sum(client.run(_tasks_running).values()) and time.time() < deadline:
            time.sleep(0.5)
        assert not sum(client.run(_tasks_running).values()), "tasks still running after 600 s"
