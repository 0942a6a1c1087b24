"""How long each job takes to refuse a store it cannot reach (the figures tests/test_unreachable_stores.py
no longer bounds: wall-clock time is load, not behaviour).

    python bench/bench_unreachable.py [--models DIR] [--budget 25] [--rounds 1] [--stores S,..] [--jobs J,..]

For each store (S3 on a refused port, S3 on a host that does not resolve, S3 behind a server that
accepts connections and never answers, GCS without credentials) and each job (generation, filter,
embedding, refresh) it runs the job's command once per round and prints one Markdown row: the exit
status, the median seconds from start to exit, and that less the seconds the same job takes to
refuse a plain usage mistake (a missing input folder) in the same round: the part of the time the
store itself costs. The blackholed store should cost about the budget (PARAGEN_FIRST_CONTACT_SECONDS),
the others a few seconds.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
from fresh_process import job_run  # noqa: E402  (the jobs it measures: bench/fresh_process.py)


def _env(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_", "STORAGE_EMULATOR"))}
    return {**env, "PYTHONPATH": ROOT, **extra}


def _commands(url: str, models: str) -> dict:
    local = ["--forward_model", os.path.join(models, "cs-en"), "--backward_model", os.path.join(models, "en-cs")]
    return {"generate": ["beam_pipelines.generate", "--input", f"{url}/in.tsv", "--output", f"{url}/out", *local],
            "filter": ["beam_pipelines.filter", "--input", f"{url}/run", "--output", f"{url}/filtered"],
            "embeddings": ["embeddings.train", "--input", f"{url}/run", "--output", f"{url}/encoder"],
            "refresh": ["beam_pipelines.refresh", "--root", f"{url}/root", "--", "--input", f"{url}/bitext", *local]}


def _timed(args: list[str], env: dict) -> tuple[int, float]:
    start = time.monotonic()
    done = job_run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, env=env, timeout=900)
    return done.returncode, time.monotonic() - start


class Blackhole:
    """A listener that accepts connections and never answers."""

    def __enter__(self):
        self.sock, self.held, self.stop = socket.socket(), [], threading.Event()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self):
        while not self.stop.is_set():
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                continue

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        for conn in self.held:
            conn.close()
        self.sock.close()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", help="a folder with cs-en/ and en-cs/ (default: tiny models trained into runs/)")
    ap.add_argument("--budget", type=float, default=25.0, help="PARAGEN_FIRST_CONTACT_SECONDS (default 25)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--stores", default="refused,no_host,never_answers,gs",
                    help="comma-separated, of refused, no_host, never_answers, gs (default: all)")
    ap.add_argument("--jobs", default="generate,filter,embeddings,refresh", help="comma-separated (default: all)")
    a = ap.parse_args(argv)
    wanted_stores, wanted_jobs = set(a.stores.split(",")), set(a.jobs.split(","))
    unknown = (wanted_stores - {"refused", "no_host", "never_answers", "gs"}) | (
        wanted_jobs - {"generate", "filter", "embeddings", "refresh"})
    if unknown:
        ap.error(f"unknown store or job: {', '.join(sorted(unknown))}")
    from bench_faults import ensure_models

    models = ensure_models(a.models)
    s3 = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1"}
    budget = {"PARAGEN_FIRST_CONTACT_SECONDS": f"{a.budget:g}"}
    print(f"# bench_unreachable: {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, budget {a.budget:g} s, "
          f"median of {a.rounds}\n\n| store | job | exit | seconds | less a usage mistake's |\n|---|---|---|---|---|",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp, Blackhole() as hole:
        stores = {"refused": ("s3, a refused port", "s3://bucket", {**s3, "AWS_ENDPOINT_URL": "http://127.0.0.1:1"}),
                  "no_host": ("s3, no such host", "s3://bucket",
                              {**s3, "AWS_ENDPOINT_URL": "http://no-such-host.invalid:9000"}),
                  "never_answers": ("s3, never answers", "s3://bucket", {**s3, "AWS_ENDPOINT_URL": f"http://{hole}"}),
                  "gs": ("gs, no credentials", "gs://bucket", {})}
        mistake = _commands(os.path.join(tmp, "missing"), models)
        for key, (store, url, extra) in stores.items():
            if key not in wanted_stores:
                continue
            for job, args in _commands(url, models).items():
                if job not in wanted_jobs:
                    continue
                times, base, status = [], [], None
                for _ in range(a.rounds):
                    status, seconds = _timed(args, _env({**extra, **budget}))
                    times.append(seconds)
                    base.append(_timed(mistake[job], _env(budget))[1])
                t, b = statistics.median(times), statistics.median(base)
                print(f"| {store} | {job} | {status} | {t:.1f} | {t - b:.1f} |", flush=True)


if __name__ == "__main__":
    main()
