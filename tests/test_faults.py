"""Faults caused for real in real runs, and what the job does about them without a person:

- SIGTERM (a preemption) stops the run and its worker processes within the grace period, in one
  line; the same command run again continues and gives the rows of an uninterrupted run; run once
  more it decodes nothing and exits 0;
- a worker process killed with SIGKILL ends the run in one line within seconds; the same command
  continues;
- a full disk (a small tmpfs) is one line naming the path and ENOSPC, the committed run stays
  whole, and once there is space the same command continues;
- a device error other than out-of-memory (injected through torch) ends the worker process with
  one line instead of turning its pairs into rejects; an injected out-of-memory error splits the
  batch and loses nothing;
- a bucket behind a proxy that fails requests (503, 500, dropped connections) gives the rows of a
  fault-free run; a store down for longer than the retry budget is one line, and the same command
  continues once it is back.
The full table, with timings, is bench/bench_faults.py (docs/operations.md, "What survives what").
"""
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from beam_pipelines.generate import run
from tests.jobs import committed_rows, quick_args, start_job, units_committed, wait_for
from tests.object_stores import s3_store  # noqa: F401: a fixture
from tests.claims import claim_record
from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MULTI = ("--direct_running_mode", "multi_processing", "--direct_num_workers", "2")


@pytest.fixture(scope="module")
def bitext(tmp_path_factory):
    from tests.toydata import toy_bitext

    path = tmp_path_factory.mktemp("in") / "toy.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in toy_bitext(400, seed=31)[:96]))
    return str(path)


_args, _rows = quick_args, committed_rows


_units, _job, _wait_for = units_committed, start_job, wait_for


def _workers(proc) -> list:
    """The Beam worker processes (Python, not the shells between) the job PROC started."""
    try:
        return [c for c in psutil.Process(proc.pid).children(recursive=True) if "sdk_worker_main" in " ".join(c.cmdline())
                and c.name() not in ("sh", "dash", "bash")]
    except psutil.Error:
        return []


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def _finish(proc, timeout=60) -> tuple[int, str]:
    _out, err = proc.communicate(timeout=timeout)
    return proc.returncode, err.decode(errors="replace")


