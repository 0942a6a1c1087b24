"""Deployment scripts: valid shell, usable --help, and refresh.sh semantics with a stand-in job."""
import configparser
import glob
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "deploy", "*.sh")))


@pytest.mark.parametrize("script", SCRIPTS, ids=os.path.basename)
def test_script_syntax_strict_mode_and_help(script):
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    assert "set -euo pipefail" in open(script).read()
    done = subprocess.run(["bash", script, "--help"], capture_output=True, text=True, timeout=30, env={"PATH": os.environ["PATH"]})
    assert done.returncode == 0 and "usage:" in done.stdout


def test_systemd_units_parse():
    for name, keys in (("paragen-refresh.service", [("Service", "ExecStart"), ("Service", "Type")]),
                       ("paragen-refresh.timer", [("Timer", "OnCalendar"), ("Install", "WantedBy")])):
        cp = configparser.ConfigParser(strict=False)
        cp.optionxform = str
        cp.read(os.path.join(ROOT, "deploy", name))
        for section, key in keys:
            assert cp.get(section, key)


def _refresh(tmp_path, run_id, job, keep=2, **extra_env):
    env = {**os.environ, "OUT_ROOT": str(tmp_path), "RUN_ID": run_id, "KEEP": str(keep), "PARAGEN_JOB_CMD": job,
           **extra_env}
    return subprocess.run(["bash", os.path.join(ROOT, "deploy", "refresh.sh"), "--input", "x"],
                          env=env, capture_output=True, text=True, timeout=30)


def test_refresh_moves_latest_only_on_success_and_prunes(tmp_path):
    ok = "python3 -c \"import sys,os; o=sys.argv[sys.argv.index('--output')+1]; os.makedirs(o); open(o+'/_manifest.json','w').write('{}')\""
    for day in ("2026-01-01", "2026-01-08", "2026-01-15"):
        assert _refresh(tmp_path, day, ok).returncode == 0
    assert os.readlink(tmp_path / "latest") == "2026-01-15"
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir() and not p.is_symlink() and p.name != "logs") == \
        ["2026-01-08", "2026-01-15"]
    failed = _refresh(tmp_path, "2026-01-22", "false")
    assert failed.returncode != 0 and os.readlink(tmp_path / "latest") == "2026-01-15"
    assert (tmp_path / "logs" / "2026-01-22.log").exists()


def test_refresh_runs_the_filter_job_and_moves_latest_only_if_it_succeeds(tmp_path):
    ok = "python3 -c \"import sys,os; o=sys.argv[sys.argv.index('--output')+1]; os.makedirs(o)\""
    # stand-in filter: records its arguments where the real one writes its manifest
    filt = "python3 -c \"import sys,os,json; o=sys.argv[sys.argv.index('--output')+1]; os.makedirs(o); " \
           "json.dump(sys.argv[1:], open(o+'/args.json','w'))\""
    done = _refresh(tmp_path, "2026-02-01", ok, PARAGEN_FILTER_CMD=filt, FILTER_ARGS="--config paranmt --encoder /m/enc")
    assert done.returncode == 0, done.stderr
    import json
    args = json.load(open(tmp_path / "2026-02-01" / "filtered" / "args.json"))
    assert args[:2] == ["--input", str(tmp_path / "2026-02-01")] and args[-4:] == ["--config", "paranmt", "--encoder", "/m/enc"]
    assert os.readlink(tmp_path / "latest") == "2026-02-01"
    failed = _refresh(tmp_path, "2026-02-08", ok, PARAGEN_FILTER_CMD="false", FILTER_ARGS="--config paranmt")
    assert failed.returncode != 0 and "filter job failed" in failed.stderr
    assert os.readlink(tmp_path / "latest") == "2026-02-01"


def test_image_carries_every_package_setup_py_installs():
    import re

    setup = open(os.path.join(ROOT, "setup.py")).read()
    packages = re.findall(r'"(\w+)\*"', re.search(r"find_packages\(include=\[(.*?)\]", setup).group(1))
    copied = re.findall(r"^COPY (\w+) \./\1$", open(os.path.join(ROOT, "deploy", "Dockerfile")).read(), re.M)
    assert packages and sorted(packages) == sorted(copied)


