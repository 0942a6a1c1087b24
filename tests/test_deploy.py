"""Deployment scripts: valid shell, usable --help, and refresh.sh semantics with a stand-in job."""
import configparser
import glob
import json
import os
import signal
import subprocess
import sys
import time

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


def test_image_carries_every_package_setup_py_installs():
    """Every package setup.py installs is COPY'd into the image (the jobs run there), and so are
    the launchers the refresh runs from it."""
    import re

    setup = open(os.path.join(ROOT, "setup.py")).read()
    packages = re.findall(r'"(\w+)\*"', re.search(r"find_packages\(include=\[(.*?)\]", setup).group(1))
    copied = re.findall(r"^COPY (\w+) \./\1$", open(os.path.join(ROOT, "deploy", "Dockerfile")).read(), re.M)
    assert packages and set(packages) <= set(copied) and {"deploy", "scripts"} <= set(copied)


@pytest.mark.slow
def test_dask_launcher_runs_the_filter_job_on_a_local_cluster(tmp_path):
    """JOB=filter deploy/run_dask.sh --local 2: a real scheduler and two workers, then the job."""
    import json
    import sys

    from tests.toydata import paraphrase_rows, toy_paraphrases, write_generation_run

    write_generation_run(tmp_path / "gen", paraphrase_rows(toy_paraphrases(60, seed=5)))
    (tmp_path / "cfg.yaml").write_text("filters:\n  - name: ngram_overlap\n    thresholds: {trigram_overlap: {max: 0.5}}\n")
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "JOB": "filter", "PYTHON": sys.executable, "TMPDIR": str(tmp_path / "tmp")}
    launch = ["bash", os.path.join(ROOT, "deploy", "run_dask.sh"), "--local", "2", "--input", str(tmp_path / "gen"),
              "--config", str(tmp_path / "cfg.yaml"), "--no_report"]
    done = subprocess.run([*launch, "--output", str(tmp_path / "out")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not any(n.startswith("paragen-dask-") for n in os.listdir(tmp_path / "tmp"))    # its logs: gone
    manifest = json.load(open(tmp_path / "out" / "_filter_manifest.json"))
    assert manifest["reconciled"] and manifest["rows_in"] == 60
    assert 0 < manifest["kept"] < 60 and "trigram_overlap>max" in manifest["rejected_by_reason"]
    # a failed job keeps the cluster's logs and names them
    failed = subprocess.run([*launch, "--output", str(tmp_path / "gen")], env=env, capture_output=True, text=True,
                            timeout=300)
    assert failed.returncode != 0
    kept = [n for n in os.listdir(tmp_path / "tmp") if n.startswith("paragen-dask-")]
    assert len(kept) == 1 and f"logs: {tmp_path / 'tmp' / kept[0]}" in failed.stderr
    assert os.path.getsize(tmp_path / "tmp" / kept[0] / "scheduler.log") > 0


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
    for local in (["--input", "/gcs/x"], ["--output=/data/out"], ["--input", "gs://b/x", "--encoder", "runs/enc"],
                  ["--input", "gs://b/x", "local/part-2.tsv"], ["--previous", "runs/r1"], ["--bitext_encoder=runs/b"],
                  ["--divergence_model", "runs/d"], ["--input=gs://b/x", "--previous=runs/r1"]):
        bad = subprocess.run(["bash", os.path.join(ROOT, "deploy", "run_dataflow.sh"), *local],
                             env=env, capture_output=True, text=True, timeout=30)
        assert bad.returncode == 2 and "use a gs:// URL" in bad.stderr and not bad.stdout
    if gpu:       # SDK processes share the VM's GPU through MPS; the filter job has no GPU options
        assert "--experiments=no_use_multiple_sdk_containers" not in cmd and "--device" not in cmd
        assert any(a.endswith(";install-nvidia-driver;use_nvidia_mps") for a in cmd)
    else:                                # one SDK process per vCPU: one torch thread each
        assert cmd[cmd.index("--torch_threads") + 1] == "1"


@pytest.mark.parametrize("sharing,processes", [("", "8"), ("mps", "8"), ("single", "1")])
def test_dataflow_gpu_workers_share_the_gpu_or_not(sharing, processes):
    env = {"PATH": os.environ["PATH"], "PYTHON": "echo", "PROJECT": "p", "REGION": "r", "TEMP": "gs://b/t",
           "IMAGE": "img", "GPU": "nvidia-l4", "GPU_SHARING": sharing}
    done = subprocess.run(["bash", os.path.join(ROOT, "deploy", "run_dataflow.sh"), "--input", "gs://b/x"],
                          env=env, capture_output=True, text=True, timeout=30)
    cmd = done.stdout.split()
    assert done.returncode == 0, done.stderr
    assert cmd[cmd.index("--machine_type") + 1] == "g2-standard-8"           # 8 vCPUs: 8 SDK processes
    assert cmd[cmd.index("--device") + 1] == "cuda" and cmd[cmd.index("--processes_per_gpu") + 1] == processes
    assert ("--experiments=no_use_multiple_sdk_containers" in cmd) == (sharing == "single")
    bad = subprocess.run(["bash", os.path.join(ROOT, "deploy", "run_dataflow.sh")], env={**env, "GPU_SHARING": "x"},
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "GPU_SHARING" in bad.stderr


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




@pytest.mark.parametrize("gpu,machine", [("nvidia-tesla-t4", "n1-standard-8"), ("nvidia-l4", "g2-standard-8"),
                                         ("nvidia-tesla-a100", "a2-highgpu-1g"), ("nvidia-h100-80gb", "a3-highgpu-1g")])
def test_dataflow_machine_type_fits_the_gpu_and_the_disk_fits_the_image(gpu, machine):
    env = {"PATH": os.environ["PATH"], "PYTHON": "echo", "PROJECT": "p", "REGION": "r", "TEMP": "gs://b/t",
           "IMAGE": "img", "GPU": gpu}
    done = subprocess.run(["bash", os.path.join(ROOT, "deploy", "run_dataflow.sh"), "--input", "gs://b/x"],
                          env=env, capture_output=True, text=True, timeout=30)
    cmd = done.stdout.split()
    assert done.returncode == 0 and cmd[cmd.index("--machine_type") + 1] == machine
    assert int(cmd[cmd.index("--disk_size_gb") + 1]) >= 50
    assert any(a.startswith(f"worker_accelerator=type:{gpu};count:1;install-nvidia-driver") for a in cmd)
    bad = subprocess.run(["bash", os.path.join(ROOT, "deploy", "run_dataflow.sh")], env={**env, "GPU": "nvidia-x"},
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "unknown GPU type" in bad.stderr


@pytest.mark.parametrize("env_type,config", [("PROCESS", '{"command": "/opt/apache/beam/boot"}'),
                                             ("EXTERNAL", "pool:50000")])
def test_flink_environment_config_for_process_and_external(env_type, config, tmp_path):
    fake = ["-c", "import json, sys; print(json.dumps(sys.argv[1:]))"]
    jar = tmp_path / "beam-flink-job-server.jar"
    jar.write_bytes(b"")
    env = {"PATH": os.environ["PATH"], "PYTHON": sys.executable, "FLINK_MASTER": "h:8081", "ENV_TYPE": env_type,
           "WORKER_POOL": "pool:50000", "JOB_SERVER_JAR": str(jar)}
    script = open(os.path.join(ROOT, "deploy", "run_flink.sh")).read().replace(
        'exec "$PY" -m "beam_pipelines.$JOB"', 'exec "$PY" ' + " ".join(f"'{x}'" for x in fake))
    done = subprocess.run(["bash", "-c", script, "run_flink.sh", "--preset", "paranmt"], env=env,
                          capture_output=True, text=True, timeout=30, cwd=os.path.join(ROOT, "deploy"))
    assert done.returncode == 0, done.stderr
    args = json.loads(done.stdout)
    assert args[args.index("--environment_type") + 1] == env_type
    assert args[args.index("--environment_config") + 1] == config
    assert args[args.index("--flink_job_server_jar") + 1] == str(jar)
    missing = subprocess.run(["bash", "-c", script, "run_flink.sh"], env={**env, "JOB_SERVER_JAR": str(tmp_path / "no.jar")},
                             capture_output=True, text=True, timeout=30, cwd=os.path.join(ROOT, "deploy"))
    assert missing.returncode == 2 and "no.jar: no such file" in missing.stderr


def test_systemd_units_verify(tmp_path):
    """systemd's own checker accepts the units as shipped (paths moved to this checkout, where the
    scripts they run exist)."""
    import shutil

    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed")
    names = ["paragen-refresh.service", "paragen-refresh.timer", "paragen-refresh-notify@.service"]
    for name in names:
        text = open(os.path.join(ROOT, "deploy", name)).read()
        (tmp_path / name).write_text(text.replace("/opt/paragen", ROOT).replace("User=paragen", "User=root"))
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", *names], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


@pytest.mark.slow
def test_refresh_sh_exits_non_zero_when_a_job_fails(tmp_path):
    """systemd calls OnFailure= when refresh.sh exits non-zero: a failing job must make it so."""
    env = {**os.environ, "OUT_ROOT": str(tmp_path / "root"), "PYTHON": sys.executable, "PARAGEN_JOB_CMD": "false"}
    done = subprocess.run(["bash", os.path.join(ROOT, "deploy", "refresh.sh"), "--input", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "generation job failed" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "root" / "latest.json").exists()


def test_systemd_failure_hook_calls_the_operators_command(tmp_path):
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str
    cp.read(os.path.join(ROOT, "deploy", "paragen-refresh.service"))
    assert cp.get("Unit", "OnFailure") == "paragen-refresh-notify@%n.service"
    notify = configparser.ConfigParser(strict=False, interpolation=None)
    notify.optionxform = str
    notify.read(os.path.join(ROOT, "deploy", "paragen-refresh-notify@.service"))
    assert notify.get("Service", "ExecStart").endswith("deploy/notify.sh %i")
    marker = tmp_path / "called"
    hook = f"{sys.executable} -c \"import sys; open(sys.argv[1], 'w').write(sys.argv[2])\" {marker}"
    done = subprocess.run(["bash", os.path.join(ROOT, "deploy", "notify.sh"), "paragen-refresh.service"],
                          env={"PATH": os.environ["PATH"], "PARAGEN_NOTIFY_CMD": hook}, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "paragen-refresh.service"
    default = subprocess.run(["bash", os.path.join(ROOT, "deploy", "notify.sh"), "paragen-refresh.service"],
                             env={"PATH": os.environ["PATH"]}, capture_output=True, text=True, timeout=30)
    assert default.returncode == 0


def test_kubernetes_cronjob_runs_a_valid_refresh():
    import yaml

    import shlex

    from beam_pipelines.filter import build_parser as filter_parser
    from beam_pipelines.generate import build_parser as generate_parser
    from beam_pipelines.refresh import build_parser as refresh_parser

    doc = yaml.safe_load(open(os.path.join(ROOT, "deploy", "k8s", "paragen-refresh-cronjob.yaml")))
    assert doc["kind"] == "CronJob" and doc["spec"]["concurrencyPolicy"] == "Forbid"
    pod = doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    cmd = container["command"]
    assert cmd[:3] == ["python", "-m", "beam_pipelines.refresh"]
    args = refresh_parser().parse_args(cmd[3:])
    assert args.root.startswith("s3://") and args.keep >= 1
    job = args.job_args[1:] if args.job_args[:1] == ["--"] else args.job_args
    known, unknown = generate_parser().parse_known_args([*job, "--output", "s3://x/runs/r1"])
    assert not unknown and all(p.startswith("s3://") for p in (known.input[0], known.forward_model,
                                                                known.backward_model))
    filter_known, filter_unknown = filter_parser().parse_known_args(
        ["--input", "s3://x/run", "--output", "s3://x/run/filtered", *shlex.split(args.filter_args)])
    assert not filter_unknown and filter_known.encoder.startswith("s3://")
    for launcher in (args.job_cmd, args.filter_cmd):
        script = launcher.split()[-1]
        assert os.path.isfile(os.path.join(ROOT, script))          # and the image copies deploy/
    assert "COPY deploy ./deploy" in open(os.path.join(ROOT, "deploy", "Dockerfile")).read()
    env = {e["name"] for e in container["env"]}
    assert {"FLINK_MASTER", "IMAGE"} <= env


def _linter(name):
    path = os.path.join(os.path.dirname(sys.executable), name)
    if not os.path.exists(path):
        pytest.skip(f"{name} is not installed (requirements.txt pins it: run scripts/bootstrap.sh)")
    return path


def test_dockerfile_lints_clean():
    done = subprocess.run([_linter("hadolint"), os.path.join(ROOT, "deploy", "Dockerfile")], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_shell_scripts_lint_clean():
    scripts = SCRIPTS + sorted(glob.glob(os.path.join(ROOT, "scripts", "*.sh"))) + [
        *sorted(glob.glob(os.path.join(ROOT, "deploy", "slurm", "*.sbatch"))),
        *sorted(glob.glob(os.path.join(ROOT, "deploy", "slurm", "*.sh")))]
    done = subprocess.run([_linter("shellcheck"), "-x", *scripts], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_dask_gpu_workers_see_one_gpu_each(tmp_path):
    """deploy/dask_gpu_workers.sh with GPUS=2 PROCESSES_PER_GPU=2 against a real scheduler: four
    worker processes, two seeing GPU 0 and two GPU 1 (CUDA_VISIBLE_DEVICES), on a machine
    without a GPU: what each process is assigned is what matters here. All four share the MPS
    daemon the script starts (NVIDIA's control program played by tests/test_gpu_sharing.py's
    script), which is told to quit, its folder removed, when the script is stopped."""
    import json
    import signal
    import sys
    import time

    from distributed import Client

    from tests.test_gpu_sharing import install_fake_control

    fake_env, mps_calls = install_fake_control(tmp_path)
    temp = tmp_path / "tmp"
    temp.mkdir()

    scheduler = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                  "--port", "0", "--scheduler-file", str(tmp_path / "s.json"),
                                  "--dashboard-address", ":0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers = None
    try:
        for _ in range(150):
            if (tmp_path / "s.json").exists() and (tmp_path / "s.json").stat().st_size:
                break
            time.sleep(0.2)
        address = json.load(open(tmp_path / "s.json"))["address"]
        env = {**os.environ, "GPUS": "2", "PROCESSES_PER_GPU": "2", "PYTHON": sys.executable, "TMPDIR": str(temp),
               **fake_env}
        env.pop("CUDA_MPS_PIPE_DIRECTORY", None)
        workers = subprocess.Popen(["bash", os.path.join(ROOT, "deploy", "dask_gpu_workers.sh"), address], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        with Client(address, timeout=60) as client:
            client.wait_for_workers(4, timeout=120)
            seen = client.run(lambda: (os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("CUDA_MPS_PIPE_DIRECTORY")))
        assert sorted(gpu for gpu, _ in seen.values()) == ["0", "0", "1", "1"]
        pipes = {pipe for _, pipe in seen.values()}
        assert len(pipes) == 1 and pipes.pop().startswith(str(temp))
    finally:
        if workers is not None:
            os.killpg(workers.pid, signal.SIGTERM)
            workers.wait(timeout=60)
        scheduler.terminate()
        scheduler.wait(timeout=60)
    calls = mps_calls()
    assert [c["args"] for c in calls] == [["-d"], []] and calls[1]["stdin"] == "quit\n", calls
    assert [f for f in os.listdir(temp) if f.startswith("paragen-mps-")] == []       # dask keeps its scratch space
    bad = subprocess.run(["bash", os.path.join(ROOT, "deploy", "dask_gpu_workers.sh"), "tcp://x:1"],
                         env={**os.environ, "GPUS": "0"}, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "no GPU found" in bad.stderr


def test_flink_gpu_workers_per_machine():
    env = {"PATH": os.environ["PATH"], "PYTHON": "echo", "FLINK_MASTER": "h:8081", "ENV_TYPE": "PROCESS",
           "GPUS": "2", "PROCESSES_PER_GPU": "3"}
    done = subprocess.run(["bash", os.path.join(ROOT, "deploy", "run_flink.sh"), "--preset", "parabank2"],
                          env=env, capture_output=True, text=True, timeout=30)
    cmd = done.stdout.split()
    assert done.returncode == 0, done.stderr
    assert cmd[cmd.index("--sdk_worker_parallelism") + 1] == "6"
    assert cmd[cmd.index("--device") + 1] == "cuda" and cmd[cmd.index("--processes_per_gpu") + 1] == "3"
    from beam_pipelines.generate import build_parser
    from beam_pipelines.options import check_beam_args

    check_beam_args(["--runner", "DirectRunner", "--sdk_worker_parallelism", "6"], build_parser())   # Beam knows it
    for bad_env, message in (({"ENV_TYPE": "DOCKER", "IMAGE": "img"}, "DOCKER environment"),
                             ({"GPUS": "x"}, "positive integers"), ({"PROCESSES_PER_GPU": "0"}, ">= 1")):
        bad = subprocess.run(["bash", os.path.join(ROOT, "deploy", "run_flink.sh")], env={**env, **bad_env},
                             capture_output=True, text=True, timeout=30)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr


def test_kubernetes_job_reruns_the_same_command_and_ignores_disruptions():
    import yaml

    from beam_pipelines.generate import build_parser
    from common.stopping import GRACE_SECONDS

    doc = yaml.safe_load(open(os.path.join(ROOT, "deploy", "k8s", "paragen-generate-job.yaml")))
    assert doc["kind"] == "Job" and doc["spec"]["backoffLimit"] >= 3
    rules = doc["spec"]["podFailurePolicy"]["rules"]
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]} in rules
    [fail] = [r for r in rules if r["action"] == "FailJob"]
    assert fail["onExitCodes"]["operator"] == "In" and set(fail["onExitCodes"]["values"]) == {2, 3}
    pod = doc["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["terminationGracePeriodSeconds"] >= GRACE_SECONDS + 5
    [container] = pod["containers"]
    assert fail["onExitCodes"]["containerName"] == container["name"]
    assert container["command"][:3] == ["python", "-m", "beam_pipelines.generate"]
    known, unknown = build_parser().parse_known_args(container["command"][3:])
    assert not unknown and known.output.startswith("s3://") and not known.overwrite and not known.run_id
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_slurm_script_stops_the_job_before_the_time_limit_and_requeues_it(tmp_path):
    """deploy/slurm/generate.sbatch with a stand-in job and a stand-in scontrol: SIGUSR1 (what
    --signal=B:USR1@120 sends) becomes SIGTERM to the job, whose exit status the script keeps,
    and the job is requeued; a job that ends by itself is not."""
    script = os.path.join(ROOT, "deploy", "slurm", "generate.sbatch")
    text = open(script).read()
    assert "#SBATCH --requeue" in text and "#SBATCH --signal=B:USR1@" in text
    job = tmp_path / "job"
    job.write_text("#!/usr/bin/env bash\ntrap 'echo stopped >> \"$LOG\"; exit 143' TERM\n"
                   "echo \"started $*\" >> \"$LOG\"\nfor _ in $(seq 300); do sleep 0.1; done\n")
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.parent.mkdir()
    scontrol.write_text("#!/usr/bin/env bash\necho \"scontrol $*\" >> \"$LOG\"\n")
    for f in (job, scontrol):
        f.chmod(0o755)
    log = tmp_path / "log"
    env = {"PATH": f"{scontrol.parent}:{os.environ['PATH']}", "PYTHON": str(job), "LOG": str(log),
           "SLURM_JOB_ID": "42", "SLURM_SUBMIT_DIR": ROOT}
    proc = subprocess.Popen(["bash", script, "--input", "x"], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 20
    while not (log.exists() and "started" in log.read_text()) and time.time() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=30) == 143
    assert log.read_text().splitlines() == ["started -m beam_pipelines.generate --input x", "stopped",
                                            "scontrol requeue 42"]
    assert subprocess.run(["bash", script, "--help"], capture_output=True, text=True).stdout.count("--requeue") >= 1
