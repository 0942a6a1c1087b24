"""The generation job on a GPU: decoding engines and the whole job, each beside its baseline.

    python bench/bench_gpu.py --forward_model M/cs-en --backward_model M/en-cs \\
        --bitext ../shared/data/bitext/multi30k --out gpu.json [--pairs 2000] [--sources 500]

--bitext is a folder with Multi30k-style train.{cs,en}.gz (the job's pairs) and val.{cs,en}.gz
(the engines' sources). On a GPU it prints (Markdown) and writes to --out (JSON, rewritten after
every section, so a run stopped by a time limit keeps what it measured):

  1. engines, --sources sources, top-10: our sampler (30 samples; 5 constraint sets x 6) in each
     of --precisions, against fairseq-generate --sampling (fp16 and fp32, batch 256, every output
     checked); beam 12 in process (fairseq's SequenceGenerator) against fairseq-generate (batch 128);
  2. device synchronisations per decoder step of one sample() call (torch.cuda sync debug mode),
     and torch.profiler over one such call, unconstrained and constrained (host and device busy
     time, the ops that take the most of each);
  3. dual scores of 150 candidates a source in each precision: ms a source, and each one's
     largest and mean difference from fp32 (nats per token);
  4. the whole job (DirectRunner, --device cuda) on --pairs pairs in each of --job_variants
     (processes per GPU, decoder step, precision, MPS, preset): pairs/s of the command and of its
     decoding alone, units per worker, worker time per stage, compile seconds, whether MPS was on,
     the GPU's busy fraction (nvidia-smi every 0.5 s while the job runs), and the GPU-hours 50M
     pairs take;
  5. steps: the decoder step modes (--step_modes: tree, fixed, compiled, graphs) in each of
     --step_precisions on one sample() call of 100 sources (5 constraint sets x 6 samples, and 30
     free samples): seconds (best of 3 after a warm-up that compiles), compile seconds, decoder
     steps, device kernels and device ms a step (torch.profiler's CUDA activity), host launch
     calls a step (cudaLaunchKernel, cuLaunchKernel, cudaGraphLaunch, ...), and how many samples
     differ from the tree loop's (float rounding deciding a near-tie).

Without a GPU it prints the CPU proxies and exits 0: the tensor operations of a decoder step on
the code paths a GPU takes (its kernel launches: what a launch-bound step's time follows), by
name, for the tree loop and the fixed-shape step, and the calls a compiled step makes a step
(inductor's fused kernels and the library calls it keeps: on a GPU each is a launch); host<->device
round trips during sample() and score() and the tensor operations per decoder step on the CPU's own
paths (models/nmt/decoding/round_trips.py), the host milliseconds per pair to find banned phrases
(two units of up to 500 of the --pairs), and the job's host milliseconds per pair by stage, outside
the engines' calls (the given models on this CPU).
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
from fresh_process import job_run  # noqa: E402  (the jobs it measures: bench/fresh_process.py)

TARGET_PAIRS = 50_000_000
# The job runs, most valuable first: the defaults (tree, tf32, MPS where it can start: the baseline
# of the others), then 8 processes and the compiled modes, then MPS off and fp32. Measured on an
# H200: 2026-11-28 4:tree:fp32:off (98.8 decode pairs/s) and 4:graphs:tf32:auto (83.6); 2026-12-04
# 4:tree:fp32:off (92.8), 4:tree:tf32:auto (199) and 4:tree:tf32:off (191) in one run.
DEFAULT_VARIANTS = ("4:tree:tf32:auto,8:tree:tf32:auto,4:compiled:tf32:off,4:graphs:tf32:off,4:tree:tf32:off,"
                    "4:tree:fp32:off")
_NOT_STAGES = ("ms_compile", "ms_compile_in_units", "ms_warm_up")     # counted apart from the stages' time
ENGINE_STAGES = ("sample", "beam_search", "score", "dual_xent")     # time inside engine calls


def read_pairs(folder: str, split: str, n: int) -> list[tuple[str, str]]:
    def lines(lang):
        with gzip.open(os.path.join(folder, f"{split}.{lang}.gz"), "rt", encoding="utf-8") as f:
            return [line.strip() for _, line in zip(range(n), f)]
    return [(s, t) for s, t in zip(lines("cs"), lines("en")) if s and t]


def constrained_requests(pairs, sets: int, samples: int):
    """SETS constraint sets per source (the job's own draw), SAMPLES samples each."""
    from models.nmt.engine import SampleRequest
    from paracorpus.constraints import draw_constraint_sets

    return [SampleRequest(src, f"b{i}:{k}", words, samples) for i, (src, ref) in enumerate(pairs)
            for k, words in enumerate(draw_constraint_sets(ref, sets, 1, f"b{i}", 3))]


def free_requests(pairs, samples: int):
    from models.nmt.engine import SampleRequest

    return [SampleRequest(src, f"b{i}", (), samples) for i, (src, _) in enumerate(pairs)]


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_samples(engine, runs: dict, rounds: int = 3) -> dict:
    """{label: seconds (best and median of ROUNDS), candidates, tokens} of engine.sample over each of
    RUNS ({label: requests}), the labels alternating round by round after a full-size warm-up call
    of each (allocator, kernels, the memo of spelled banned words): calls one after another share
    the machine's state, so the ratio of two labels is fair."""
    out = {}
    for reqs in runs.values():
        engine.sample(reqs, topk=10, seed=0)
    times: dict = {label: [] for label in runs}
    for _ in range(rounds):
        for label, reqs in runs.items():
            _sync()
            start = time.perf_counter()
            got = engine.sample(reqs, topk=10, seed=0)
            _sync()
            times[label].append(time.perf_counter() - start)
            out[label] = {"candidates": sum(len(h) for h in got),
                          "tokens": sum(len(x.token_ids) + 1 for h in got for x in h)}
    return {label: {"seconds": min(times[label]), "median_seconds": statistics.median(times[label]), **out[label]}
            for label in runs}


# ---------------------------------------------------------------------------- on a GPU
def bench_engines(args, sources_pairs, emit) -> None:
    from bench_generation import fairseq_generate, fairseq_generate_sampling
    from models.nmt.engines.fairseq_engine import Translator

    n = len(sources_pairs)
    sources = [s for s, _ in sources_pairs]
    rows = []
    engines = {p: Translator(args.forward_model, device=args.device, precision=p) for p in args.precisions}
    for precision, engine in engines.items():
        runs = {f"ours, 30 samples, {precision}": free_requests(sources_pairs, 30),
                f"ours, 5 constraint sets x 6 samples, {precision}": constrained_requests(sources_pairs, 5, 6)}
        for label, r in timed_samples(engine, runs).items():
            rows.append({"engine": label, **r, "sources_per_s": n / r["seconds"]})
        emit("engines", rows)
    t = engines["fp32"]
    for fp16 in (True, False):
        if fp16 and args.device == "cpu":
            continue
        r = fairseq_generate_sampling(t, sources, 30, 10, device=args.device, batch_size=256, fp16=fp16)
        rows.append({"engine": f"fairseq-generate --sampling, batch 256, {'fp16' if fp16 else 'fp32'}", **r,
                     "sources_per_s": n / r["seconds"]})
        emit("engines", rows)
    for precision in args.precisions:
        engine = engines[precision]
        engine.beam_search(sources[:8], beam=12)
        _sync()
        start = time.perf_counter()
        engine.beam_search(sources, beam=12)
        _sync()
        secs = time.perf_counter() - start
        rows.append({"engine": f"beam 12 in process, {precision}", "seconds": secs, "sources_per_s": n / secs})
    half = args.device != "cpu"
    r = fairseq_generate(t, sources, ["--beam", "12", "--nbest", "1"], 1, device=args.device, batch_size=128, fp16=half)
    rows.append({"engine": f"fairseq-generate --beam 12, batch 128, {'fp16' if half else 'fp32'}", **r,
                 "sources_per_s": n / r["seconds"]})
    emit("engines", rows)
    base = {r["engine"]: r["sources_per_s"] for r in rows}
    free = base["ours, 30 samples, fp32"]
    ratios = {"constrained_cost_fp32": free / base["ours, 5 constraint sets x 6 samples, fp32"]}
    for label, speed in base.items():
        if label.startswith("fairseq-generate --sampling"):
            ratios[f"ours fp32 vs {label}"] = free / speed
    for precision in args.precisions[1:]:
        ratios[f"{precision}_vs_fp32"] = base[f"ours, 30 samples, {precision}"] / free
    emit("engine_ratios", ratios)


def bench_syncs(args, sources_pairs, emit) -> None:
    """Device synchronisations per decoder step of one sample() call, as torch's sync debug mode
    reports them (every sync, explicit or inside torch), and the round-trip proxy beside them."""
    import warnings

    import torch

    from models.nmt.decoding.round_trips import count_decoder_steps, count_round_trips
    from models.nmt.engines.fairseq_engine import Translator

    engine = Translator(args.forward_model, device=args.device, precision="fp32")
    engine.sample_batch_tokens = 10**9
    out = []
    for label, reqs in (("30 samples", free_requests(sources_pairs[:100], 30)),
                        ("5 sets x 6 samples", constrained_requests(sources_pairs[:100], 5, 6))):
        with warnings.catch_warnings(record=True) as caught, count_round_trips() as trips, \
                count_decoder_steps() as steps:
            warnings.simplefilter("always")
            if args.device == "cuda":
                torch.cuda.set_sync_debug_mode("warn")
            try:
                engine.sample(reqs, topk=10, seed=0)
            finally:
                if args.device == "cuda":
                    torch.cuda.set_sync_debug_mode(0)
        syncs = sum("synchroniz" in str(w.message) for w in caught)
        out.append({"requests": label, "sources": min(100, len(sources_pairs)), "steps": steps.total, "device_syncs": syncs,
                    "syncs_per_step": syncs / max(steps.total, 1), "round_trips": trips.total})
    emit("syncs", out)


def bench_profile(args, sources_pairs, emit, top: int = 12) -> None:
    """torch.profiler over one sample() call of 100 sources, unconstrained and 5 sets x 6, and over
    the job's backward score() of those 3,000 unconstrained samples against their sources (after
    a warm-up call each): the wall time, the host's and the device's busy time, and the ops that
    take the most of each (self time). Where the constrained step's extra time goes, and whether
    scoring waits for the host or the device."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from models.nmt.engines.fairseq_engine import Translator

    engine = Translator(args.forward_model, device=args.device, precision="fp32")
    engine.sample_batch_tokens = 10**9
    cuda = args.device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    free = free_requests(sources_pairs[:100], 30)
    texts = [(h.text, r.source) for r, hs in zip(free, engine.sample(free, topk=10, seed=0)) for h in hs]
    backward = Translator(args.backward_model, device=args.device, precision="fp32")
    calls = (("30 samples", lambda: engine.sample(free, topk=10, seed=0)),
             ("5 sets x 6 samples",
              lambda reqs=constrained_requests(sources_pairs[:100], 5, 6): engine.sample(reqs, topk=10, seed=0)),
             (f"score {len(texts)} samples (backward)",
              lambda: backward.score([e for e, _ in texts], [f for _, f in texts])))
    out = []
    for label, call in calls:
        call()                                                   # warm-up: allocator, kernels, ban memo
        _sync()
        start = time.perf_counter()
        with profile(activities=activities) as prof:
            call()
            _sync()
        wall = time.perf_counter() - start
        events = prof.key_averages()
        device_us = sum(getattr(e, "self_device_time_total", 0) or 0 for e in events) if cuda else None

        def ranked(key):
            return [{"op": e.key[:60], "calls": e.count, "self_ms": round(getattr(e, key) / 1e3, 2)}
                    for e in sorted(events, key=lambda e: -getattr(e, key))[:top] if getattr(e, key)]
        out.append({"requests": label, "sources": min(100, len(sources_pairs)), "wall_s": round(wall, 3),
                    "host_self_s": round(sum(e.self_cpu_time_total for e in events) / 1e6, 3),
                    "device_self_s": None if device_us is None else round(device_us / 1e6, 3),
                    "top_host": ranked("self_cpu_time_total"),
                    "top_device": ranked("self_device_time_total") if cuda else None})
        emit("profile", out)


# Host calls that put work on a GPU (CUDA runtime and driver API names as torch.profiler shows them).
_LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx", "cudaGraphLaunch",
             "cudaMemcpyAsync", "cudaMemsetAsync")
# Calls inside a compiled graph that launch nothing (allocations, views, bookkeeping).
_NOT_LAUNCHES = ("aten::empty", "aten::empty_strided", "aten::as_strided", "aten::view", "aten::reshape",
                 "aten::expand", "aten::resolve_conj", "aten::resolve_neg", "aten::lift_fresh", "aten::slice",
                 "aten::transpose", "aten::select", "aten::resize_", "aten::t", "aten::detach", "aten::alias")


def compiled_calls(prof) -> int:
    """Calls made inside compiled graphs (torch.profiler with inductor's kernel profiling on a
    CPU): each fused kernel and each library call the graph keeps (matrix products, top-k,
    sort, ...); on a GPU each would be a launch."""
    total = 0
    for event in prof.events():
        if event.name.startswith("## Call CompiledFxGraph"):
            total += sum(1 for child in event.cpu_children
                         if child.name.startswith("graph_") or (child.name.startswith("aten::")
                                                                and child.name not in _NOT_LAUNCHES))
    return total


def bench_steps(args, sources_pairs, emit) -> None:
    """The decoder step modes on one sample() call each (models/nmt/decoding/fixed_sampler.py): time,
    compile time, device kernels and ms a step, host launch calls a step, samples unlike the
    first mode's (the tree loop's)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from models.nmt.decoding.round_trips import computing_ops, count_decoder_steps, count_device_ops
    from models.nmt.engines.fairseq_engine import Translator

    cuda = args.device == "cuda"
    pairs = sources_pairs[:100]
    runs = {"5 sets x 6 samples": constrained_requests(pairs, 5, 6), "30 samples": free_requests(pairs, 30)}
    modes = [m for m in args.step_modes if cuda or m != "graphs"]
    rows, first = [], {}
    if not cuda:
        import torch._inductor.config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True     # the compiled kernels as profiler events
    for precision in args.step_precisions if cuda else ["fp32"]:
        for mode in modes:
            engine = Translator(args.forward_model, device=args.device, precision=precision, step_mode=mode)
            engine.sample_batch_tokens = 10**9               # one batch: the steps are comparable
            start = time.perf_counter()
            engine.warm_up("sample")                         # both graphs compiled here
            warm = time.perf_counter() - start
            timed = timed_samples(engine, runs)
            for label, reqs in runs.items():
                got = [h.token_ids for hs in engine.sample(reqs, topk=10, seed=0) for h in hs]
                want = first.setdefault((precision, label), got)
                activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
                _sync()
                with profile(activities=activities) as prof, count_decoder_steps() as steps:
                    engine.sample(reqs, topk=10, seed=0)
                    _sync()
                n = max(steps.total, 1)
                events = prof.key_averages()
                if cuda:
                    kernels = [e for e in events if str(getattr(e, "device_type", "")).endswith("CUDA")]
                    device_kernels = sum(e.count for e in kernels) / n
                    device_ms = sum(e.self_device_time_total for e in kernels) / 1e3 / n
                    launches = sum(e.count for e in events if e.key in _LAUNCHES) / n
                elif mode in ("compiled", "graphs"):
                    device_kernels = device_ms = None
                    launches = compiled_calls(prof) / n
                else:
                    device_kernels = device_ms = None
                    with count_device_ops() as ops:
                        engine.sample(reqs, topk=10, seed=0)
                    launches = computing_ops(ops) / n
                r = timed[label]
                rows.append({"mode": mode, "precision": precision, "requests": label, "sources": len(pairs),
                             "best_s": r["seconds"], "median_s": r["median_seconds"],
                             "sources_per_s": len(pairs) / r["seconds"], "warm_up_s": warm,
                             "compile_s": engine.compile_seconds, "steps": steps.total,
                             "device_kernels_per_step": device_kernels, "device_ms_per_step": device_ms,
                             "host_launches_per_step": launches,
                             # samples unlike the first mode's: float rounding deciding a near-tie
                             "samples_differing": f"{sum(a != b for a, b in zip(got, want))} of {len(want)}"})
                emit("steps", rows)
            del engine
            if cuda:
                torch.cuda.empty_cache()


