"""How the generation job's own costs grow with the input, and whether a worker's memory stays
flat: the figures behind "50 million pairs" (docs/benchmarks.md).

  1. worker memory over hundreds of work units: a plain loop over units (decode, write), with
     and without the memory release the job does after every unit (common/memory.py), and the
     job on a Dask cluster (2 worker processes), with Dask's profiler off (as deploy/run_dask.sh
     starts workers) and on (Dask's default), and on the DirectRunner in multi_processing mode:
     resident memory after unit 10 vs after the last;
  2. cost growth: the job (DirectRunner, 2 worker processes) on 2k, 20k and 200k pairs with the
     tiny test models at beam 1, so that decoding is cheap and the pipeline's own costs show:
     seconds outside decoding per 1,000 pairs, driver and worker peak RSS, unit files written,
     files published, manifest bytes, compaction seconds; then each figure extrapolated to 50M;
  3. files follow the file target, not the input shards: the same 100k pairs as 10 and as 100
     input shards, with the file target scaled down as 50M pairs see the default one
     (--file_rows 2,000: 100k / 2,000 = 50M / 1M): bins, groups, files per table, manifest bytes;
     then a refresh that adds one shard to the 100-shard run (what it decodes, copies, keeps);
  4. a refresh's copy: the rows of 7 of 8 input shards copied out of a 1M-row compacted file.

    python bench/bench_scale.py --work runs/bench-scale [--sizes 2000,20000,200000] [--units 240]
        [--parts memory,dask,direct,cost,files,copy] [--models DIR]

The tiny models (tests/conftest.py's TINY settings) are trained into --work once. Inputs are the
toy bitext of tests/toydata.py, each pair made unique by a counter word on both sides (the toy
grammar alone repeats after ~3,400 pairs, and duplicates would be rejected before decoding).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
from fresh_process import job_popen  # noqa: E402  (the jobs it measures: bench/fresh_process.py)
LETTERS = "bcdfghjklmnpqrstvwxz"


def _word(i: int) -> str:
    out = ""
    while True:
        out = LETTERS[i % len(LETTERS)] + out
        i //= len(LETTERS)
        if not i:
            return "q" + out


def unique_pairs(n: int, seed: int = 11) -> list[tuple[str, str]]:
    from tests.toydata import toy_bitext

    base = toy_bitext(min(n, 5000), seed=seed)
    return [(f"{base[i % len(base)][0][:-2]} {_word(i)} .", f"{base[i % len(base)][1][:-2]} {_word(i)} .")
            for i in range(n)]


def models(work: str) -> str:
    out = os.path.join(work, "tiny-models")
    if not os.path.isfile(os.path.join(out, "cs-en", "model.pt")):
        from models.nmt.train import train_models
        from tests.conftest import TINY
        from tests.toydata import toy_bitext

        train_models(toy_bitext(1500, seed=0), out, "cs", "en", **TINY)
    return out


# ------------------------------------------------------------------ 1. memory over units
def plain_loop(model_dir: str, units: int, per_unit: int, release: bool, workdir: str) -> dict:
    """Units decoded and written one after another in this process: RSS after each."""
    import dataclasses

    import psutil
    import torch

    from common.memory import release_memory
    from models.nmt.engines.loading import load_engine
    from paracorpus.cleaning import pair_id
    from paracorpus.config import PRESETS
    from paracorpus.paraphrasing import piece_limits
    from paracorpus.steps import decoding_steps
    from paracorpus.units import PAIR, generate_unit, write_unit

    torch.set_num_threads(1)
    fwd = load_engine(os.path.join(model_dir, "cs-en"), device="cpu")
    bwd = load_engine(os.path.join(model_dir, "en-cs"), device="cpu")
    cfg = dataclasses.replace(PRESETS["parabank2-cpu"], num_sets=2, num_samples=4, score_threshold=None,
                              dual_xent_threshold=None)
    steps = decoding_steps(fwd, bwd, cfg, "bench", piece_limits(fwd, bwd, cfg.max_pieces))
    pairs = unique_pairs(units * per_unit)
    rss, proc = [], psutil.Process()
    for u in range(units):
        chunk = pairs[u * per_unit:(u + 1) * per_unit]
        elements = [(PAIR, {"pair_id": pair_id("s.tsv", u * per_unit + i, s, t), "input_shard": "s.tsv",
                            "input_index": u * per_unit + i, "source": s, "reference": t})
                    for i, (s, t) in enumerate(chunk)]
        result = generate_unit(elements, steps, cfg.batch_pairs, "bench")
        write_unit(workdir, os.path.join(workdir, "_work"), u, 0, "cs-en", result, 0.0, "s.tsv")
        del result, elements
        if release:
            release_memory()
        rss.append(proc.memory_info().rss / 2**20)
    return {"units": units, "after_10": rss[9], "last": rss[-1], "peak_after_10": max(rss[9:]),
            "ratio": rss[-1] / rss[9], "curve": [round(rss[i], 1) for i in (0, 9, 49, 99, 149, 199, units - 1)
                                                  if i < units]}


def _tree_sampler(pid: int, stop: threading.Event, samples: list, every: float = 0.1) -> None:
    """Sample (time, RSS MB of PID, {child pid: RSS MB}) until STOP."""
    import psutil

    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    while not stop.is_set():
        try:
            children = {c.pid: c.memory_info().rss / 2**20 for c in root.children(recursive=True)}
            samples.append((time.time(), root.memory_info().rss / 2**20, children))
        except psutil.NoSuchProcess:
            break
        stop.wait(every)


def _write_input(pairs, folder: str, shards: int) -> str:
    os.makedirs(folder, exist_ok=True)
    per = -(-len(pairs) // shards)
    for k in range(shards):
        with open(os.path.join(folder, f"part-{k:04d}.tsv"), "w", encoding="utf-8") as f:
            f.writelines(f"{s}\t{t}\n" for s, t in pairs[k * per:(k + 1) * per])
    return folder


def _job(args: list[str], env: dict | None = None, watch=None) -> tuple[dict, list, float]:
    """Run paragen-generate ARGS as a process, sampling the RSS of it and its children (and of the
    processes WATCH() returns); (manifest, samples, seconds)."""
    stop, samples = threading.Event(), []
    start = time.time()
    proc = job_popen([sys.executable, "-m", "beam_pipelines.generate", *args], cwd=ROOT,
                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                     env={**os.environ, "PYTHONPATH": ROOT, **(env or {})})
    threads = [threading.Thread(target=_tree_sampler, args=(proc.pid, stop, samples), daemon=True)]
    watched: list = []
    for pid in (watch() if watch else []):
        watched.append([])
        threads.append(threading.Thread(target=_tree_sampler, args=(pid, stop, watched[-1]), daemon=True))
    for t in threads:
        t.start()
    _, err = proc.communicate()
    seconds = time.time() - start
    stop.set()
    if proc.returncode:
        raise SystemExit(f"the job failed ({proc.returncode}):\n{err[-3000:]}")
    out = args[args.index("--output") + 1]
    with open(os.path.join(out, "_manifest.json")) as f:
        manifest = json.load(f)
    manifest["_bytes"] = os.path.getsize(os.path.join(out, "_manifest.json"))
    return manifest, (samples, watched), seconds


def _units_done(out: str) -> int:
    """Work units the run into OUT has finished so far (their completion records)."""
    work_dir = os.path.join(out, "_work")
    if not os.path.isdir(work_dir):
        return 0
    return sum(len(os.listdir(os.path.join(work_dir, r, "units"))) for r in os.listdir(work_dir)
               if os.path.isdir(os.path.join(work_dir, r, "units")))


def _memory_row(series: list, units: int) -> dict:
    """A worker's figures from SERIES, [(units the run had finished, RSS MB)] over time."""
    def high_water(k):          # the worker's peak RSS until the run had finished K units
        return max((rss for n, rss in series if n <= k), default=0.0)

    def at(k):                  # its RSS when the run had finished K units
        return next((rss for n, rss in series if n >= k), series[-1][1])

    def window(k):              # its lowest and highest RSS while the run finished units K..K+39
        values = [rss for n, rss in series if k <= n < k + 40] or [0.0]
        return round(min(values)), round(max(values))
    marks = (20, units // 4, units // 2, 3 * units // 4, units)
    return {"at_20": at(20), "at_last_unit": at(units), "peak_at_20": high_water(20),
            "peak_at_end": max(rss for _, rss in series),
            "curve": [round(at(k)) for k in marks], "peaks": [round(high_water(k)) for k in marks],
            "windows": [window(k) for k in range(20, units - 39, 40)]}


def _memory_job(model_dir: str, inp: str, out: str, per_unit: int) -> list[str]:
    """The generation job of the memory runs: parabank2-cpu with 2x4 samples, nothing filtered."""
    return ["--input", inp, "--output", out, "--forward_model", os.path.join(model_dir, "cs-en"),
            "--backward_model", os.path.join(model_dir, "en-cs"), "--num_sets", "2", "--num_samples", "4",
            "--score_threshold", "-1", "--dual_xent_threshold", "-1", "--unit_pairs", str(per_unit)]


def dask_memory(model_dir: str, units: int, per_unit: int, work: str, profiler: bool = False) -> dict:
    """The job on a local Dask cluster (2 worker processes, 1 thread each) over UNITS units: each
    worker's RSS when the run had finished 20 units (10 a worker) and its last. PROFILER: leave
    Dask's statistical profiler on in the workers (its default; deploy/run_dask.sh turns it off)."""
    import psutil
    from bench_cluster import DaskCluster

    os.makedirs(os.path.join(work, "dask"), exist_ok=True)
    with DaskCluster(2, os.path.join(work, "dask"), profiler) as cluster:
        address, pids = cluster.address, cluster.pids
        inp = _write_input(unique_pairs(units * per_unit, seed=13), os.path.join(work, "dask-in"), 1)
        out = os.path.join(work, "dask-out")
        subprocess.run(["rm", "-rf", out])
        stop, per_worker = threading.Event(), {pid: [] for pid in pids}

        def sample():
            while not stop.is_set():
                n = _units_done(out)
                for pid in pids:
                    try:
                        per_worker[pid].append((n, psutil.Process(pid).memory_info().rss / 2**20))
                    except psutil.NoSuchProcess:
                        pass
                stop.wait(0.3)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        manifest, _, seconds = _job([*_memory_job(model_dir, inp, out, per_unit), "--runner", "DaskRunner",
                                     "--dask_client_address", address])
        stop.set()
        sampler.join()
        rows = {pid: _memory_row(series, units) for pid, series in per_worker.items()}
        return {"units": manifest["units"]["written"], "per_worker": manifest["units"]["per_worker"],
                "workers": rows, "seconds": seconds}


def direct_memory(model_dir: str, units: int, per_unit: int, work: str) -> dict:
    """The same job on the DirectRunner in multi_processing mode (2 worker processes): each worker
    process's RSS when the run had finished 20 units and its last, as for Dask."""
    import bisect

    inp = _write_input(unique_pairs(units * per_unit, seed=13), os.path.join(work, "dask-in"), 1)
    out = os.path.join(work, "direct-out")
    subprocess.run(["rm", "-rf", out])
    stop, done = threading.Event(), []

    def count():
        while not stop.is_set():
            done.append((time.time(), _units_done(out)))
            stop.wait(0.1)
    counter = threading.Thread(target=count, daemon=True)
    counter.start()
    manifest, (samples, _), seconds = _job([*_memory_job(model_dir, inp, out, per_unit),
                                            "--direct_running_mode", "multi_processing", "--direct_num_workers", "2"])
    stop.set()
    counter.join()
    times = [t for t, _ in done]
    per_child: dict = {}
    for t, _root, children in samples:
        n = done[max(0, bisect.bisect_right(times, t) - 1)][1] if done else 0
        for pid, rss in children.items():
            per_child.setdefault(pid, []).append((n, rss))
    # the two SDK worker processes: the children that did the work, the largest
    workers = sorted(per_child, key=lambda pid: -max(r for _, r in per_child[pid]))[:2]
    return {"units": manifest["units"]["written"], "per_worker": manifest["units"]["per_worker"],
            "workers": {pid: _memory_row(per_child[pid], units) for pid in workers}, "seconds": seconds}


# ------------------------------------------------------------------ 2. cost growth
def _paranmt_job(model_dir: str, folder: str, out: str, *extra: str) -> tuple[dict, list, float]:
    """The job of parts 2 and 3 into a fresh OUT: DirectRunner, 2 worker processes, paranmt at beam 1,
    forward model only; (manifest, RSS samples of the job's processes, seconds)."""
    subprocess.run(["rm", "-rf", out])
    manifest, (samples, _), seconds = _job(
        ["--input", folder, "--output", out, "--forward_model", os.path.join(model_dir, "cs-en"), "--preset", "paranmt",
         "--beam", "1", "--direct_running_mode", "multi_processing", "--direct_num_workers", "2", *extra])
    return manifest, samples, seconds


def cost(model_dir: str, pairs: int, work: str) -> dict:
    """The job (DirectRunner, 2 worker processes, beam 1, forward model only) on PAIRS pairs."""
    folder = os.path.join(work, f"in-{pairs}")
    if not os.path.isdir(folder):
        _write_input(unique_pairs(pairs, seed=17), folder, max(1, pairs // 20000))
    manifest, samples, seconds = _paranmt_job(model_dir, folder, os.path.join(work, f"out-{pairs}"))
    decoding = sum(manifest["units"]["decoding_seconds_per_worker"].values())
    driver = max((s[1] for s in samples), default=0.0)
    worker = max((max(s[2].values()) for s in samples if s[2]), default=0.0)
    files = sum(len(v) for v in manifest["files"].values())
    return {"pairs": pairs, "seconds": seconds, "decoding_seconds": decoding,
            "outside_per_1000": (seconds - decoding / 2) / pairs * 1000, "driver_rss_mb": driver,
            "worker_rss_mb": worker, "units": manifest["units"]["written"], "unit_files": manifest["units"]["unit_files"],
            "files": files, "manifest_bytes": manifest["_bytes"],
            "compaction_seconds": manifest["units"]["compaction_seconds"],
            "shards": len(manifest["inputs"]), "reconciled": manifest["counts"]["reconciled"]}


FILES_PAIRS, FILES_TARGET = 100_000, 2_000      # 100k / 2,000 = 50M / the default 1M rows


def _files_row(manifest: dict, seconds: float) -> dict:
    inputs = manifest["inputs"]
    return {"shards": len(inputs), "bins": len({e["bin"] for e in inputs}),
            "groups": len({(e["bin"], e["shard"]) for t in manifest["files"].values() for e in t}),
            "paraphrase_files": len(manifest["files"]["paraphrases"]),
            "files": sum(len(v) for v in manifest["files"].values()),
            "rows_per_file": manifest["counts"]["paraphrase_rows"] / max(len(manifest["files"]["paraphrases"]), 1),
            "manifest_bytes": manifest["_bytes"], "seconds": seconds,
            "compaction_seconds": manifest["units"]["compaction_seconds"],
            "partitions": manifest["config"]["num_output_shards"]}


def files_and_refresh(model_dir: str, work: str) -> dict:
    """Part 3: FILES_PAIRS pairs as 10 and as 100 input shards, then a refresh adding one shard."""
    pairs = unique_pairs(FILES_PAIRS + FILES_PAIRS // 100, seed=23)
    rows = {}
    for shards in (10, 100):
        folder = os.path.join(work, f"files-in-{shards}")
        if not os.path.isdir(folder):
            _write_input(pairs[:FILES_PAIRS], folder, shards)
        manifest, _samples, seconds = _paranmt_job(model_dir, folder, os.path.join(work, f"files-out-{shards}"),
                                                   "--file_rows", str(FILES_TARGET))
        rows[shards] = _files_row(manifest, seconds)
    folder = os.path.join(work, "files-in-100")
    with open(os.path.join(folder, "part-9999.tsv"), "w", encoding="utf-8") as f:      # the new shard
        f.writelines(f"{s}\t{t}\n" for s, t in pairs[FILES_PAIRS:])
    try:
        manifest, _samples, seconds = _paranmt_job(model_dir, folder, os.path.join(work, "files-out-refresh"),
                                                   "--file_rows", str(FILES_TARGET), "--previous",
                                                   os.path.join(work, "files-out-100"))
    finally:
        os.remove(os.path.join(folder, "part-9999.tsv"))
    refresh = _files_row(manifest, seconds)
    prev = manifest["previous"]
    own = [e for e in manifest["files"]["paraphrases"] if not e["path"].startswith("../")]
    refresh.update(decoded=sum(1 for e in manifest["inputs"] if e["decoded_in"] == manifest["run_id"]),
                   copied=len(prev["copied_shards"]),
                   copied_records=sum(e["records_read"] for e in manifest["inputs"]
                                      if e["input_shard"] in prev["copied_shards"]),
                   kept_files=len(manifest["files"]["paraphrases"]) - len(own), written_files=len(own))
    return {"runs": rows, "refresh": refresh}


COPY_SHARDS = [f"part-{k:04d}.tsv" for k in range(8)]


def write_copy_input(work: str, rows: int = 1_000_000) -> dict:
    """Part 4's input: ROWS paraphrase rows of 8 input shards in one compacted file (row groups as
    compaction writes them)."""
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    from paracorpus.compaction import ROW_GROUP_ROWS
    from paracorpus.schema import PARAPHRASES

    # text as varied as a real corpus's (the toy grammar's repeats would compress to nothing):
    # sentences of 8-20 words drawn from 30,000 made-up ones
    rng = random.Random(29)
    vocab = ["".join(rng.choice(LETTERS + "aeiouy") for _ in range(rng.randint(2, 10))) for _ in range(30_000)]
    pairs = [(" ".join(rng.choices(vocab, k=rng.randint(8, 20))), " ".join(rng.choices(vocab, k=rng.randint(8, 20))))
             for _ in range(rows)]
    n = len(pairs)
    names, shards = COPY_SHARDS, len(COPY_SHARDS)
    columns = {"pair_id": [f"{i:016x}" for i in range(n)], "src_lang": ["cs"] * n, "tgt_lang": ["en"] * n,
               "source": [p[0] for p in pairs], "reference": [p[1] for p in pairs],
               "paraphrase": [" ".join(reversed(p[1].split())) for p in pairs], "rank": [1] * n,
               "cluster_id": [1] * n, "cluster_size": [3] * n, "forward_nll": [0.5] * n, "backward_nll": [0.7] * n,
               "combined_score": [0.6] * n, "constraint_set": [[]] * n, "constraint_set_id": [-1] * n,
               "num_sampled": [12] * n, "num_surviving": [4] * n, "mode": ["beam"] * n, "config_hash": ["c"] * n,
               "input_shard": [names[i * shards // n] for i in range(n)], "input_index": list(range(n)),
               "lang_pair": ["cs-en"] * n, "shard": [0] * n}
    old = os.path.join(work, "copy-old.parquet")
    pq.write_table(pa.table(columns, schema=PARAPHRASES.schema), old, compression="zstd",
                   row_group_size=ROW_GROUP_ROWS)
    return {"path": old, "rows": rows, "bytes": os.path.getsize(old)}


def copy_cost(work: str, entry: dict) -> dict:
    """What a refresh pays per group of a bin it touches: the rows of all input shards but one of
    the file ENTRY (write_copy_input) copied into new files (compact_group with a carry)."""
    import resource

    from paracorpus.compaction import FileTarget, carry_item, compact_group

    out = os.path.join(work, "copy-out")
    subprocess.run(["rm", "-rf", out])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    record = compact_group(out, os.path.join(out, "_work"), "cs-en", "b1", 0, [],
                           [carry_item("paraphrases", entry["path"], COPY_SHARDS[1:], entry)], FileTarget())
    seconds = time.perf_counter() - start
    copied = sum(f["rows"] for f in record["files"]["paraphrases"])
    return {"rows": entry["rows"], "copied": copied, "seconds": seconds, "file_mb": entry["bytes"] / 2**20,
            "files": len(record["files"]["paraphrases"]),
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "peak_before_mb": before}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default=os.path.join(ROOT, "runs", "bench-scale"))
    ap.add_argument("--sizes", default="2000,20000,200000")
    ap.add_argument("--units", type=int, default=240, help="units of the memory runs (default 240)")
    ap.add_argument("--unit_pairs", type=int, default=50, help="pairs per unit in the memory runs (default 50)")
    ap.add_argument("--parts", default="memory,dask,direct,cost,files,copy")
    ap.add_argument("--models", help="a folder with cs-en/ and en-cs/ (default: tiny models trained into --work)")
    a = ap.parse_args(argv)
    parts = a.parts.split(",")
    if set(parts) - {"memory", "dask", "direct", "cost", "files", "copy"}:
        ap.error(f"unknown --parts: {a.parts}")
    if "memory" in parts and a.units < 10:            # its table compares the RSS after unit 10 with the last
        ap.error(f"--units {a.units}: the memory part needs at least 10")
    os.makedirs(a.work, exist_ok=True)
    model_dir = a.models or models(a.work)
    print(f"# bench_scale: {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores\n", flush=True)
    if "memory" in parts:
        print(f"## 1a. A plain loop over {a.units} units of {a.unit_pairs} pairs (parabank2-cpu with 2x4 samples), "
              "RSS MB\n")
        print("| memory release after each unit | after unit 10 | after the last | peak after unit 10 | last / unit 10 "
              "| curve (units 1, 10, 50, 100, 150, 200, last) |\n|---|---|---|---|---|---|")
        for release in (False, True):
            r = _fresh("plain_loop", model_dir, a.units, a.unit_pairs, release, os.path.join(a.work, f"loop-{release}"))
            print(f"| {'yes (the job)' if release else 'no'} | {r['after_10']:.0f} | {r['last']:.0f} | "
                  f"{r['peak_after_10']:.0f} | {r['ratio']:.3f} | {r['curve']} |", flush=True)
    if "dask" in parts:
        for profiler in (False, True):
            r = dask_memory(model_dir, a.units, a.unit_pairs, a.work, profiler)
            _print_workers(f"1b. The job on a Dask cluster, {r['units']} units of {a.unit_pairs} pairs, 2 worker processes "
                           f"({r['per_worker']}), Dask's profiler {'on (its default)' if profiler else 'off'}", r)
    if "direct" in parts:
        r = direct_memory(model_dir, a.units, a.unit_pairs, a.work)
        _print_workers(f"1c. The job on the DirectRunner (multi_processing), {r['units']} units of {a.unit_pairs} "
                       f"pairs, 2 worker processes ({r['per_worker']})", r)
    if "cost" in parts:
        rows = [cost(model_dir, int(n), a.work) for n in a.sizes.split(",")]
        print("\n## 2. Cost growth: DirectRunner, 2 worker processes, beam 1, forward model only\n")
        print("| pairs | shards | units | seconds | decoding s (sum) | outside decoding s / 1,000 pairs | driver RSS MB | "
              "worker RSS MB | unit files | published files | manifest bytes | compaction s |")
        print("|" + "---|" * 12)
        for r in rows:
            print(f"| {r['pairs']:,} | {r['shards']} | {r['units']} | {r['seconds']:.1f} | {r['decoding_seconds']:.1f} | "
                  f"{r['outside_per_1000']:.2f} | {r['driver_rss_mb']:.0f} | {r['worker_rss_mb']:.0f} | "
                  f"{r['unit_files']:,} | {r['files']} | {r['manifest_bytes']:,} | {r['compaction_seconds']:.1f} |",
                  flush=True)
        big = rows[-1]
        scale = 50_000_000 / big["pairs"]
        shards_50m = 50_000_000 // 20000
        print(f"\nExtrapolated to 50M pairs (from the {big['pairs']:,}-pair row; inputs in shards of 20,000 pairs, "
              f"{shards_50m:,} shards):\n")
        print("| figure | formula | at 50M |\n|---|---|---|")
        print(f"| outside decoding | {big['outside_per_1000']:.2f} s per 1,000 pairs x 50,000 / workers | "
              f"{big['outside_per_1000'] * 50_000 / 3600:.1f} worker-hours |")
        print(f"| unit files written (then compacted) | {big['unit_files'] / big['pairs'] * 1000:.2f} per 1,000 pairs | "
              f"{big['unit_files'] * scale:,.0f} |")
        print("| published files, manifest | part 3 (they follow the file target) | part 3 |")
        print(f"| compaction | {big['compaction_seconds'] / big['pairs'] * 1000:.3f} s per 1,000 pairs | "
              f"{big['compaction_seconds'] * scale / 3600:.1f} worker-hours |")
        print(f"| driver RSS | {rows[0]['driver_rss_mb']:.0f} -> {big['driver_rss_mb']:.0f} MB from "
              f"{rows[0]['pairs']:,} to {big['pairs']:,} pairs | see text |")
    if "files" in parts:
        r = files_and_refresh(model_dir, a.work)
        print(f"\n## 3. Files follow the file target: {FILES_PAIRS:,} pairs, --file_rows {FILES_TARGET:,} "
              f"({FILES_PAIRS // FILES_TARGET} files' worth, as 50M pairs with the default 1M), paranmt beam 1\n")
        print("| input shards | bins | groups (bin x partition) | paraphrase files | rows per paraphrase file | "
              "files, 3 tables | per input shard and partition instead (the minimum) | manifest bytes | seconds | "
              "compaction s |\n|---|---|---|---|---|---|---|---|---|---|")
        for shards, x in r["runs"].items():
            print(f"| {shards} | {x['bins']} | {x['groups']} | {x['paraphrase_files']} | {x['rows_per_file']:,.0f} | "
                  f"{x['files']} | {3 * shards * x['partitions']:,} | {x['manifest_bytes']:,} | {x['seconds']:.1f} | "
                  f"{x['compaction_seconds']:.1f} |", flush=True)
        ten, hundred, f = r["runs"][10], r["runs"][100], r["refresh"]
        per_shard = (hundred["manifest_bytes"] - ten["manifest_bytes"]) / 90
        print(f"\nManifest at 50M pairs in 2,500 input shards of 20,000: the 10-shard manifest plus "
              f"{per_shard:,.0f} bytes per further input shard (its inputs entry: paths, sha256, sizes, counts) = "
              f"{(ten['manifest_bytes'] + per_shard * 2490) / 2**20:.2f} MB; "
              f"files per table as above ({hundred['paraphrase_files']} paraphrase files).\n")
        print(f"A refresh adding one input shard of {FILES_PAIRS // 100:,} pairs to the 100-shard run: decoded "
              f"{f['decoded']} shard(s), copied {f['copied']} shard(s) ({f['copied_records']:,} records, the "
              f"under-full last bin), kept {f['kept_files']} paraphrase files by reference, wrote {f['written_files']}; "
              f"{f['seconds']:.1f} s (the 100-shard run: {hundred['seconds']:.1f} s), compaction "
              f"{f['compaction_seconds']:.1f} s; {f['bins']} bins, {f['paraphrase_files']} paraphrase files.")
    if "copy" in parts:
        r = _fresh("copy_cost", a.work, _fresh("write_copy_input", a.work))
        print(f"\n## 4. A refresh's copy: {r['copied']:,} of {r['rows']:,} paraphrase rows ({r['file_mb']:.0f} MB file) "
              f"copied into {r['files']} file(s) in {r['seconds']:.1f} s ({r['copied'] / r['seconds']:,.0f} rows/s); "
              f"peak RSS of the process {r['peak_before_mb']:.0f} MB before the copy, {r['peak_mb']:.0f} MB after")
    return 0


def _print_workers(title: str, r: dict) -> None:
    """The table of a memory run's workers (dask_memory, direct_memory)."""
    print(f"\n## {title}, RSS MB\n")
    print("| worker | RSS when 20 units were done | when the last unit was done | ratio | RSS curve (units 20, 1/4, "
          "1/2, 3/4, all) | peak until those units | low and high while units 20-59, 60-99, ... were decoded | "
          "peak of the job (with compaction) |\n|---|---|---|---|---|---|---|---|")
    for i, w in enumerate(r["workers"].values()):
        print(f"| {i + 1} | {w['at_20']:.0f} | {w['at_last_unit']:.0f} | {w['at_last_unit'] / w['at_20']:.3f} | "
              f"{w['curve']} | {w['peaks']} | {w['windows']} | {w['peak_at_end']:.0f} |", flush=True)


def _fresh(function: str, *args) -> dict:
    """FUNCTION(*ARGS) of this module in a fresh process (its own caches, threads and peak memory)."""
    from fresh_process import in_fresh_process

    return in_fresh_process("bench_scale", function, *args)


if __name__ == "__main__":
    sys.exit(main())
