"""What survives what: faults injected into real runs of the generation job, and the outcome.

    python bench/bench_faults.py [--models DIR] [--pairs 900] [--unit_pairs 50] [--only NAME ...]

Each scenario runs the job (tiny cs<->en models on a toy bitext: 900 pairs, 50 per work unit,
DirectRunner unless said), causes one fault for real, and, where the job ended, runs the *same
command* again, as a Kubernetes Job, a SLURM requeue or a cron retry would. It prints one
Markdown row per scenario: the exit status of the faulted run, seconds from the fault to that exit
(or to the end of a run that finished by itself), whether anything but the same command was
needed, and the rows lost, duplicated and different against a fault-free run of the same
command. The faults:

  SIGTERM of the driver (a preemption), with 2 multi_processing workers; SIGKILL of the whole
  process group (a pod or node lost without grace); SIGKILL of one worker process; SIGKILL of a
  dask.distributed worker process (a real cluster on loopback); a bucket (moto's S3 server on
  loopback) behind a proxy failing 2% and 10% of requests (503 SlowDown, 500, the connection
  dropped before an answer); the store down for 20 s (within the retry budget) and for longer
  than it; a full disk (a 400 KiB tmpfs: needs the right to mount); EIO from write() on the
  files under --output (tests/eio_shim.c as LD_PRELOAD: what fiu-run does, scoped to one
  directory); a CUDA error other than out-of-memory (torch raising it, through a sitecustomize).

Without --models, the tiny models are trained first (about a minute; kept in
runs/bench-faults-models). Every fault-free reference run is made in the same invocation.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
from fresh_process import job_popen  # noqa: E402  (the jobs it measures: bench/fresh_process.py)
PY = sys.executable
MULTI = ["--direct_running_mode", "multi_processing", "--direct_num_workers", "2"]


def ensure_models(models: str | None) -> str:
    if models:
        return models
    out = os.path.join(ROOT, "runs", "bench-faults-models")
    if not os.path.isfile(os.path.join(out, "en-cs", "model.pt")):
        from models.nmt.train import train_models
        from tests.toydata import toy_bitext

        print(f"training tiny models into {out} ...", flush=True)
        train_models(toy_bitext(1500, seed=0), out, "cs", "en", vocab_size=200, layers=1, dim=64, ffn_dim=128, heads=2,
                     max_epoch=8, max_tokens=2048, lr=3e-3, dropout=0.0, warmup=30, valid_size=50, bleu_samples=50,
                     cpu_threads=1)
    return out


class Bench:
    def __init__(self, models: str, pairs: int, work: str, unit_pairs: int = 50):
        from tests.toydata import toy_bitext

        self.models, self.work, self.unit_pairs = models, work, unit_pairs
        self.input = os.path.join(work, "toy.tsv")
        with open(self.input, "w", encoding="utf-8") as f:
            f.writelines(f"{s}\t{t}\n" for s, t in toy_bitext(pairs * 3, seed=4)[:pairs])
        self.reference: dict = {}
        self.rows_out: list[str] = []

    def args(self, out: str, *extra) -> list[str]:
        return ["--input", self.input, "--output", out, "--forward_model", f"{self.models}/cs-en",
                "--backward_model", f"{self.models}/en-cs", "--unit_pairs", str(self.unit_pairs), "--device", "cpu",
                *extra]

    def start(self, args, env=None):
        return job_popen([PY, "-m", "beam_pipelines.generate", *args], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True,
                         env={**os.environ, "PYTHONPATH": ROOT, **(env or {})})

    def finish(self, proc, timeout=1800) -> tuple[int, str]:
        _out, err = proc.communicate(timeout=timeout)
        return proc.returncode, err.decode(errors="replace")

    def whole(self, args, env=None) -> tuple[int, str]:
        return self.finish(self.start(args, env))

    @staticmethod
    def units(out: str) -> int:
        from common import storage

        work = storage.join(out, "_work")
        return sum(1 for f in storage.list_files(work) if "/units/u" in f and f.endswith(".json"))

    def wait_units(self, out: str, n: int, proc, timeout=600) -> None:
        deadline = time.time() + timeout
        while self.units(out) < n:
            if proc.poll() is not None:
                raise RuntimeError(f"the job ended before {n} units: {proc.stderr.read().decode()[-2000:]}")
            if time.time() > deadline:
                raise RuntimeError("timed out")
            time.sleep(0.2)

    @staticmethod
    def rows(out: str) -> list[tuple[tuple, str]]:
        """(identity, the whole row) of every row of both tables of the run in OUT; identity:
        (table, pair_id, rank, input_index)."""
        from common import storage
        from paracorpus.commit import committed_files

        rows = []
        for table in ("paraphrases", "rejects"):
            files = committed_files(out, table)
            for r in storage.parquet_dataset(files).to_table().to_pylist() if files else []:
                r.pop("shard", None)            # the output partition's number: where, not what
                rows.append(((table, r["pair_id"], r.get("rank"), r["input_index"]), repr(sorted(r.items()))))
        return rows

    def compare(self, out: str, key: str = "local") -> tuple[int, int, int]:
        """(lost, duplicated, different) rows of the run in OUT against the fault-free reference."""
        got, want = self.rows(out), dict(self.reference[key])
        ids = Counter(i for i, _ in got)
        lost = sum(1 for i in want if i not in ids)
        duplicated = sum(n - 1 for n in ids.values() if n > 1)
        different = sum(1 for i, r in set(got) if i in want and want[i] != r)
        return lost, duplicated, different

    def row(self, name: str, rc, seconds: float, person: str, out: str | None, key: str = "local") -> None:
        lost, dup, diff = self.compare(out, key) if out else ("-", "-", "-")
        line = f"| {name} | {rc} | {seconds:.1f} | {person} | {lost} | {dup} | {diff} |"
        print(line, flush=True)
        self.rows_out.append(line)


def again(b: Bench, args, env=None) -> str:
    rc, err = b.whole(args, env)
    return "no (the same command)" if rc == 0 else f"rerun failed ({rc}): {err.strip().splitlines()[-1][:120]}"


def sigterm(b: Bench) -> None:
    out = os.path.join(b.work, "sigterm")
    args = b.args(out, *MULTI)
    proc = b.start(args)
    b.wait_units(out, 6, proc)
    t = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rc, _err = b.finish(proc)
    seconds = time.monotonic() - t
    b.row("SIGTERM of the driver (2 worker processes)", rc, seconds, again(b, args), out)


def sigkill_group(b: Bench) -> None:
    out = os.path.join(b.work, "sigkill")
    args = b.args(out, *MULTI)
    proc = b.start(args)
    b.wait_units(out, 6, proc)
    t = time.monotonic()
    os.killpg(proc.pid, signal.SIGKILL)
    rc, _err = b.finish(proc)
    b.row("SIGKILL of the process group (no grace)", rc, time.monotonic() - t, again(b, args), out)


def sigkill_worker(b: Bench) -> None:
    import psutil

    out = os.path.join(b.work, "worker")
    args = b.args(out, *MULTI)
    proc = b.start(args)
    b.wait_units(out, 6, proc)
    workers = [c for c in psutil.Process(proc.pid).children(recursive=True)
               if "sdk_worker_main" in " ".join(c.cmdline()) and c.name() not in ("sh", "dash", "bash")]
    t = time.monotonic()
    workers[0].kill()
    rc, _err = b.finish(proc)
    b.row("SIGKILL of one worker process", rc, time.monotonic() - t, again(b, args), out)


def dask_worker(b: Bench) -> None:
    import psutil

    out = os.path.join(b.work, "dask")
    with tempfile.TemporaryDirectory() as tmp, _dask(tmp) as address:
        proc = b.start(b.args(out, "--runner", "DaskRunner", "--dask_client_address", address))
        b.wait_units(out, 4, proc)
        victims = [p for p in psutil.process_iter(["cmdline"]) if "spawn_main" in " ".join(p.info["cmdline"] or [])
                   and any("dask_worker" in " ".join(a.cmdline()) for a in p.parents())]
        t = time.monotonic()
        victims[0].kill()
        rc, _err = b.finish(proc)
        b.row("SIGKILL of a Dask worker process (2 workers)", rc, time.monotonic() - t,
              "no (finished by itself)" if rc == 0 else "yes", out)


def _dask(tmp: str):
    from tests.dask_cluster import local_dask_cluster

    return local_dask_cluster(tmp)


def buckets(b: Bench) -> None:
    from tests.fault_proxy import FaultProxy
    from tests.object_stores import s3_server

    with s3_server() as store:
        os.environ.update(store.env)              # this process reads the buckets directly
        direct = {**store.env}
        ref = f"s3://{store.make_bucket()}/run"
        with FaultProxy(store.endpoint) as proxy:       # the same path, no fault: the time to compare with
            t = time.monotonic()
            rc, err = b.whole(b.args(ref), {**direct, "AWS_ENDPOINT_URL": proxy.url, "AWS_ENDPOINT_URL_S3": proxy.url})
            assert rc == 0, err[-2000:]
            b.row(f"(bucket through the proxy, no fault: {proxy.counts['forwarded']} requests)", rc,
                  time.monotonic() - t, "-", None)
        b.reference["s3"] = b.rows(ref)
        for rate in (0.02, 0.10):
            url = f"s3://{store.make_bucket()}/run"
            with FaultProxy(store.endpoint, rate=rate, seed=7) as proxy:
                env = {**direct, "AWS_ENDPOINT_URL": proxy.url, "AWS_ENDPOINT_URL_S3": proxy.url}
                t = time.monotonic()
                rc, _err = b.whole(b.args(url), env)
                faults = proxy.counts["503"] + proxy.counts["500"] + proxy.counts["reset"]
                b.row(f"bucket failing {rate:.0%} of requests ({faults} of {faults + proxy.counts['forwarded']}: "
                      "503, 500, reset)", rc, time.monotonic() - t, "no (finished by itself)" if rc == 0 else "yes",
                      url, "s3")
        for down, budget in ((20, 120), (600, 10)):
            url = f"s3://{store.make_bucket()}/run"
            with FaultProxy(store.endpoint) as proxy:
                env = {**direct, "AWS_ENDPOINT_URL": proxy.url, "AWS_ENDPOINT_URL_S3": proxy.url,
                       "PARAGEN_STORAGE_RETRY_SECONDS": str(budget)}
                args = b.args(url)
                proc = b.start(args, env)
                b.wait_units(url, 4, proc)
                t = time.monotonic()
                proxy.down(down)
                rc, _err = b.finish(proc)
                seconds = time.monotonic() - t
                if rc != 0:
                    proxy.down(0)
                    person = again(b, args, env)
                else:
                    person = "no (finished by itself)"
                b.row(f"store down {down} s (retry budget {budget} s)", rc, seconds, person, url, "s3")


def full_disk(b: Bench) -> None:
    from tests.disk_faults import Unavailable, grow, small_disk

    try:
        with small_disk(os.path.join(b.work, "disk"), "400k") as mount:
            out = os.path.join(mount, "out")
            args = b.args(out)
            t = time.monotonic()
            rc, _err = b.whole(args)
            seconds = time.monotonic() - t
            grow(mount, "64m")                        # space freed
            b.row("disk full (ENOSPC, a 400 KiB tmpfs)", rc, seconds, again(b, args), out)
    except Unavailable as exc:
        b.rows_out.append(f"| disk full | - | - | - ({exc}) | - | - | - |")


def eio(b: Bench) -> None:
    from tests.disk_faults import Unavailable, eio_env, eio_shim

    try:
        shim = eio_shim(b.work)
    except Unavailable as exc:
        b.rows_out.append(f"| EIO | - | - | - ({exc}) | - | - | - |")
        return
    out = os.path.join(b.work, "eio")
    args = b.args(out)
    t = time.monotonic()
    rc, _err = b.whole(args, eio_env(shim, out, after=200))
    b.row("EIO from write() under --output after 200 writes (LD_PRELOAD)", rc, time.monotonic() - t,
          again(b, args), out)


_CUDA_FAULT = """
import os, torch, torch.nn.functional as F
_embedding, _calls = F.embedding, [0]
def embedding(*args, **kwargs):
    _calls[0] += 1
    if _calls[0] > 300:
        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
    return _embedding(*args, **kwargs)