def bench_precision(args, pairs, emit) -> None:
    """Dual scores in each precision: their distance from fp32's and the time of one score()
    call of 150 candidates a source (the job's parabank2 load), after a warm-up."""
    from models.nmt.engines.fairseq_engine import Translator

    english = [t for _, t in pairs for _ in range(150)]
    foreign = [s for s, _ in pairs for _ in range(150)]
    out, base = {}, None
    for precision in args.precisions:
        engine = Translator(args.backward_model, device=args.device, precision=precision)
        engine.score(english[:300], foreign[:300])
        _sync()
        start = time.perf_counter()
        got = engine.score(english, foreign)
        _sync()
        row = {"ms_per_source": (time.perf_counter() - start) * 1e3 / len(pairs), "sources": len(pairs)}
        if base is None:
            base = got
        else:
            diffs = [abs(a - b) for a, b in zip(got, base)]
            row |= {"max_abs_diff": max(diffs), "mean_abs_diff": statistics.mean(diffs)}
        out[precision] = row
    emit("score_precision", out)


class GpuBusy:
    """nvidia-smi's utilization.gpu every 0.5 s while the block runs (the fraction of time a
    kernel was running)."""

    def __enter__(self):
        self.samples, self._stop = [], threading.Event()
        self._proc = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                       "-lms", "500"], stdout=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self):
        for line in self._proc.stdout:
            try:
                self.samples.append(float(line.split(",")[0]))
            except ValueError:
                pass

    def __exit__(self, *exc):
        self._proc.terminate()
        self._proc.wait(timeout=10)

    @property
    def mean(self) -> float | None:
        return statistics.mean(self.samples) / 100 if self.samples else None


