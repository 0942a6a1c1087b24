"""GPU sharing without a GPU: the run's CUDA MPS control daemon (beam_pipelines/generation/mps.py)
and the --decode_step / --mps checks.

NVIDIA's nvidia-cuda-mps-control cannot run here (no GPU, no driver): a small script of that name
on PATH plays it, recording how it was called (arguments, the two MPS directory variables, what
it read on stdin). What is tested is the job's side: where the directories go, that the worker
processes inherit them, that the daemon is told to quit however the block ends, that nothing is
left behind, and what the manifest would record; that it speeds anything up is for a GPU
(docs/benchmarks.md)."""
import json
import os
import stat
import subprocess
import sys

import pytest

from beam_pipelines.generation.mps import CONTROL, MpsDaemon, check_mps
from common.cli import UsageError

FAKE = r"""#!/usr/bin/env python3
import json, os, sys
stdin = "" if sys.stdin.isatty() else sys.stdin.read()
with open(os.environ["FAKE_MPS_LOG"], "a") as f:
    f.write(json.dumps({"args": sys.argv[1:], "stdin": stdin,
                        "pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
                        "log": os.environ.get("CUDA_MPS_LOG_DIRECTORY")}) + "\n")
sys.exit(int(os.environ.get("FAKE_MPS_EXIT", "0")))
"""


