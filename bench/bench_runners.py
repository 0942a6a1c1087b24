"""The quickstart's generation job on three runners side by side: the DirectRunner (in memory), a
local Dask cluster (2 worker processes) and a Flink session cluster (a job manager and 2 task
managers, each its own JVM, jobs submitted through deploy/run_flink.sh with ENV_TYPE=PROCESS).

    python bench/bench_runners.py [--models DIR] [--records 600] [--preset parabank2-cpu] [--skip flink,...]

The input is the first RECORDS lines of examples/cs-en.example.tsv (what scripts/quickstart.sh
decodes), the models the quickstart's (runs/example-models, trained first when missing) unless
--models. Each runner's row: seconds from the command's start to its exit, records/s, the ratio to
the DirectRunner's time in the same invocation, whether its rows equal the DirectRunner's, and on
Flink the JVMs' peak resident memory (job manager, each task manager, Beam's job server; sampled
every 0.5 s) and the task managers that ran subtasks (Flink's REST API).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
from fresh_process import job_run  # noqa: E402  (the jobs it measures: bench/fresh_process.py)
PY = sys.executable


def quickstart_models(models: str | None) -> str:
    if models:
        return models
    out = os.path.join(ROOT, "runs", "example-models")
    if not os.path.isfile(os.path.join(out, "en-cs", "model.pt")):
        print(f"training the quickstart's models into {out} ...", flush=True)
        subprocess.run([PY, "-m", "models.nmt.train", "--tsv", os.path.join(ROOT, "examples", "cs-en.example.tsv"),
                        "--src_lang", "cs", "--tgt_lang", "en", "--output", out, "--vocab_size", "800", "--layers", "2",
                        "--dim", "128", "--ffn_dim", "256", "--heads", "4", "--max_epoch", "10", "--max_tokens", "1024",
                        "--lr", "0.002", "--dropout", "0.1", "--valid_size", "200", "--bleu_samples", "200"],
                       cwd=ROOT, check=True)
    return out


class PeakRss:
    """Peak resident memory (KiB) of processes whose command line contains a marker, sampled."""

    def __init__(self, markers: dict[str, str]):
        self.markers, self.peak = markers, dict.fromkeys(markers, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        import psutil

        while not self._stop.wait(0.5):
            for p in psutil.process_iter(["cmdline", "memory_info"]):
                cmd = " ".join(p.info["cmdline"] or [])
                for name, marker in self.markers.items():
                    if marker in cmd and p.info["memory_info"] is not None:
                        self.peak[name] = max(self.peak[name], p.info["memory_info"].rss // 1024)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def timed(cmd: list[str], env: dict | None = None) -> float:
    start = time.monotonic()
    done = job_run(cmd, cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return time.monotonic() - start


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", help="a folder with cs-en/ and en-cs/ (default: the quickstart's)")
    ap.add_argument("--records", type=int, default=600)
    ap.add_argument("--preset", default="parabank2-cpu")
    ap.add_argument("--skip", default="", help="comma-separated: dask, flink")
    a = ap.parse_args(argv)
    skip = set(filter(None, a.skip.split(",")))
    from tests.jobs import committed_rows

    models = quickstart_models(a.models)
    lines = open(os.path.join(ROOT, "examples", "cs-en.example.tsv"), encoding="utf-8").read().splitlines()[:a.records]
    print(f"# bench_runners: {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, {len(lines)} records, "
          f"preset {a.preset}\n", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-runners-") as tmp:
        inp = os.path.join(tmp, "in.tsv")
        with open(inp, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")

        def job(out):
            return ["--input", inp, "--output", out, "--forward_model", os.path.join(models, "cs-en"),
                    "--backward_model", os.path.join(models, "en-cs"), "--preset", a.preset]
        direct = os.path.join(tmp, "direct")
        seconds = timed([PY, "-m", "beam_pipelines.generate", *job(direct), "--runner", "DirectRunner"])
        want = committed_rows(direct)
        rows.append(("DirectRunner, in memory", seconds, True, ""))
        if "dask" not in skip:
            from bench_cluster import DaskCluster

            with DaskCluster(2, tmp) as cluster:
                out = os.path.join(tmp, "dask")
                seconds = timed([PY, "-m", "beam_pipelines.generate", *job(out), "--runner", "DaskRunner",
                                 "--dask_client_address", cluster.address])
                peak = cluster.worker_peak_rss_kib()
            rows.append(("Dask, 2 worker processes", seconds, committed_rows(out) == want,
                         f"worker peak RSS {peak / 1024:.0f} MiB"))
        if "flink" not in skip:
            from tests.flink_cluster import BOOT, JOB_SERVER_JAR, flink_cluster, missing

            why = missing()
            if why:
                print(f"flink skipped: {why}")
            else:
                with flink_cluster(os.path.join(tmp, "flink")) as cluster:
                    out = os.path.join(tmp, "flink-out")
                    markers = {"job manager": "StandaloneSessionClusterEntrypoint",
                               "task managers (each)": "TaskManagerRunner", "job server": "beam-flink-job-server.jar"}
                    env = {"FLINK_MASTER": cluster.master, "ENV_TYPE": "PROCESS", "BOOT": BOOT,
                           "JOB_SERVER_JAR": JOB_SERVER_JAR, "PARALLELISM": "2", "PYTHON": PY}
                    with PeakRss(markers) as rss:
                        seconds = timed(["bash", os.path.join(ROOT, "deploy", "run_flink.sh"), *job(out)], env)
                    jobs = [j for j in cluster.jobs() if j["name"].startswith("paragen-generate-")]
                    used = len(cluster.taskmanagers_of(jobs[-1]["jid"])) if jobs else 0
                memory = ", ".join(f"{k} {v / 1024:.0f} MiB" for k, v in rss.peak.items())
                rows.append(("Flink 1.19.3, 2 task managers", seconds, committed_rows(out) == want,
                             f"{used} task managers ran subtasks; JVM peak RSS: {memory}"))
    base = rows[0][1]
    print("| runner | seconds | records/s | vs DirectRunner | rows equal | notes |\n|---|---|---|---|---|---|")
    for name, seconds, same, notes in rows:
        print(f"| {name} | {seconds:.1f} | {len(lines) / seconds:.2f} | {seconds / base:.2f}x | {same} | {notes} |")


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    main()