def test_dask_launcher_runs_the_filter_job_on_a_local_cluster(tmp_path):
    """JOB=filter deploy/run_dask.sh --local 2: a real scheduler and two workers, then the job."""
    import json
    import sys

    from tests.toydata import paraphrase_rows, toy_paraphrases, write_generation_run

    write_generation_run(tmp_path / "gen", paraphrase_rows(toy_paraphrases(60, seed=5)))
    (tmp_path / "cfg.yaml").write_text("filters:\n  - name: ngram_overlap\n    thresholds: {trigram_overlap: {max: 0.5}}\n")
    env = {**os.environ, "JOB": "filter", "PYTHON": sys.executable}
    done = subprocess.run(["bash", os.path.join(ROOT, "deploy", "run_dask.sh"), "--local", "2",
                           "--input", str(tmp_path / "gen"), "--output", str(tmp_path / "out"),
                           "--config", str(tmp_path / "cfg.yaml"), "--no_report"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.load(open(tmp_path / "out" / "_filter_manifest.json"))
    assert manifest["reconciled"] and manifest["rows_in"] == 60
    assert 0 < manifest["kept"] < 60 and "trigram_overlap>max" in manifest["rejected_by_reason"]


@pytest.mark.parametrize("gpu", ["", "nvidia-tesla-t4"])
def test_dataflow_launcher_command(gpu):
    """PYTHON=echo prints the command the launcher would run."""
    env = {"PATH": os.environ["PATH"], "PYTHON": "echo", "PROJECT": "p", "REGION": "r", "TEMP": "gs://b/t",
           "IMAGE": "img", "JOB": "filter", "GPU": gpu}
    job = ["--input", "gs://b/gen", "--output", "gs://b/filtered", "--encoder", "gs://b/models/enc"]
    done = subprocess.run(["bash", os.path.join(ROOT, "deploy", "run_dataflow.sh"), *job],
                          env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    cmd = done.stdout.split()
    assert cmd[:2] == ["-m", "beam_pipelines.filter"] and "--runner" in cmd and "DataflowRunner" in cmd
    assert cmd[-6:] == job and "--sdk_container_image" in cmd
    for local in (["--input", "/gcs/x"], ["--output=/data/out"], ["--input", "gs://b/x", "--encoder", "runs/enc"]):
        bad = subprocess.run(["bash", os.path.join(ROOT, "deploy", "run_dataflow.sh"), *local],
                             env=env, capture_output=True, text=True, timeout=30)
        assert bad.returncode == 2 and "use a gs:// URL" in bad.stderr and not bad.stdout
    if gpu:
        assert "--experiments=no_use_multiple_sdk_containers" in cmd and "--torch_threads" not in cmd
    else:                                # one SDK process per vCPU: one torch thread each
        assert cmd[cmd.index("--torch_threads") + 1] == "1"


def test_flink_launcher_command():
    env = {"PATH": os.environ["PATH"], "PYTHON": "echo", "FLINK_MASTER": "h:8081", "IMAGE": "img"}
    job = ["--input", "s3://b/bitext/*.tsv.gz", "--output", "s3://b/out", "--forward_model", "s3://b/m/cs-en",
           "--preset", "paranmt"]
    done = subprocess.run(["bash", os.path.join(ROOT, "deploy", "run_flink.sh"), *job],
                          env=env, capture_output=True, text=True, timeout=30)
    cmd = done.stdout.split()
    assert done.returncode == 0 and cmd[:2] == ["-m", "beam_pipelines.generate"] and cmd[-len(job):] == job
    assert cmd[cmd.index("--flink_master") + 1] == "h:8081" and cmd[cmd.index("--environment_config") + 1] == "img"
    bad = subprocess.run(["bash", os.path.join(ROOT, "deploy", "run_flink.sh")], env={**env, "JOB": "x"},
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "JOB must be" in bad.stderr


def test_refresh_never_runs_filter_args_or_job_cmd_as_shell_code(tmp_path):
    """A ';' or '$(...)' in FILTER_ARGS / PARAGEN_JOB_CMD is an argument, not a command; the filter
    job that rejects such an argument fails the refresh, and latest stays where it was."""
    ok = "python3 -c \"import sys,os; o=sys.argv[sys.argv.index('--output')+1]; os.makedirs(o)\""
    marker = tmp_path / "pwned"
    strict_filter = ("python3 -c \"import sys,os,json; a=sys.argv[1:]; o=a[a.index('--output')+1]; "
                     "os.makedirs(o); json.dump(a, open(o+'/args.json','w')); "
                     "sys.exit(2 if any(';' in x or '$' in x for x in a) else 0)\"")
    assert _refresh(tmp_path, "2026-03-01", ok, PARAGEN_FILTER_CMD=strict_filter, FILTER_ARGS="--config a").returncode == 0
    done = _refresh(tmp_path, "2026-03-08", ok, PARAGEN_FILTER_CMD=strict_filter,
                    FILTER_ARGS=f"--config x; touch {marker}; echo $(touch {marker}2)")
    assert not marker.exists() and not (tmp_path / "pwned2").exists()
    assert done.returncode != 0 and "filter job failed" in done.stderr
    import json
    args = json.load(open(tmp_path / "2026-03-08" / "filtered" / "args.json"))
    assert "x;" in args and "touch" in args                # passed through as plain words
    assert os.readlink(tmp_path / "latest") == "2026-03-01"
    job = f"{ok} ; touch {marker}"
    done = _refresh(tmp_path, "2026-03-15", job)
    assert not marker.exists()
    unbalanced = _refresh(tmp_path, "2026-03-22", ok, FILTER_ARGS="--config 'x")
    assert unbalanced.returncode == 2 and "unbalanced" in unbalanced.stderr


@pytest.mark.parametrize("run_id", ["../escape", "a/b", ".hidden", "x\ny", "-rf"])
def test_refresh_refuses_run_ids_that_are_not_one_path_component(tmp_path, run_id):
    ok = "python3 -c \"import sys,os; o=sys.argv[sys.argv.index('--output')+1]; os.makedirs(o)\""
    done = _refresh(tmp_path / "root", run_id, ok)
    assert done.returncode == 2 and "RUN_ID" in done.stderr
    assert not (tmp_path / "escape").exists()