F.embedding = embedding
"""


def device_error(b: Bench) -> None:
    site = os.path.join(b.work, "site")
    os.makedirs(site, exist_ok=True)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(_CUDA_FAULT)
    out = os.path.join(b.work, "device")
    args = b.args(out)
    t = time.monotonic()
    rc, _err = b.whole(args, {"PYTHONPATH": f"{site}{os.pathsep}{ROOT}"})
    b.row("CUDA error (illegal address) in a worker (injected)", rc, time.monotonic() - t, again(b, args), out)


SCENARIOS = {"sigterm": sigterm, "sigkill": sigkill_group, "worker": sigkill_worker, "dask": dask_worker,
             "buckets": buckets, "disk": full_disk, "eio": eio, "device": device_error}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=None)
    ap.add_argument("--pairs", type=int, default=900)
    ap.add_argument("--unit_pairs", type=int, default=50,
                    help="the job's work unit (default 50); the faults strike after 6 units")
    ap.add_argument("--only", nargs="*", choices=sorted(SCENARIOS), default=None)
    a = ap.parse_args()
    models = ensure_models(a.models)
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as work:
        b = Bench(models, a.pairs, work, a.unit_pairs)
        out = os.path.join(work, "reference")
        t = time.monotonic()
        rc, err = b.whole(b.args(out))
        assert rc == 0, err[-3000:]
        b.reference["local"] = b.rows(out)
        print(f"fault-free reference: {len(b.reference['local'])} rows in {time.monotonic() - t:.0f} s",
              flush=True)
        print("| fault | exit status | seconds to exit (or finish) | person needed? | rows lost | duplicated | "
              "different |\n|---|---|---|---|---|---|---|", flush=True)
        for name in a.only or SCENARIOS:
            try:
                SCENARIOS[name](b)
            except Exception as exc:  # noqa: BLE001: one scenario's failure is its row, the others go on
                b.rows_out.append(f"| {name} | bench error: {type(exc).__name__}: {str(exc)[:200]} |")
                print(b.rows_out[-1], flush=True)
    print("\n".join(["", "| fault | exit status | seconds to exit (or finish) | person needed? | rows lost | "
                     "duplicated | different |", "|---|---|---|---|---|---|---|", *b.rows_out]))


if __name__ == "__main__":
    main()