@pytest.fixture(scope="module")
def uninterrupted(bitext, tiny_nmt_models, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    manifest = run(_args(bitext, out, tiny_nmt_models))
    assert manifest["units"]["planned"] == 24 and manifest["counts"]["reconciled"]
    return out, manifest


@pytest.mark.slow
def test_sigterm_stops_run_and_workers_in_one_line_and_the_same_command_continues(bitext, tiny_nmt_models, tmp_path,
                                                                                   uninterrupted):
    out = tmp_path / "out"
    args = _args(bitext, out, tiny_nmt_models, *MULTI)
    proc = _job(args)
    _wait_for(lambda: _units(out) >= 3 and len(_workers(proc)) == 2, proc)
    workers = _workers(proc)
    proc.send_signal(signal.SIGTERM)
    rc, err = _finish(proc)
    assert rc == 128 + signal.SIGTERM, (rc, err[-2000:])
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)   # stopped with it
    errors = _error_lines(err)
    assert len(errors) == 1 and "stopped by SIGTERM" in errors[0] and "run the same command again" in errors[0]
    # stopped within the grace period by its own clean-up, not ended by the deadline (its line says
    # "outlasted"): the job's own clock, not a bound of this test's that load could break
    assert "outlasted" not in errors[0], errors[0]
    assert "Traceback" not in err, err[-3000:]
    committed = _units(out)
    assert 3 <= committed < 24 and f"{committed} of 24 work units committed" in errors[0]
    assert not (out / "_manifest.json").exists() and not claim_record(out)
    # the same command again: continues, and ends with the uninterrupted rows
    proc = _job(args)
    rc, err = _finish(proc, timeout=600)
    assert rc == 0, err[-3000:]
    manifest = json.load(open(out / "_manifest.json"))
    assert manifest["resumed"] and manifest["units"]["reused_from_earlier_attempt"] == committed
    assert manifest["counts"] == uninterrupted[1]["counts"]
    assert _rows(out) == _rows(uninterrupted[0]) and _rows(out, "rejects") == _rows(uninterrupted[0], "rejects")
    # and once more: nothing to do
    done = warm_python.run([sys.executable, "-m", "beam_pipelines.generate", *args], cwd=ROOT, capture_output=True,
                           text=True, timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0 and "nothing to do" in done.stdout, done.stderr[-2000:]
    assert json.load(open(out / "_manifest.json")) == manifest


@pytest.mark.slow
def test_a_killed_worker_process_ends_the_run_in_one_line_and_the_same_command_continues(
        bitext, tiny_nmt_models, tmp_path, uninterrupted):
    out = tmp_path / "out"
    args = _args(bitext, out, tiny_nmt_models, *MULTI)
    proc = _job(args)
    _wait_for(lambda: _units(out) >= 2 and len(_workers(proc)) == 2, proc)
    victim, other = _workers(proc)
    victim.kill()
    rc, err = _finish(proc)
    assert rc == 1, (rc, err[-2000:])
    errors = _error_lines(err)
    assert len(errors) == 1 and "a worker process ended" in errors[0] and "SIGKILL" in errors[0], err[-2000:]
    assert "Traceback" not in err and not (other.is_running() and other.status() != psutil.STATUS_ZOMBIE)
    assert not (out / "_manifest.json").exists()
    proc = _job(args)
    rc, err = _finish(proc, timeout=600)
    assert rc == 0, err[-3000:]
    assert _rows(out) == _rows(uninterrupted[0]) and _rows(out, "rejects") == _rows(uninterrupted[0], "rejects")


@pytest.fixture
def small_disk(tmp_path):
    """A 400 KiB tmpfs (needs the right to mount, as root in a container that allows it)."""
    from tests.disk_faults import Unavailable, small_disk

    try:
        with small_disk(str(tmp_path / "disk"), "400k") as mount:
            yield tmp_path / "disk"
    except Unavailable as exc:
        pytest.skip(str(exc))


@pytest.mark.slow
@pytest.mark.parametrize("free_pages", [0, 1, 2, 4])
def test_a_disk_full_while_the_driver_claims_or_plans_is_one_line(bitext, tiny_nmt_models, tmp_path, small_disk,
                                                                  free_pages):
    # the driver's own writes (its claim, plan.json, before any worker): one error line naming
    # the file, exit 1, no traceback; the disk filled to leave FREE_PAGES pages of 4 KiB
    filler = small_disk / "filler"
    with open(filler, "wb") as f:
        with contextlib.suppress(OSError):
            f.write(b"\0" * (400 << 10))
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    os.truncate(filler, max(0, os.path.getsize(filler) + free - free_pages * 4096))
    first = tmp_path / "first.tsv"
    first.write_text("".join(open(bitext).readlines()[:4]))
    done = warm_python.run([sys.executable, "-m", "beam_pipelines.generate",
                            *_args(str(first), small_disk / "out", tiny_nmt_models)], cwd=ROOT, capture_output=True,
                           text=True, timeout=600, env={**os.environ, "PYTHONPATH": ROOT})
    errors = _error_lines(done.stderr)
    assert done.returncode == 1 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "No space left on device (ENOSPC)" in errors[0] and str(small_disk / "out") in errors[0], errors


@pytest.mark.slow
def test_a_full_disk_is_one_line_the_committed_run_stays_and_the_same_command_continues(
        bitext, tiny_nmt_models, tmp_path, small_disk, uninterrupted):
    out = small_disk / "out"
    first = tmp_path / "first.tsv"
    first.write_text("".join(open(bitext).readlines()[:8]))
    assert run(_args(str(first), out, tiny_nmt_models))["counts"]["reconciled"]
    before = (json.load(open(out / "_manifest.json")), _rows(out))
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (200 << 10))                     # leave too little for the next run
    args = _args(bitext, out, tiny_nmt_models, "--overwrite")
    done = warm_python.run([sys.executable, "-m", "beam_pipelines.generate", *args], cwd=ROOT, capture_output=True,
                           text=True, timeout=600, env={**os.environ, "PYTHONPATH": ROOT})
    errors = _error_lines(done.stderr)
    assert done.returncode == 1 and len(errors) == 1, done.stderr[-3000:]
    assert "No space left on device (ENOSPC)" in errors[0] and str(out) in errors[0] and "Traceback" not in done.stderr
    assert (json.load(open(out / "_manifest.json")), _rows(out)) == before      # the committed run is whole
    filler.unlink()                                             # space freed: the same command continues
    from tests.disk_faults import grow

    grow(str(small_disk), "4m")
    done = warm_python.run([sys.executable, "-m", "beam_pipelines.generate", *args], cwd=ROOT, capture_output=True,
                           text=True, timeout=600, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr[-3000:]
    assert _rows(out) == _rows(uninterrupted[0]) and json.load(open(out / "_manifest.json"))["resumed"]


@pytest.mark.slow
def test_an_io_error_is_one_line_and_the_same_command_continues_on_a_sound_disk(bitext, tiny_nmt_models, tmp_path,
                                                                               uninterrupted):
    from tests.disk_faults import Unavailable, eio_env, eio_shim

    try:
        shim = eio_shim(str(tmp_path))
    except Unavailable as exc:
        pytest.skip(str(exc))
    out = tmp_path / "out"
    args = _args(bitext, out, tiny_nmt_models)
    env = {**os.environ, "PYTHONPATH": ROOT, **eio_env(shim, str(out), after=60)}
    done = warm_python.run([sys.executable, "-m", "beam_pipelines.generate", *args], cwd=ROOT, capture_output=True,
                           text=True, timeout=600, env=env)
    errors = _error_lines(done.stderr)
    assert done.returncode == 1 and len(errors) == 1, done.stderr[-3000:]
    assert "Input/output error (EIO)" in errors[0] and str(out) in errors[0] and "Traceback" not in done.stderr
    assert not (out / "_manifest.json").exists() and 0 < _units(out) < 24
    done = warm_python.run([sys.executable, "-m", "beam_pipelines.generate", *args], cwd=ROOT, capture_output=True,
                           text=True, timeout=600, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr[-3000:]
    assert _rows(out) == _rows(uninterrupted[0]) and _rows(out, "rejects") == _rows(uninterrupted[0], "rejects")


# torch itself fails (what a GPU would do), through a sitecustomize the worker processes import
_INJECT = '''
import os, torch, torch.nn.functional as F
_embedding, _calls = F.embedding, [0]
def embedding(*args, **kwargs):
    _calls[0] += 1
    if _calls[0] > int(os.environ["FAULT_AFTER"]):
        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
    return _embedding(*args, **kwargs)
F.embedding = embedding
'''

@pytest.mark.slow
@pytest.mark.parametrize("mode", ["in_memory", "multi_processing"])
def test_a_device_error_ends_the_worker_in_one_line_not_in_rejects(bitext, tiny_nmt_models, tmp_path, uninterrupted,
                                                                   mode):
    """Exit status 70 in either running mode (multi_processing, the GPU default, used to end 1),
    and the output's claim released (the in-memory runner used to leave its claim)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_INJECT)
    out = tmp_path / "out"
    args = _args(bitext, out, tiny_nmt_models, *(MULTI if mode == "multi_processing" else ()))
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "FAULT_AFTER": "400"}
    done = warm_python.run([sys.executable, "-m", "beam_pipelines.generate", *args], cwd=ROOT, capture_output=True,
                           text=True, timeout=600, env=env)
    errors = _error_lines(done.stderr)
    assert done.returncode == 70 and len(errors) == 1, done.stderr[-3000:]
    if mode == "in_memory":
        assert "failed while decoding unit" in errors[0] and "illegal memory access" in errors[0]
    else:
        assert "exit status 70: its device failed" in errors[0], errors
    assert not (out / "_manifest.json").exists() and not claim_record(out)
    # nothing it decoded became a decode_error reject; the next process (a healthy device) continues
    rc = warm_python.run([sys.executable, "-m", "beam_pipelines.generate", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, env={**os.environ, "PYTHONPATH": ROOT}).returncode
    assert rc == 0 and _rows(out) == _rows(uninterrupted[0])
    assert _rows(out, "rejects") == _rows(uninterrupted[0], "rejects")


@pytest.mark.slow
def test_an_out_of_memory_batch_is_split_and_loses_nothing(fwd, bwd, monkeypatch):
    import dataclasses

    import torch

    from paracorpus.config import PRESETS
    from paracorpus.paraphrasing import piece_limits
    from paracorpus.steps import decoding_steps
    from paracorpus.units import PAIR, generate_unit
    from tests.test_batch_independence import assert_same_rows
    from tests.toydata import toy_bitext

    pairs = toy_bitext(400, seed=32)[:6]
    elements = [(PAIR, {"pair_id": f"{i:016x}", "input_shard": "t.tsv", "input_index": i, "source": s,
                        "reference": t}) for i, (s, t) in enumerate(pairs)]
    cfg = dataclasses.replace(PRESETS["parabank2-cpu"], num_sets=1, num_samples=3, score_threshold=None,
                              dual_xent_threshold=None, batch_pairs=6)
    steps = decoding_steps(fwd, bwd, cfg, "h", piece_limits(fwd, bwd, 250))

    def unit():
        for engine in (fwd, bwd):
            engine.start_unit("h:0")            # as the worker does: a unit's randomness is its own
        return generate_unit(elements, steps, cfg.batch_pairs, "h")
    whole = unit()
    embedding = torch.nn.functional.embedding

    def out_of_memory_on_big_batches(tokens, *args, **kwargs):       # what a GPU does with too big a batch
        if tokens.shape[0] > 8:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return embedding(tokens, *args, **kwargs)
    monkeypatch.setattr(torch.nn.functional, "embedding", out_of_memory_on_big_batches)
    split = unit()
    assert split.counters["batches_out_of_memory"] == 1 and not split.rejects
    assert_same_rows(split.rows, whole.rows)             # a pair's rows do not depend on its batch-mates

    def device_side_assert(*_args, **_kwargs):
        raise torch.AcceleratorError("CUDA error: device-side assert triggered")
    monkeypatch.setattr(torch.nn.functional, "embedding", device_side_assert)
    from models.nmt.devices import DeviceFailure

    with pytest.raises(DeviceFailure, match="device-side assert"):
        unit()


@pytest.fixture(scope="module")
def small(bitext, tiny_nmt_models, tmp_path_factory):
    """(input, its uninterrupted run's output) of a quarter of BITEXT (6 units): for the bucket
    tests, where every file is a few requests through the proxy."""
    path = tmp_path_factory.mktemp("small") / "toy.tsv"
    path.write_text("".join(open(bitext).readlines()[:24]))
    out = tmp_path_factory.mktemp("small-whole")
    assert run(_args(str(path), out, tiny_nmt_models))["counts"]["reconciled"]
    return str(path), out


def _bucket_rows(s3, url, monkeypatch, table="paraphrases"):
    """The committed rows of the run at URL, read with S3's own endpoint (not the proxy)."""
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    return _rows(url, table)


@pytest.mark.slow
def test_a_flaky_bucket_gives_the_rows_of_a_fault_free_run(small, tiny_nmt_models, s3_store, monkeypatch):
    from tests.fault_proxy import FaultProxy

    url = f"s3://{s3_store.make_bucket()}/run"
    with FaultProxy(s3_store.endpoint, rate=0.10, seed=11) as proxy:
        env = {**s3_store.env, "AWS_ENDPOINT_URL": proxy.url, "AWS_ENDPOINT_URL_S3": proxy.url}
        proc = _job(_args(small[0], url, tiny_nmt_models), env)
        rc, err = _finish(proc, timeout=900)
    assert rc == 0, err[-3000:]
    assert all(proxy.counts[k] > 0 for k in ("503", "500", "reset")), proxy.counts
    assert _bucket_rows(s3_store, url, monkeypatch) == _rows(small[1])
    assert _bucket_rows(s3_store, url, monkeypatch, "rejects") == _rows(small[1], "rejects")


@pytest.mark.slow
def test_a_store_down_past_the_budget_is_one_line_and_the_same_command_continues(small, tiny_nmt_models, s3_store,
                                                                                monkeypatch):
    from tests.fault_proxy import FaultProxy

    bucket = s3_store.make_bucket()
    url = f"s3://{bucket}/run"
    fs = s3_store.filesystem()

    def units():
        from pyarrow import fs as pafs

        infos = fs.get_file_info(pafs.FileSelector(f"{bucket}/run/_work", recursive=True, allow_not_found=True))
        return sum(1 for i in infos if "/units/u" in i.path and i.path.endswith(".json"))
    with FaultProxy(s3_store.endpoint) as proxy:
        env = {**s3_store.env, "AWS_ENDPOINT_URL": proxy.url, "AWS_ENDPOINT_URL_S3": proxy.url,
               "PARAGEN_STORAGE_RETRY_SECONDS": "4", "PARAGEN_STORAGE_TIMEOUT": "3"}
        args = _args(small[0], url, tiny_nmt_models)
        proc = _job(args, env)
        _wait_for(lambda: units() >= 2, proc)
        proxy.down(3600)
        rc, err = _finish(proc, timeout=300)
        errors = _error_lines(err)
        assert rc == 1 and len(errors) == 1, err[-3000:]
        assert proxy.url.split("//")[1] in errors[0] and "PARAGEN_STORAGE_RETRY_SECONDS" in errors[0]
        assert "Traceback" not in err
        proxy.down(0)                                       # the store is back
        rc, err = _finish(_job(args, env), timeout=900)
    assert rc == 0, err[-3000:]
    assert _bucket_rows(s3_store, url, monkeypatch) == _rows(small[1])


@pytest.mark.slow
def test_a_killed_dask_worker_is_replaced_and_the_run_finishes_with_every_row(bitext, tiny_nmt_models, tmp_path,
                                                                             dask_cluster, uninterrupted):
    import threading

    out = tmp_path / "out"
    killed = []

    def kill_a_worker_mid_run():
        deadline = time.time() + 300
        while _units(out) < 2 and time.time() < deadline:
            time.sleep(0.1)
        workers = [p for p in psutil.process_iter(["cmdline"]) if "spawn_main" in " ".join(p.info["cmdline"] or [])
                   and any("dask_worker" in " ".join(a.cmdline()) for a in p.parents())]
        if workers:
            workers[0].kill()                   # SIGKILL: its nanny starts a new one, dask recomputes its tasks
            killed.append(workers[0].pid)
    killer = threading.Thread(target=kill_a_worker_mid_run)
    killer.start()
    manifest = run(_args(bitext, out, tiny_nmt_models, "--runner", "DaskRunner", "--dask_client_address",
                         dask_cluster))
    killer.join()
    assert killed and _units(out) == 0 and manifest["counts"] == uninterrupted[1]["counts"]
    assert _rows(out) == _rows(uninterrupted[0]) and _rows(out, "rejects") == _rows(uninterrupted[0], "rejects")


# the device of one worker process fails once in the whole cluster (FAULT_ONCE: made by the first)
_INJECT_ONCE = _INJECT.replace(
    '''    if _calls[0] > int(os.environ["FAULT_AFTER"]):
''', '''    if _calls[0] > int(os.environ["FAULT_AFTER"]) and _first(os.environ["FAULT_ONCE"]):
''') + '''
def _first(path):
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False
'''


@pytest.mark.slow
def test_a_dask_workers_failed_unit_reaches_the_drivers_log_and_manifest(bitext, tiny_nmt_models, tmp_path,
                                                                         uninterrupted, caplog, monkeypatch):
    """A worker process whose device fails while decoding a unit ends (exit 70); Dask runs its
    work again in a fresh process. The driver, which never sees the worker's log, says which unit
    failed on which worker and why (from the failure record the worker wrote), its progress line
    counts the failed attempt and the unit committed since, and the manifest records it."""
    import logging
    import re

    from tests.dask_cluster import local_dask_cluster

    site = tmp_path / "site"
    site.mkdir()
    assert "_first(" in _INJECT_ONCE
    (site / "sitecustomize.py").write_text(_INJECT_ONCE)
    fired = tmp_path / "fault-fired"
    env = {"PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "FAULT_AFTER": "150", "FAULT_ONCE": str(fired)}
    out = tmp_path / "out"
    monkeypatch.setenv("PARAGEN_PROGRESS_SECONDS", "0.5")
    with local_dask_cluster(str(tmp_path / "dask"), env=env) as address, \
            caplog.at_level(logging.INFO, logger="paragen.progress"):
        manifest = run(_args(bitext, out, tiny_nmt_models, "--runner", "DaskRunner", "--dask_client_address",
                             address))
    assert fired.exists()
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "paragen.progress"]
    warnings = [m for level, m in said if level == "WARNING"]
    assert len(warnings) == 1, said
    failed = re.match(r"(unit (\d+) failed on worker [^ ]+:\d+ while decoding: DeviceFailure: AcceleratorError: "
                      r"CUDA error: an illegal memory access was encountered); the runner may run it again$",
                      warnings[0])
    assert failed, warnings
    last = [m for level, m in said if m.startswith("progress: ")][-1]
    assert last.startswith("progress: 24 of 24 units (100%)")
    assert last.endswith(f"; failed attempts: 1 (unit {failed.group(2)}; 1 since committed)"), last
    assert manifest["units"]["failed_attempts"] == 1 and manifest["counters"]["unit_attempts_failed"] == 1
    assert manifest["units"]["failures"] == [failed.group(1)]
    assert _rows(out) == _rows(uninterrupted[0]) and _rows(out, "rejects") == _rows(uninterrupted[0], "rejects")


def test_a_stop_ends_the_jobs_processes_and_leaves_the_callers_alone():
    """What the job stops are the processes it started: a caller's servers (a test's moto, a
    notebook's Dask cluster) started before the job began are left running."""
    from common.stopping import Stopping, stop_descendants

    callers = subprocess.Popen(["sleep", "60"])
    try:
        with Stopping("a job"):
            jobs = subprocess.Popen(["sleep", "60"])
            assert stop_descendants() == 1
            assert jobs.poll() is not None                  # stopped (and reaped)
        assert callers.poll() is None
    finally:
        callers.kill()
        callers.wait()
