"""Benchmark of the generation job as a cluster job: scale-out, object storage, resume, memory.

    python bench/bench_cluster.py --bitext ../shared/data/bitext/multi30k/train [--models DIR]

Every figure is a ratio of two runs made in the same invocation (the machine is shared and
noisy). Without --models, two small cs<->en models are trained first on 3,000 pairs of the bitext
(a minute or two; kept in runs/bench-cluster-models for the next run). Prints (Markdown):

  1. scale-out: a real dask.distributed cluster on loopback, 1 worker process vs 2, one output
     shard, the same pairs (goal: about half the time with 2 workers);
  2. object storage: the same job with input, models and output in an S3 bucket (moto's server
     on loopback) vs a local disk (goal: overhead <= 10%);
  3. resume: a run killed (SIGKILL) when half its work units are done, then --resume, vs a whole
     run (goal: resume <= 0.6x);
  4. peak memory of the driver and of a Dask worker at N vs 10 N pairs (goal: flat).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
from fresh_process import job_popen  # noqa: E402  (the jobs it measures: bench/fresh_process.py)
PY = sys.executable


def read_pairs(prefix: str, n: int, skip: int = 0) -> list[tuple[str, str]]:
    def lines(lang):
        with gzip.open(f"{prefix}.{lang}.gz", "rt", encoding="utf-8") as f:
            out = []
            for i, line in enumerate(f):
                if i >= skip + n:
                    break
                if i >= skip:
                    out.append(line.strip())
            return out
    return list(zip(lines("cs"), lines("en")))


def write_tsv(pairs, path: str) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(f"{s}\t{t}\n" for s, t in pairs)
    return path


def ensure_models(models: str | None, bitext: str) -> str:
    if models:
        return models
    out = os.path.join(ROOT, "runs", "bench-cluster-models")
    if not os.path.isfile(os.path.join(out, "en-cs", "model.pt")):
        from models.nmt.train import train_models

        print(f"training two small models on 3,000 pairs of {bitext} into {out} ...", flush=True)
        train_models(read_pairs(bitext, 3000, skip=25000), out, "cs", "en", vocab_size=2000, layers=1, dim=128,
                     ffn_dim=256, heads=2, max_epoch=4, max_tokens=4096, lr=2e-3, dropout=0.1, warmup=50,
                     valid_size=100, bleu_samples=50, cpu_threads=2)
    return out


def job_args(inp: str, out: str, models: str, *extra) -> list[str]:
    return ["--input", inp, "--output", out, "--forward_model", f"{models}/cs-en", "--backward_model",
            f"{models}/en-cs", "--preset", "parabank2-cpu", "--num_sets", "2", "--num_samples", "4",
            "--dual_xent_threshold", "-1", "--device", "cpu", *extra]


def timed_job(args: list[str], env: dict | None = None) -> tuple[float, dict, int]:
    """(seconds, manifest, peak RSS KiB) of the job run in a fresh process."""
    start = time.perf_counter()
    code = ("import json, resource, sys; from beam_pipelines.generate import run; m = run(sys.argv[1:]); "
            "print('MANIFEST ' + json.dumps({'units': m['units'], 'counts': m['counts']})); "
            "print('MAXRSS', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    done = subprocess.run([PY, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    manifest = json.loads(next(line[9:] for line in done.stdout.splitlines() if line.startswith("MANIFEST ")))
    rss = int(next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("MAXRSS")))
    return seconds, manifest, rss


class DaskCluster:
    """A scheduler and N single-threaded worker processes on loopback."""

    def __init__(self, workers: int, tmp: str, profiler: bool = False):
        self.tmp, self.workers, self.procs, self.profiler = tmp, workers, [], profiler

    def __enter__(self):
        sched = os.path.join(self.tmp, f"scheduler-{time.time_ns()}.json")
        # Dask's profiler off, as deploy/run_dask.sh starts workers (PROFILER: Dask's default, on)
        env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1",
               "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": str(self.profiler)}
        self.procs.append(subprocess.Popen([PY, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                            "--port", "0", "--dashboard-address", ":0", "--scheduler-file", sched],
                                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        while not os.path.exists(sched):
            time.sleep(0.2)
        time.sleep(0.5)
        self.address = json.load(open(sched))["address"]
        self.procs.append(subprocess.Popen([PY, "-m", "distributed.cli.dask_worker", self.address, "--nthreads", "1",
                                            "--nworkers", str(self.workers), "--no-dashboard", "--host", "127.0.0.1",
                                            "--local-directory", os.path.join(self.tmp, "w")],
                                           env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        from distributed import Client

        with Client(self.address, timeout=60) as client:
            client.wait_for_workers(self.workers, timeout=120)
            self.pids = list(client.run(os.getpid).values())
        return self

    def worker_peak_rss_kib(self) -> int:
        from distributed import Client

        with Client(self.address, timeout=60) as client:
            peaks = client.run(lambda: __import__("resource").getrusage(__import__("resource").RUSAGE_SELF).ru_maxrss)
        return max(peaks.values())

    def __exit__(self, *exc):
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def dask_args(cluster: DaskCluster) -> list[str]:
    return ["--runner", "DaskRunner", "--dask_client_address", cluster.address, "--torch_threads", "1"]


def bench_scale_out(pairs, models, tmp) -> dict:
    inp = write_tsv(pairs, os.path.join(tmp, "scale.tsv"))
    out = {}
    for workers in (1, 2):
        with DaskCluster(workers, tmp) as cluster:
            secs, manifest, _ = timed_job(job_args(inp, os.path.join(tmp, f"scale-{workers}"), models,
                                                   "--num_output_shards", "1", "--unit_pairs", "25",
                                                   *dask_args(cluster)))
        busy = manifest["units"]["decoding_seconds_per_worker"]
        out[workers] = {"seconds": secs, "per_worker": manifest["units"]["per_worker"],
                        "decoding": max(busy.values())}
    return out


def bench_bucket(pairs, models, tmp) -> dict:
    from common import storage
    from tests.object_stores import s3_server

    inp = write_tsv(pairs, os.path.join(tmp, "bucket.tsv"))
    local = timed_job(job_args(inp, os.path.join(tmp, "local-out"), models))[0]
    with s3_server() as store:
        env = {**store.env, "PARAGEN_CACHE": os.path.join(tmp, "cache")}
        os.environ.update(env)
        bucket = f"s3://{store.make_bucket()}"
        storage.copy_file(inp, f"{bucket}/in/bucket.tsv")
        for name in ("cs-en", "en-cs"):
            for f in os.listdir(os.path.join(models, name)):
                storage.copy_file(os.path.join(models, name, f), f"{bucket}/models/{name}/{f}")
        remote = timed_job(job_args(f"{bucket}/in/bucket.tsv", f"{bucket}/out", f"{bucket}/models"), env)[0]
    return {"local": local, "bucket": remote}


def bench_resume(pairs, models, tmp) -> dict:
    inp = write_tsv(pairs, os.path.join(tmp, "resume.tsv"))
    extra = ["--unit_pairs", "20"]
    full, manifest, _ = timed_job(job_args(inp, os.path.join(tmp, "full"), models, *extra))
    planned = manifest["units"]["planned"]
    out = os.path.join(tmp, "killed")
    proc = job_popen([PY, "-m", "beam_pipelines.generate", *job_args(inp, out, models, *extra)], cwd=ROOT,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def finished():
        work = os.path.join(out, "_work")
        return sum(len(os.listdir(os.path.join(work, r, "units"))) for r in os.listdir(work)
                   if os.path.isdir(os.path.join(work, r, "units"))) if os.path.isdir(work) else 0
    while finished() < planned // 2 and proc.poll() is None:
        time.sleep(0.2)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:              # it ended first (a tiny run): the resume reuses every unit
        pass
    proc.wait()
    done_at_kill = finished()
    resume, manifest, _ = timed_job(job_args(inp, out, models, *extra, "--resume"))
    return {"full": full, "resume": resume, "planned": planned, "done_at_kill": done_at_kill,
            "reused": manifest["units"]["reused_from_earlier_attempt"]}


def bench_memory(bitext, n, models, tmp) -> list[dict]:
    out = []
    for size in (n, 10 * n):
        inp = write_tsv(read_pairs(bitext, size), os.path.join(tmp, f"mem-{size}.tsv"))
        with DaskCluster(2, tmp) as cluster:
            secs, manifest, driver = timed_job(job_args(inp, os.path.join(tmp, f"mem-{size}"), models,
                                                        "--preset", "paranmt", "--beam", "1", *dask_args(cluster)))
            worker = cluster.worker_peak_rss_kib()
        out.append({"pairs": size, "seconds": secs, "driver_mib": driver / 1024, "worker_mib": worker / 1024,
                    "units": manifest["units"]["written"]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bitext", default=os.path.join(ROOT, "..", "shared", "data", "bitext", "multi30k", "train"),
                    help="Moses prefix of a cs-en bitext (PREFIX.cs.gz + PREFIX.en.gz)")
    ap.add_argument("--models", help="directory with cs-en/ and en-cs/ (default: train small ones)")
    ap.add_argument("--pairs", type=int, default=240, help="pairs for scale-out, bucket and resume")
    ap.add_argument("--memory_pairs", type=int, default=2000, help="N of the memory comparison (and 10 N)")
    ap.add_argument("--skip", default="", help="comma-separated sections to skip: scale,bucket,resume,memory")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    models = ensure_models(a.models, a.bitext)
    pairs = read_pairs(a.bitext, a.pairs)
    print(f"# bench_cluster: {a.pairs} Multi30k pairs, preset parabank2-cpu (S=2 x N=4), models {models}, "
          f"{os.cpu_count()} CPUs\n", flush=True)
    tmp = tempfile.mkdtemp(prefix="paragen-bench-")
    try:
        if "scale" not in skip:
            r = bench_scale_out(pairs, models, tmp)
            print("| scale-out (Dask, 1 output shard) | job s | decoding s (busiest worker) | units per worker |\n"
                  "|---|---:|---:|---|")
            for w in (1, 2):
                print(f"| {w} worker process(es) | {r[w]['seconds']:.1f} | {r[w]['decoding']:.1f} | "
                      f"{list(r[w]['per_worker'].values())} |")
            print(f"\n2 workers / 1 worker: **{r[2]['seconds'] / r[1]['seconds']:.2f}x** the job's time, "
                  f"**{r[2]['decoding'] / r[1]['decoding']:.2f}x** the decoding time (goal ~0.5)\n", flush=True)
        if "bucket" not in skip:
            r = bench_bucket(pairs, models, tmp)
            print(f"| storage | s |\n|---|---:|\n| local disk | {r['local']:.1f} |\n| S3 bucket (moto, loopback) | "
                  f"{r['bucket']:.1f} |\n\nbucket / local: **{r['bucket'] / r['local']:.2f}x** (goal <= 1.10)\n",
                  flush=True)
        if "resume" not in skip:
            r = bench_resume(pairs, models, tmp)
            print(f"| resume | s |\n|---|---:|\n| whole run | {r['full']:.1f} |\n| --resume after a kill at "
                  f"{r['done_at_kill']}/{r['planned']} units ({r['reused']} reused) | {r['resume']:.1f} |\n\n"
                  f"resume / whole: **{r['resume'] / r['full']:.2f}x** (goal <= 0.6)\n", flush=True)
        if "memory" not in skip:
            rows = bench_memory(a.bitext, a.memory_pairs, models, tmp)
            print("| pairs (paranmt, beam 1, Dask 2 workers) | s | units | driver peak MiB | worker peak MiB |\n"
                  "|---:|---:|---:|---:|---:|")
            for r in rows:
                print(f"| {r['pairs']:,} | {r['seconds']:.1f} | {r['units']} | {r['driver_mib']:.0f} | "
                      f"{r['worker_mib']:.0f} |")
            print(f"\n{rows[1]['pairs']:,} / {rows[0]['pairs']:,} pairs: driver **{rows[1]['driver_mib'] / rows[0]['driver_mib']:.2f}x**, "
                  f"worker **{rows[1]['worker_mib'] / rows[0]['worker_mib']:.2f}x** peak memory (goal: flat)\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