def install_fake_control(folder) -> tuple[dict, callable]:
    """FOLDER/bin/nvidia-cuda-mps-control (the script above): (the environment variables that put
    it first on PATH and name its log, a function that reads the calls it recorded)."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    exe = bin_dir / CONTROL
    exe.write_text(FAKE)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    log = folder / "calls.jsonl"
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_MPS_LOG": str(log)}
    return env, lambda: [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def fake_control(tmp_path, monkeypatch):
    env, calls = install_fake_control(tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for name in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        monkeypatch.delenv(name, raising=False)
    return calls


def test_the_daemon_runs_in_the_runs_temporary_space_for_the_workers_and_quits(fake_control, tmp_path):
    temp = tmp_path / "run-temp"
    temp.mkdir()
    with MpsDaemon("auto", gpu=True, processes_per_gpu=4, temp_root=str(temp)) as mps:
        assert mps.state.to_dict() == {"on": True, "how": "started"}
        pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
        assert pipe.startswith(str(temp)) and os.path.isdir(pipe)
        assert os.path.isdir(os.environ["CUDA_MPS_LOG_DIRECTORY"])
        # a worker process started now (as the DirectRunner starts them) inherits the daemon's pipe
        seen = subprocess.run([sys.executable, "-c", "import os; print(os.environ['CUDA_MPS_PIPE_DIRECTORY'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        assert seen == pipe
    calls = fake_control()
    assert [c["args"] for c in calls] == [["-d"], []]
    assert calls[1]["stdin"] == "quit\n"
    assert calls[0]["pipe"] == calls[1]["pipe"] == pipe
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ and "CUDA_MPS_LOG_DIRECTORY" not in os.environ
    assert os.listdir(temp) == []                       # nothing left behind


def test_the_daemon_quits_when_the_job_fails_inside(fake_control, tmp_path):
    with pytest.raises(RuntimeError, match="the pipeline failed"):
        with MpsDaemon("on", gpu=True, processes_per_gpu=2, temp_root=str(tmp_path)):
            raise RuntimeError("the pipeline failed")
    assert [c["args"] for c in fake_control()] == [["-d"], []]
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ and sorted(os.listdir(tmp_path)) == ["bin", "calls.jsonl"]


STOPPED_JOB = r"""
import sys, time
from common import stopping
from beam_pipelines.generation.mps import MpsDaemon
with stopping.Stopping("a job"), MpsDaemon("on", gpu=True, processes_per_gpu=2, temp_root=sys.argv[1]):
    print("ready", flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_the_daemon_quits_when_the_job_is_stopped(fake_control, tmp_path, sig):
    # a stop ends the job's process with os._exit, past the daemon's with-block: it must quit all the same
    import signal

    temp = tmp_path / "run-temp"
    temp.mkdir()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.Popen([sys.executable, "-c", STOPPED_JOB, str(temp)], cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": root})
    assert proc.stdout.readline() == "ready\n", proc.stderr.read()
    proc.send_signal(getattr(signal, sig))
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    calls = fake_control()
    assert [c["args"] for c in calls] == [["-d"], []], err[-2000:]
    assert calls[1]["stdin"] == "quit\n" and os.listdir(temp) == []


@pytest.mark.parametrize("mode, gpu, processes, why", [
    ("off", True, 4, "off"), ("auto", False, 4, "cpu"), ("auto", True, 1, "one process per GPU")])
def test_no_daemon_where_it_is_not_wanted(fake_control, tmp_path, mode, gpu, processes, why):
    with MpsDaemon(mode, gpu=gpu, processes_per_gpu=processes, temp_root=str(tmp_path)) as mps:
        assert mps.state.to_dict() == {"on": False, "how": why}
        assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    assert fake_control() == []


def test_a_daemon_the_environment_names_is_used_not_started(fake_control, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "admins"))
    with MpsDaemon("auto", gpu=True, processes_per_gpu=4) as mps:
        assert mps.state.to_dict() == {"on": True, "how": "external"}
    assert fake_control() == [] and os.environ["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "admins")


def test_a_daemon_that_fails_to_start_is_said_or_refused(fake_control, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_EXIT", "1")
    with MpsDaemon("auto", gpu=True, processes_per_gpu=4, temp_root=str(tmp_path)) as mps:
        assert not mps.state.on and "failed" in mps.state.how
    with pytest.raises(RuntimeError, match="--mps on: .* -d failed"):
        with MpsDaemon("on", gpu=True, processes_per_gpu=4, temp_root=str(tmp_path)):
            pass
    assert sorted(os.listdir(tmp_path)) == ["bin", "calls.jsonl"]


def test_mps_on_is_refused_where_it_cannot_be_had(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))                # no control binary
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    with pytest.raises(UsageError, match="not on PATH"):
        check_mps("on", "cuda", "DirectRunner", 4)
    with pytest.raises(UsageError, match="decodes on the CPU"):
        check_mps("on", "cpu", "DirectRunner", 4)
    with pytest.raises(UsageError, match="launcher"):
        check_mps("on", None, "DataflowRunner", 4)
    check_mps("auto", "cuda", "DirectRunner", 4)              # auto never refuses


@pytest.mark.slow
@pytest.mark.parametrize("extra, message", [
    (("--decode_step", "graphs"), "--decode_step graphs replays CUDA graphs and this job decodes on the CPU"),
    (("--mps", "on"), "--mps on: this job decodes on the CPU"),
])
def test_the_job_refuses_gpu_only_settings_on_the_cpu_before_writing(tiny_nmt_models, tmp_path, extra, message):
    from beam_pipelines.generate import run

    inp = tmp_path / "in.tsv"
    inp.write_text("ahoj\thello\n")
    with pytest.raises(UsageError, match=message):
        run(["--input", str(inp), "--output", str(tmp_path / "out"), "--device", "cpu",
             "--forward_model", os.path.join(tiny_nmt_models, "cs-en"), *extra])
    assert not (tmp_path / "out").exists()


def test_a_step_mode_for_a_ctranslate2_model_is_refused():
    from beam_pipelines.generation.devices import check_decode_step

    with pytest.raises(UsageError, match="ctranslate2 model, which decodes its own way"):
        check_decode_step("compiled", {"engine": "ctranslate2"}, "cpu", "DirectRunner")
    check_decode_step("auto", {"engine": "ctranslate2"}, "cpu", "DirectRunner")
    check_decode_step("compiled", {"engine": "fairseq"}, "cpu", "DirectRunner")


def test_a_worker_knows_whether_an_mps_daemon_serves_it(tmp_path):
    """A worker records whether its GPU work goes through MPS (the manifest's gpu_sharing on every
    runner): a control daemon listens where the CUDA driver looks (its named pipe ``control``)."""
    from models.nmt.devices import under_mps

    pipes = tmp_path / "pipes"
    pipes.mkdir()
    assert not under_mps({"CUDA_MPS_PIPE_DIRECTORY": str(pipes)})
    os.mkfifo(pipes / "control")
    assert under_mps({"CUDA_MPS_PIPE_DIRECTORY": str(pipes)})
    assert not under_mps({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "none")})