def run_job(args, tsv: str, workdir: str, preset: str, extra: list[str], gpu: bool) -> dict:
    """The job as a user runs it (a fresh process); its manifest's counts and stage counters.
    pairs_per_s is the whole command (start-up, model loading and compaction included: ~26 s on
    an H100, half of an 800-pair run); decode_pairs_per_s counts the decoding alone (the pairs
    over the busiest worker's time inside its units), what 50 million pairs would run at."""
    out = os.path.join(workdir, f"job-{preset}-{len(os.listdir(workdir))}")
    cmd = [sys.executable, "-m", "beam_pipelines.generate", "--input", tsv, "--output", out,
           "--forward_model", args.forward_model, "--backward_model", args.backward_model,
           "--src_lang", "cs", "--tgt_lang", "en", "--preset", preset, "--runner", "DirectRunner",
           "--allow_empty", *extra]      # speed is the figure: a small model's all-rejected run still counts
    start = time.perf_counter()
    if gpu and args.device == "cuda":
        with GpuBusy() as busy:
            done = job_run(cmd, capture_output=True, text=True, cwd=ROOT)
    else:
        busy = None
        done = job_run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"the job failed ({' '.join(cmd)}):\n{done.stderr[-3000:]}")
    manifest = json.load(open(os.path.join(out, "_manifest.json")))
    counts, counters, units = manifest["counts"], manifest["counters"], manifest["units"]
    read = counts["records_read"]
    decoding = max(units["decoding_seconds_per_worker"].values(), default=0) or wall
    sharing = manifest.get("gpu_sharing") or {}
    in_units = counters.get("ms_compile_in_units", 0) / 1e3
    return {"preset": preset, "options": " ".join(extra), "pairs": read, "seconds": wall,
            "pairs_per_s": read / wall, "decode_pairs_per_s": read / decoding,
            "units_per_worker": sorted(units["per_worker"].values(), reverse=True),
            "paraphrase_rows": counts["paraphrase_rows"],
            "worker_ms_per_pair": {k[3:]: v / read for k, v in sorted(counters.items())
                                   if k.startswith("ms_") and k not in _NOT_STAGES},
            "warm_up_s_per_worker": counters.get("ms_warm_up", 0) / 1e3 / max(len(units["per_worker"]), 1),
            "compile_s_per_worker": counters.get("ms_compile", 0) / 1e3 / max(len(units["per_worker"]), 1),
            # of which inside units (batch shapes the warm-up did not cover): part of the sample time
            "compile_in_units_s_per_worker": in_units / max(len(units["per_worker"]), 1),
            # the decode rate without them, what a long run (every shape compiled) approaches
            "decode_pairs_per_s_compiled": read / max(decoding - in_units / max(len(units["per_worker"]), 1), 1e-9),
            "mps": (sharing.get("mps") or {}).get("how"),
            "gpu_busy": busy.mean if busy else None,
            "gpu_hours_for_50M": TARGET_PAIRS / (read / decoding) / 3600}


