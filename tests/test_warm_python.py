"""A job forked from the warm interpreter (tests/warm_python.py) is what a fresh ``python -m`` is:
the same rows and lines printed, the same refusal, its own session, signals and exit status; most
tests start their jobs that way."""
import os
import re
import signal
import subprocess
import sys

import pytest

from tests import warm_python
from tests.jobs import committed_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _both(command, **kwargs):
    kwargs = {"cwd": ROOT, "capture_output": True, "text": True, "timeout": 600, **kwargs}
    fresh = subprocess.run(command, **kwargs)
    warm = warm_python.run(command, **kwargs)
    return fresh, warm


def _steady(text: str, *paths) -> list[str]:
    """TEXT's lines without what differs between two runs: times, rates, run ids, PATHS."""
    for path in paths:
        text = text.replace(str(path), "OUT")
    text = re.sub(r"\d{8}T\d{6}Z-[0-9a-f]{6}", "RUN", text)
    text = re.sub(r"\d+(\.\d+)?", "N", text)
    # the stage line is ordered by time; progress lines come every few seconds, as many as it takes
    return [line for line in text.splitlines() if "by stage" not in line and "paragen.progress" not in line]


@pytest.mark.slow
def test_a_warm_job_gives_a_fresh_processs_rows_and_lines(tiny_nmt_models, tmp_path):
    bitext = tmp_path / "in.tsv"
    with open(os.path.join(ROOT, "examples", "cs-en.example.tsv"), encoding="utf-8") as f:
        bitext.write_text("".join(f.readline() for _ in range(12)), encoding="utf-8")
    args = ["--input", str(bitext), "--forward_model", os.path.join(tiny_nmt_models, "cs-en"),
            "--backward_model", os.path.join(tiny_nmt_models, "en-cs"), "--num_sets", "2", "--num_samples", "3"]
    fresh = subprocess.run([sys.executable, "-m", "beam_pipelines.generate", *args, "--output", str(tmp_path / "a")],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
    warm = warm_python.run([sys.executable, "-m", "beam_pipelines.generate", *args, "--output", str(tmp_path / "b")],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert fresh.returncode == warm.returncode == 0, (fresh.stderr[-2000:], warm.stderr[-2000:])
    assert committed_rows(tmp_path / "a") == committed_rows(tmp_path / "b") != []
    assert _steady(fresh.stdout, tmp_path / "a") == _steady(warm.stdout, tmp_path / "b")
    log = [re.sub(r"^\S+ \S+ ", "", line) for line in _steady(warm.stderr, tmp_path / "b")]
    assert log == [re.sub(r"^\S+ \S+ ", "", line) for line in _steady(fresh.stderr, tmp_path / "a")]


def test_a_refusal_prints_what_a_fresh_process_prints(tmp_path):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    for args in (["--input", str(tmp_path / "nope.tsv"), "--output", str(tmp_path / "out"), "--forward_model",
                  str(tmp_path), "--presett", "paranmt"],
                 ["--input", str(tmp_path / "nope.tsv"), "--output", str(tmp_path / "out"), "--forward_model",
                  str(tmp_path / "no-model")]):
        fresh, warm = _both([sys.executable, "-m", "beam_pipelines.generate", *args], env=env)
        assert fresh.returncode == warm.returncode == 2
        assert fresh.stderr == warm.stderr and "error:" in warm.stderr and "Traceback" not in warm.stderr
        assert fresh.stdout == warm.stdout
    assert not os.path.exists(tmp_path / "out")


def test_a_warm_job_reads_its_environment_in_its_own_session_and_place(tiny_nmt_models, tmp_path):
    from tests.crash_points import _until_stopped

    (tmp_path / "in.tsv").write_text("Pes běží.\tA dog runs.\n", encoding="utf-8")
    # PARAGEN_CRASH_AT: the job stops itself (SIGSTOP) before its first storage operation
    proc = warm_python.popen([sys.executable, "-m", "beam_pipelines.generate", "--input", "in.tsv", "--output", "out",
                              "--forward_model", os.path.join(tiny_nmt_models, "cs-en")],
                             cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True, env={**os.environ, "PARAGEN_CRASH_AT": "1:STOP"})
    try:
        assert os.getsid(proc.pid) == proc.pid                  # at once, as after subprocess.Popen: killpg works
        assert _until_stopped(proc), proc.communicate()
        assert os.getsid(proc.pid) == proc.pid != os.getpid()
        assert os.readlink(f"/proc/{proc.pid}/cwd") == str(tmp_path)
        with pytest.raises(subprocess.TimeoutExpired):          # stopped: it cannot have ended
            proc.wait(0.01)
    finally:
        proc.kill()
    proc.communicate(timeout=600)
    assert proc.returncode == -signal.SIGKILL


def test_what_is_not_a_preloaded_module_runs_as_a_real_process():
    done = warm_python.run([sys.executable, "-c", "import sys; print(sys.argv)"], capture_output=True, text=True,
                           timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "['-c']"
    with pytest.raises(ValueError):
        warm_python.WarmPopen([sys.executable, "-c", "pass"])


def test_what_only_a_starting_process_reads_gets_a_fresh_process(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("print('sitecustomize ran')\n")
    base = warm_python.zygote_env()
    assert warm_python.needs_fresh(base) is None and warm_python.needs_fresh({**base, "PYTHONPATH": ROOT}) is None
    for env, why in (({**base, "LD_PRELOAD": "/nonexistent/shim.so"}, "LD_PRELOAD"),
                     ({**base, "OMP_NUM_THREADS": "7"}, "OMP_NUM_THREADS"),
                     ({**base, "PYTHONHASHSEED": "123"}, "PYTHONHASHSEED"),
                     ({**base, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}, f"PYTHONPATH {site}")):
        assert warm_python.needs_fresh(env) == why
        with pytest.raises(ValueError, match=why):
            warm_python.WarmPopen([sys.executable, "-m", "beam_pipelines.generate", "--help"], env=env)
    # popen gives those a real process: the sitecustomize.py on its PYTHONPATH runs
    done = warm_python.run([sys.executable, "-m", "beam_pipelines.generate", "--help"], capture_output=True, text=True,
                           timeout=600, env={**base, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"})
    assert done.returncode == 0 and done.stdout.startswith("sitecustomize ran")


def test_a_script_runs_warm_as_python_script_runs_it(tmp_path):
    script = tmp_path / "tool.py"
    script.write_text("import os, sys\nprint(__name__, sys.argv, sys.path[0], __file__, os.getcwd())\n"
                      "sys.exit(3)\n")
    fresh, warm = _both([sys.executable, str(script), "--flag", "x y"], cwd=str(tmp_path))
    assert fresh.returncode == warm.returncode == 3
    assert fresh.stdout == warm.stdout and fresh.stdout.startswith("__main__ [")
    proc = warm_python.popen([sys.executable, str(script)], stdout=subprocess.DEVNULL)
    assert isinstance(proc, warm_python.WarmPopen) and proc.wait(600) == 3


def test_a_change_of_this_process_environment_starts_the_zygote_again(monkeypatch, tmp_path):
    # as the CTranslate2 engine does when a test loads it in-process (OMP_WAIT_POLICY=PASSIVE)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE" if os.environ.get("OMP_WAIT_POLICY") != "PASSIVE" else "ACTIVE")
    assert warm_python.needs_fresh(None) is None
    proc = warm_python.popen([sys.executable, "-m", "beam_pipelines.generate", "--presett", "x"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert isinstance(proc, warm_python.WarmPopen)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 2 and "error:" in err


def test_a_job_given_the_zygote_address_starts_warm_jobs_of_its_own(tmp_path):
    """What the bench smoke tier does: the script is a fork, and so are the jobs it starts
    (bench/fresh_process.py's job_run), forks of this test process's zygote, with their pipes and
    exit status as from a process."""
    inner = tmp_path / "job.py"          # its monitor's parent: the zygote that forked it
    inner.write_text("import os, sys\n"
                     "print(open(f'/proc/{os.getppid()}/stat').read().rsplit(')', 1)[1].split()[1])\n"
                     "sys.exit(4)\n")
    outer = tmp_path / "bench_like.py"
    outer.write_text("import subprocess, sys\n"
                     "from tests import warm_python\n"
                     f"proc = warm_python.popen([sys.executable, {str(inner)!r}], stdout=subprocess.PIPE, text=True)\n"
                     "out, _ = proc.communicate(timeout=600)\n"
                     "print(type(proc).__name__, proc.returncode, out.strip())\n")
    env = {**os.environ, "PYTHONPATH": ROOT, warm_python.ADDRESS_VARIABLE: warm_python.address()}
    done = warm_python.run([sys.executable, str(outer)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                           env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == f"WarmPopen 4 {warm_python._zygote().proc.pid}\n"