def parse_variants(text: str) -> list[dict]:
    """--job_variants: comma-separated PROCESSES:STEP:PRECISION:MPS[:PRESET] (preset parabank2)."""
    out = []
    for spec in (v for v in text.split(",") if v):
        parts = spec.split(":")
        if len(parts) not in (4, 5) or not parts[0].isdigit():
            raise ValueError(f"--job_variants: {spec!r} is not PROCESSES:STEP:PRECISION:MPS[:PRESET]")
        out.append({"processes": int(parts[0]), "step": parts[1], "precision": parts[2], "mps": parts[3],
                    "preset": parts[4] if len(parts) == 5 else "parabank2"})
    return out


def job_plan(args, pairs: int, gpu: bool) -> list[tuple[str, list[str]]]:
    """(preset, options) of the job runs, one per --job_variants entry, in that order (the most
    valuable first: a run stopped by its time limit keeps the ones before). Units are
    --unit_pairs (the job's default, 500) or, where --pairs is too few for every decoding process
    to get four of them, smaller (at least 32 pairs): each run's row says what it had."""
    if not gpu:
        return [("parabank2", ["--device", "cpu", "--dual_xent_threshold", "-1"])]
    off = [] if args.device == "cuda" else ["--dual_xent_threshold", "-1"]     # a rehearsal's tiny models
    plan = []
    for v in args.job_variants:
        if args.device != "cuda" and v["step"] == "graphs":
            continue                                                          # CUDA graphs need a GPU
        unit = max(32, min(args.unit_pairs, pairs // (4 * v["processes"])))
        plan.append((v["preset"], ["--device", args.device, "--processes_per_gpu", str(v["processes"]),
                                   "--precision", v["precision"] if args.device == "cuda" else "fp32",
                                   "--decode_step", v["step"], "--mps", v["mps"], "--unit_pairs", str(unit), *off]))
    return plan


def host_stages(pairs, tsv: str) -> dict:
    """ms per pair of the stages outside the decoding work units, run as plain functions on the
    job's pairs: reading the shard, cleaning, and writing one Parquet file of paraphrase rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from common.shards import ShardSpec, read_shard
    from paracorpus.cleaning import CleaningConfig, clean_pair
    from paracorpus.schema import PARAPHRASE_SCHEMA, paraphrase_row

    start = time.perf_counter()
    records = [r for r in read_shard(ShardSpec("tsv", (tsv,), "pairs.tsv")) if not r.error]
    read = time.perf_counter() - start
    cfg = CleaningConfig()
    start = time.perf_counter()
    for r in records:
        clean_pair(r.source, r.reference, cfg)
    clean = time.perf_counter() - start
    rows = [paraphrase_row(pair_id=f"{i:016x}", src_lang="cs", tgt_lang="en", source=s, reference=t, paraphrase=t,
                            rank=k, cluster_id=k, cluster_size=3, forward_nll=1.0, backward_nll=1.0,
                            combined_score=1.0, constraint_set=["a"], constraint_set_id=0, num_sampled=150,
                            num_surviving=100, mode="sample", config_hash="0" * 16, input_shard="pairs.tsv",
                            input_index=i)
            for i, (s, t) in enumerate(pairs) for k in range(1, 6)]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        pq.write_table(pa.Table.from_pylist(rows, schema=PARAPHRASE_SCHEMA), os.path.join(tmp, "p.parquet"),
                       compression="zstd")
    write = time.perf_counter() - start
    n = max(len(pairs), 1)
    return {"read": read * 1e3 / n, "clean": clean * 1e3 / n, "write (5 rows a pair)": write * 1e3 / n}


def bench_job(args, pairs, emit, gpu: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tsv = os.path.join(tmp, "pairs.tsv")
        with open(tsv, "w", encoding="utf-8") as f:
            f.writelines(f"{s}\t{t}\n" for s, t in pairs)
        emit("host_stages_ms_per_pair", host_stages(pairs, tsv))
        runs = []
        for preset, extra in job_plan(args, len(pairs), gpu):
            runs.append(run_job(args, tsv, tmp, preset, extra, gpu))
            emit("job", runs)


# ---------------------------------------------------------------------------- CPU proxies
@contextlib.contextmanager
def gpu_paths():
    """The code paths a GPU takes, on this CPU, for counting its kernel launches: the products
    unpacked (oneDNN is the CPU's), the logits in one block (the CPU's are cache-sized) and fused
    attention (the GPU's default)."""
    from models.nmt.decoding import fixed_step, onednn, prefix_decoder
    from models.nmt.engines import fairseq_engine as translator

    saved = onednn._onednn_pack, translator._LOGIT_ROWS, prefix_decoder.PrefixDecoder.__init__, fixed_step.FUSED_ON_CPU
    init = saved[2]
    onednn._onednn_pack = lambda weight: None
    translator._LOGIT_ROWS = 10**9
    prefix_decoder.PrefixDecoder.__init__ = lambda self, *a, **k: init(self, *a, **{**k, "fused_attention": True})
    fixed_step.FUSED_ON_CPU = True
    try:
        yield
    finally:
        (onednn._onednn_pack, translator._LOGIT_ROWS, prefix_decoder.PrefixDecoder.__init__,
         fixed_step.FUSED_ON_CPU) = saved


def gpu_launches(args, sources_pairs, top: int = 12) -> list[dict]:
    """Tensor operations a decoder step as a GPU would launch them (gpu_paths), unconstrained and
    constrained, in all and by name (the most frequent): what a step's host time scales with; for
    the tree loop and the fixed-shape step eager, and the calls the compiled step makes (inductor's
    fused kernels, each a launch on a GPU, and the library calls it keeps: compiled_calls)."""
    import torch
    import torch._inductor.config as inductor_config
    from torch.profiler import profile

    from models.nmt.decoding.round_trips import computing_ops, count_decoder_steps, count_device_ops
    from models.nmt.engines.fairseq_engine import Translator

    rows = []
    requests = (("30 samples", free_requests(sources_pairs[:100], 30)),
                ("5 constraint sets x 6 samples", constrained_requests(sources_pairs[:100], 5, 6)))
    with gpu_paths():
        for mode in ("tree", "fixed", "compiled"):
            engine = Translator(args.forward_model, device="cpu", precision="fp32", step_mode=mode)   # not the shared cache
            engine.sample_batch_tokens = 10**9
            for label, reqs in requests:
                if mode == "compiled":
                    inductor_config.cpp.enable_kernel_profile = True     # fused kernels as profiler events
                    engine.sample(reqs, topk=10, seed=0)                 # compiles
                    with profile() as prof, count_decoder_steps() as steps:
                        engine.sample(reqs, topk=10, seed=0)
                    calls = compiled_calls(prof)
                    rows.append({"call": f"sample(), {label}", "step": mode, "sources": min(100, len(sources_pairs)),
                                 "launches_per_step": calls / steps.total,
                                 "most": "fused kernels and library calls of the compiled graph"})
                    continue
                with count_device_ops() as ops, count_decoder_steps() as steps:
                    engine.sample(reqs, topk=10, seed=0)
                named = [(k, v) for k, v in ops.by_kind.most_common() if k != "(views)"][:top]
                rows.append({"call": f"sample(), {label}", "step": mode, "sources": min(100, len(sources_pairs)),
                             "launches_per_step": computing_ops(ops) / steps.total,
                             "most": ", ".join(f"{k} {v / steps.total:.1f}" for k, v in named)})
            del engine
    torch._dynamo.reset()
    return rows


def cpu_proxies(args, sources_pairs, emit, unit_pairs=()) -> None:
    from models.nmt.decoding.round_trips import computing_ops, count_decoder_steps, count_device_ops, count_round_trips
    from models.nmt.engines.fairseq_engine import load_translator

    emit("gpu_launches_per_step", gpu_launches(args, sources_pairs))
    fwd = load_translator(args.forward_model, device="cpu")
    bwd = load_translator(args.backward_model, device="cpu")
    fwd.sample_batch_tokens = 10**9                # one batch per call: steps comparable across rows
    rows = []
    for label, n, reqs in (("30 samples", 100, free_requests(sources_pairs[:100], 30)),
                           ("5 constraint sets x 6 samples", 20, constrained_requests(sources_pairs[:20], 5, 6)),
                           ("5 constraint sets x 6 samples", 100, constrained_requests(sources_pairs[:100], 5, 6))):
        with count_round_trips() as trips, count_decoder_steps() as steps:
            fwd.sample(reqs, topk=10, seed=0)
        with count_device_ops() as ops:                # apart: the counting mode slows the call
            fwd.sample(reqs, topk=10, seed=0)
        rows.append({"call": f"sample(), {label}", "sources": n, "round_trips": trips.total, "steps": steps.total,
                     "per_step": trips.total / steps.total, "ops_per_step": computing_ops(ops) / steps.total})
    for n in (100, 500):
        english, foreign = [t for _, t in sources_pairs[:n]], [s for s, _ in sources_pairs[:n]]
        with count_round_trips() as trips:
            bwd.score(english, foreign)
        rows.append({"call": "score()", "sources": n, "round_trips": trips.total, "steps": None, "per_step": None})
    emit("round_trips", rows)
    emit("score_tokenization_ms_per_150_candidates", score_tokenization(bwd, fwd, sources_pairs[:40]))
    if len(unit_pairs) >= 2:
        emit("ban_setup_ms_per_pair", ban_setup(fwd, unit_pairs))


def ban_setup(fwd, pairs, unit: int = 500) -> dict:
    """Host ms per pair to find the banned phrases of its 5 constraint sets (parabank2), two
    units of UNIT pairs in a row: every word worked out afresh (as before the per-word memo), the
    first unit with an empty memo, the second with the first's; phrases asserted equal."""
    first, second = constrained_requests(pairs[:unit], 5, 6), constrained_requests(pairs[unit:2 * unit], 5, 6)

    def timed(reqs, fresh: bool):
        start, out = time.perf_counter(), []
        for r in reqs:
            if fresh:
                fwd._word_bans_memo.clear()
            out.append(fwd.banned_phrases(r.banned_words))
        return (time.perf_counter() - start) * 1e3 / max(len(reqs) // 5, 1), out

    fresh_ms, want = timed(second, True)
    fwd._word_bans_memo.clear()
    cold_ms, _ = timed(first, False)
    warm_ms, got = timed(second, False)
    if got != want:
        raise AssertionError("memoised banned phrases differ from fresh ones")
    return {"each word afresh": fresh_ms, "memo, first unit": cold_ms, "memo, second unit": warm_ms,
            "pairs a unit": min(unit, len(pairs) // 2)}


def score_tokenization(bwd, fwd, pairs) -> dict:
    """Host ms to turn one pair's 150 candidates and its source into the scorer's ids: one encode
    per text (as before) against Translator._ids_of (each distinct text once, the dictionary's
    table directly); the same ids either way."""
    import timeit

    from models.nmt.engine import SampleRequest

    hyps = fwd.sample([SampleRequest(s, f"t{i}", (), 150) for i, (s, _) in enumerate(pairs)], topk=10, seed=0)
    english = [h.text for hs in hyps for h in hs]
    foreign = [s for (s, _), hs in zip(pairs, hyps) for _ in hs]

    def per_text():
        return ([[bwd.src_dict.index(p) for p in bwd.tokenization.encode(t, "src")] + [bwd.src_dict.eos()]
                 for t in english],
                [[bwd.tgt_dict.index(p) for p in bwd.tokenization.encode(t, "tgt")] + [bwd.tgt_dict.eos()]
                 for t in foreign])

    def distinct():
        return bwd._ids_of(bwd.src_dict, english, "src"), bwd._ids_of(bwd.tgt_dict, foreign, "tgt")

    assert per_text() == distinct()
    scale = 1e3 * 150 / len(english)
    return {"per text": min(timeit.repeat(per_text, number=1, repeat=5)) * scale,
            "distinct texts, dictionary table": min(timeit.repeat(distinct, number=1, repeat=5)) * scale,
            "candidates": len(english)}


# ---------------------------------------------------------------------------- output
def print_section(name: str, value, printed: dict) -> None:
    """A section as Markdown; a table that grows prints its header once and each row once
    (PRINTED: rows printed so far by section)."""
    if isinstance(value, list) and value and isinstance(value[0], dict):
        keys = list(value[0])
        if name not in printed:
            print(f"\n## {name}\n\n| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
        for row in value[printed.get(name, 0):]:
            print("| " + " | ".join(_fmt(row.get(k)) for k in keys) + " |")
        printed[name] = len(value)
    else:
        print(f"\n## {name}\n\n" + json.dumps(value, indent=1, default=_fmt))
        printed[name] = 1
    sys.stdout.flush()


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}"
    if isinstance(v, dict):
        return ", ".join(f"{k} {_fmt(x)}" for k, x in v.items())
    return str(v)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--forward_model", required=True, help="cs->en model directory (paragen-train-nmt)")
    ap.add_argument("--backward_model", required=True, help="en->cs model directory")
    ap.add_argument("--bitext", required=True, help="folder with train.{cs,en}.gz and val.{cs,en}.gz")
    ap.add_argument("--pairs", type=int, default=2000, help="pairs of train for the whole job (default 2000)")
    ap.add_argument("--sources", type=int, default=500, help="sources of val for the engines (default 500)")
    ap.add_argument("--job_variants", default=DEFAULT_VARIANTS,
                    help="the job runs, comma-separated PROCESSES:STEP:PRECISION:MPS[:PRESET], most valuable "
                         f"first (default {DEFAULT_VARIANTS})")
    ap.add_argument("--unit_pairs", type=int, default=500,
                    help="the job runs' work unit size, if --pairs gives every process four (default 500, the job's)")
    ap.add_argument("--precisions", default="fp32,tf32,bf16,fp16",
                    help="engines' precisions on a GPU, fp32 first (default fp32,tf32,bf16,fp16)")
    ap.add_argument("--step_modes", default="tree,fixed,compiled,graphs",
                    help="decoder step modes of the steps section, the baseline first (default tree,fixed,compiled,graphs)")
    ap.add_argument("--step_precisions", default="fp32,tf32", help="precisions of the steps section (default fp32,tf32)")
    ap.add_argument("--skip", default="",
                    help="comma list of sections to skip: engines,syncs,profile,precision,job,steps")
    ap.add_argument("--out", required=True, help="JSON file for the figures")
    ap.add_argument("--rehearse", action="store_true",
                    help="without a GPU, run the GPU sections on the CPU (fp32 only): a check of this script "
                         "before a GPU machine's time is spent on it")
    args = ap.parse_args(argv)
    try:
        args.job_variants = parse_variants(args.job_variants)
    except ValueError as exc:
        ap.error(str(exc))
    args.step_modes = [x for x in args.step_modes.split(",") if x]
    args.step_precisions = [x for x in args.step_precisions.split(",") if x]
    skip = set(args.skip.split(","))

    import torch

    gpu = torch.cuda.is_available() or args.rehearse
    args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.precisions = [x for x in args.precisions.split(",") if x] if args.device == "cuda" else ["fp32"]
    if args.precisions[0] != "fp32":
        ap.error("--precisions must start with fp32 (the baseline)")
    results = {"date": time.strftime("%Y-%m-%d"),
               "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
               "torch": torch.__version__, "command": " ".join(sys.argv)}

    printed: dict = {}

    def emit(name, value):
        results[name] = value
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        print_section(name, value, printed)

    print(f"# bench_gpu on {results['device']} ({results['date']})", flush=True)
    sources = read_pairs(args.bitext, "val", args.sources)
    pairs = read_pairs(args.bitext, "train", args.pairs)
    if not gpu:
        print("\nno GPU visible: the CPU proxies (host<->device round trips, host time per stage)", flush=True)
        cpu_proxies(args, sources, emit, pairs)
        if "job" not in skip:
            bench_job(args, pairs[:min(len(pairs), 200)], emit, gpu=False)
        return 0
    for name, fn in (("steps", lambda: bench_steps(args, sources, emit)),
                     ("engines", lambda: bench_engines(args, sources, emit)),
                     ("syncs", lambda: bench_syncs(args, sources, emit)),
                     ("profile", lambda: bench_profile(args, sources, emit)),
                     ("precision", lambda: bench_precision(args, sources, emit)),
                     ("job", lambda: bench_job(args, pairs, emit, gpu=True))):
        if name in skip:
            continue
        try:
            fn()
        except Exception as exc:  # noqa: BLE001: one failed section must not lose the others' figures
            emit(f"{name}_error", f"{type(exc).__name__}: {exc}"[:2000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
