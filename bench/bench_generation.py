"""Benchmark of the generation job, every figure next to its baseline from the same run.

    python bench/bench_generation.py --models runs/multi30k-models \\
        --bitext ../shared/data/bitext/multi30k/val --sources 240 --pairs 200

Prints (Markdown):
  1. sampling throughput: our engine vs `fairseq-generate --sampling` (same model, sources, k, N,
     max length; each engine in a fresh process, its one-off costs included), and CTranslate2
     float32/int8 on the converted model when ctranslate2 is installed;
  2. clustering: ms per source at 150 candidates (bench/bench_clustering.py);
  3. Beam DirectRunner vs a plain Python loop over the same functions (whole job, same pairs);
  4. DirectRunner with 2 worker processes: torch threads per worker, all cores vs split;
  5. matrix products: PyTorch's F.linear (MKL for fp32) vs models/nmt/decoding/onednn.py Linear
     (oneDNN, prepacked weights) on the model's output projection and first FFN layer;
  6. dual scoring: Translator.score vs fairseq's SequenceScorer (same batches, same NLLs);
  7. top-k over the vocabulary: torch.topk vs models/nmt/decoding/topk.py topk_rows;
  8. peak memory (RSS) of this process and of child processes.
"""
from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
from fresh_process import job_run  # noqa: E402  (the jobs it measures: bench/fresh_process.py)


def read_pairs(prefix: str, src: str, tgt: str, n: int) -> list[tuple[str, str]]:
    def lines(lang):
        path = f"{prefix}.{lang}.gz" if os.path.exists(f"{prefix}.{lang}.gz") else f"{prefix}.{lang}"
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            return [line.strip() for _, line in zip(range(n), f)]
    return list(zip(lines(src), lines(tgt)))


def bench_sampling(model_dir: str, sources: list[str], samples: int, topk: int, sets: int,
                   repeats: int = 3) -> list[dict]:
    """Every engine once per round, `repeats` rounds, each run in a fresh process (the machine is
    shared and noisy: interleaving puts each engine and the baseline under the same load, and
    separate processes keep one engine's threads and caches from slowing the next; in one process,
    CTranslate2's idle OpenMP threads slowed torch by up to 1.6x). Per engine: the median seconds
    and the median over rounds of its speed-up against fairseq-generate in the same round."""
    from models.nmt.engines.fairseq_engine import load_translator

    t = load_translator(model_dir, device="cpu")
    base_spec = {"model_dir": model_dir, "sources": sources, "samples": samples, "topk": topk}
    engines = [
        (f"ours, {samples} samples/source", {"engine": "ours", "precision": "fp32", "sets": 0}),
        (f"ours, {sets} constraint sets x {samples // sets} samples", {"engine": "ours", "precision": "fp32", "sets": sets}),
    ]
    from models.nmt.engines.fairseq_engine import cpu_has_native_bf16

    if cpu_has_native_bf16() is False:     # the job refuses bf16 here: emulated, several times slower
        print("(this CPU has neither AVX512-BF16 nor AMX: no bf16 row)\n")
    else:
        engines.append((f"ours, {samples} samples/source, --precision bf16",
                        {"engine": "ours", "precision": "bf16", "sets": 0}))
    baseline = f"fairseq-generate --sampling --beam {samples} --nbest {samples}"
    with tempfile.TemporaryDirectory() as tmp:
        engines += ctranslate2_specs(t, sources, samples, topk, tmp)
        times: dict[str, list] = {label: [] for label, _ in engines}
        times[baseline] = []
        wall = []
        for _ in range(repeats):
            for label, spec in engines:
                times[label].append(run_engine_worker({**base_spec, **spec}))
            r = fairseq_generate_sampling(t, sources, samples, topk)
            times[baseline].append((r["seconds"], r["candidates"], r["tokens"]))
            wall.append(r["process_wall_s"])
    base = [secs for secs, _, _ in times[baseline]]
    out = []
    for label, runs in times.items():
        secs = statistics.median(x for x, _, _ in runs)
        n_cands, tokens = runs[-1][1], runs[-1][2]
        out.append({"engine": label, "seconds": secs, "sources_per_s": len(sources) / secs,
                    "candidates_per_s": n_cands / secs, "tokens_per_candidate": tokens / max(n_cands, 1),
                    "speedup": statistics.median(b / x for b, (x, _, _) in zip(base, runs)),
                    "speedups": [b / x for b, (x, _, _) in zip(base, runs)]})
    out[-1]["process_wall_s"] = statistics.median(wall)
    return out


def run_engine_worker(spec: dict) -> tuple[float, int, int]:
    """One timed run of one engine in a fresh process: (seconds, candidates, tokens incl. </s>)."""
    from fresh_process import in_process

    if in_process():                                    # the smoke tier (bench/fresh_process.py)
        r = engine_worker(json.loads(json.dumps(spec)))
        return r["seconds"], r["candidates"], r["tokens"]
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--engine_worker", json.dumps(spec)],
                          capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"engine worker failed:\n{done.stderr[-3000:]}")
    r = json.loads(done.stdout.strip().splitlines()[-1])
    return r["seconds"], r["candidates"], r["tokens"]


def engine_worker(spec: dict) -> dict:
    """Load the engine, warm it up on two sources, time one run over all of them."""
    if spec["engine"] == "ct2":
        import ctranslate2

        engine = ctranslate2.Translator(spec["path"], device="cpu", intra_threads=torch_threads())

        def run(batches):
            return [[len(h) for h in r.hypotheses] for b, limit in batches for r in engine.translate_batch(
                b, max_batch_size=len(b), beam_size=1, sampling_topk=spec["topk"],
                num_hypotheses=spec["samples"], max_decoding_length=limit)]
        run([(spec["batches"][0][0][:2], spec["batches"][0][1])])          # warm-up
        start = time.perf_counter()
        lengths = [n for r in run(spec["batches"]) for n in r]
        secs = time.perf_counter() - start
        return {"seconds": secs, "candidates": len(lengths), "tokens": sum(n + 1 for n in lengths)}
    from models.nmt.engines.fairseq_engine import SampleRequest, load_translator

    engine = load_translator(spec["model_dir"], device="cpu", precision=spec["precision"])
    sources, samples, sets = spec["sources"], spec["samples"], spec["sets"]
    if sets:
        reqs = [SampleRequest(s, f"b{i}:{k}", tuple(s.split()[k:k + 1]), samples // sets)
                for i, s in enumerate(sources) for k in range(sets)]
    else:
        reqs = [SampleRequest(s, f"b{i}", (), samples) for i, s in enumerate(sources)]
    engine.sample(reqs[:2], topk=spec["topk"], seed=0)                       # warm-up
    start = time.perf_counter()
    hyps = engine.sample(reqs, topk=spec["topk"], seed=0)
    secs = time.perf_counter() - start
    return {"seconds": secs, "candidates": sum(len(h) for h in hyps),
            "tokens": sum(len(x.token_ids) + 1 for h in hyps for x in h)}                  # + </s>


def ctranslate2_specs(t, sources: list[str], samples: int, topk: int, tmp: str) -> list:
    """A second yardstick: CTranslate2 (a dependency of the project since its CTranslate2 engine),
    a C++ inference engine, on the same model converted with its fairseq converter, float32 and
    int8. Unconstrained only: its `suppress_sequences` applies to a whole batch, not per pair.
    Same sources, k, N and length limit (per batch of 16 length-sorted sources, the limit of the
    longest), so each row decodes about the same number of tokens (printed)."""
    try:
        import ctranslate2
        from ctranslate2.converters import FairseqConverter
    except ImportError:
        print("(ctranslate2 not installed: no CTranslate2 rows)\n")
        return []
    from models.nmt.model_files.checkpoint import sanitized_copy

    clean = os.path.join(tmp, "model.pt")          # the converter loads with fairseq's own loader
    sanitized_copy(os.path.join(t.model_dir, "model.pt"), clean)
    pieces = sorted((t.pieces(s) for s in sources), key=len)
    batches = [(pieces[i:i + 16], t._max_len(len(pieces[i:i + 16][-1]) + 1)) for i in range(0, len(pieces), 16)]
    out = []
    for quant in ("float32", "int8"):
        path = os.path.join(tmp, quant)
        FairseqConverter(clean, t.model_dir, source_lang=t.src_lang,
                         target_lang=t.tgt_lang).convert(path, quantization=quant)
        out.append((f"CTranslate2 {ctranslate2.__version__} {quant}, {samples} samples/source",
                    {"engine": "ct2", "path": path, "batches": batches}))
    return out


def torch_threads() -> int:
    import torch
    return torch.get_num_threads()


def fairseq_generate_sampling(t, sources: list[str], samples: int, topk: int, device: str = "cpu",
                              batch_size: int = 16, fp16: bool = False) -> dict:
    """fairseq-generate --sampling on a binarised copy of the same sources (the baseline)."""
    # --batch-size 16 (480 decoder rows) was fairseq-generate's fastest of 4 / 16 / 60 on the CPU.
    return fairseq_generate(t, sources, ["--sampling", "--sampling-topk", str(topk), "--beam", str(samples),
                                         "--nbest", str(samples), "--seed", "0"], samples, device, batch_size, fp16)


def fairseq_generate(t, sources: list[str], search: list[str], per_source: int, device: str = "cpu",
                     batch_size: int = 16, fp16: bool = False) -> dict:
    """fairseq-generate with SEARCH options (sampling or beam) over the same sources, the same
    model and maximum length as our engine; refuses a run that returned fewer than PER_SOURCE
    hypotheses per source (fairseq-generate can drop sentences)."""
    with tempfile.TemporaryDirectory() as tmp:
        for lang in (t.src_lang, t.tgt_lang):     # the target side is a placeholder: generate needs one
            with open(os.path.join(tmp, f"test.{lang}"), "w") as f:
                f.writelines(" ".join(t.pieces(s)) + "\n" for s in sources)
        job_run([sys.executable, "-m", "fairseq_cli.preprocess", "--source-lang", t.src_lang,
                 "--target-lang", t.tgt_lang, "--testpref", os.path.join(tmp, "test"),
                 "--destdir", os.path.join(tmp, "bin"), "--srcdict",
                 os.path.join(t.model_dir, f"dict.{t.src_lang}.txt"), "--tgtdict",
                 os.path.join(t.model_dir, f"dict.{t.tgt_lang}.txt"), "--workers", "1"],
                check=True, capture_output=True)
        # models.nmt.model_files.fairseq_compat hands fairseq-generate a sanitized copy of the checkpoint
        cmd = [sys.executable, "-m", "models.nmt.model_files.fairseq_compat", "generate", os.path.join(tmp, "bin"),
               "--path",
               os.path.join(t.model_dir, "model.pt"), "--gen-subset", "test", *search,
               "--max-len-a", str(t.max_len_a), "--max-len-b", str(t.max_len_b), "--batch-size", str(batch_size),
               # fairseq drops the last partial batch without this (fairseq #5036, #5351)
               "--required-batch-size-multiple", "1",
               "--remove-bpe", "sentencepiece", "--source-lang", t.src_lang, "--target-lang", t.tgt_lang,
               *(["--cpu"] if device == "cpu" else []), *(["--fp16"] if fp16 else [])]
        start = time.perf_counter()
        done = job_run(cmd, capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"fairseq-generate failed:\n{done.stderr[-3000:]}")
        m = re.search(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s", done.stderr + done.stdout)
        n_hyps = sum(1 for line in done.stdout.splitlines() if line.startswith("H-"))
        if n_hyps != per_source * len(sources):       # the baseline must have done all the work
            raise RuntimeError(f"fairseq-generate returned {n_hyps} hypotheses for {len(sources)} sources x {per_source}")
        # P- lines hold one positional score per token, </s> included (its summary counts 1-best only).
        n_tokens = sum(len(line.split("\t")[1].split()) for line in done.stdout.splitlines() if line.startswith("P-"))
        secs = float(m.group(3)) if m else wall
        return {"seconds": secs, "candidates": n_hyps, "tokens": n_tokens, "process_wall_s": wall}


def write_pairs(pairs, workdir: str) -> str:
    """The pairs as the job's TSV input."""
    path = os.path.join(workdir, "pairs.tsv")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(f"{s}\t{t}\n" for s, t in pairs)
    return path


def bench_overhead(pairs, models: str, workdir: str, preset_args: list[str]) -> dict:
    """The whole job on DirectRunner vs a plain loop over the same functions, same pairs."""
    from beam_pipelines.generate import run
    from models.nmt.engines.fairseq_engine import load_translator
    from paracorpus.cleaning import CleaningConfig, Rejection, clean_pair, dedup_key, pair_id
    from paracorpus.config import PRESETS
    from paracorpus.paraphrasing import CleanPair, paraphrase_batch
    from paracorpus.schema import PARAPHRASE_SCHEMA
    from common.shards import ShardSpec, read_shard
    import dataclasses
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = write_pairs(pairs, workdir)
    fwd_dir, bwd_dir = os.path.join(models, "cs-en"), os.path.join(models, "en-cs")
    cfg = dataclasses.replace(PRESETS["parabank2-cpu"], num_sets=2, num_samples=5, dual_xent_threshold=None)

    # Model loading is inside both timings: the job loads its models too.
    start = time.perf_counter()
    fwd, bwd = load_translator(fwd_dir, device="cpu"), load_translator(bwd_dir, device="cpu")
    clean_cfg, seen, batch, rows = CleaningConfig(), set(), [], []
    for rec in read_shard(ShardSpec("tsv", (path,), "pairs.tsv")):
        if rec.error:
            continue
        out = clean_pair(rec.source, rec.reference, clean_cfg)
        if isinstance(out, Rejection) or dedup_key(*out) in seen:
            continue
        seen.add(dedup_key(*out))
        batch.append(CleanPair(pair_id(rec.shard, rec.index, rec.source, rec.reference), rec.shard, rec.index, *out))
    for i in range(0, len(batch), cfg.batch_pairs):
        rows += paraphrase_batch(batch[i:i + cfg.batch_pairs], fwd, bwd, cfg, "bench")[0]
    pq.write_table(pa.Table.from_pylist(rows, schema=PARAPHRASE_SCHEMA), os.path.join(workdir, "plain.parquet"))
    plain = time.perf_counter() - start

    start = time.perf_counter()
    run(["--input", path, "--output", os.path.join(workdir, "beam"), "--forward_model", fwd_dir,
         "--backward_model", bwd_dir, "--preset", "parabank2-cpu", "--num_sets", "2", "--num_samples", "5",
         "--dual_xent_threshold", "-1", "--num_output_shards", "1", "--device", "cpu", "--overwrite",
         "--runner", "DirectRunner", *preset_args])
    beam_secs = time.perf_counter() - start
    return {"pairs": len(pairs), "plain_s": plain, "beam_s": beam_secs, "ratio": beam_secs / plain,
            "plain_rows": len(rows)}


def bench_worker_threads(pairs, models: str, workdir: str) -> list[dict]:
    """The job on DirectRunner with 2 worker processes: every worker with all the cores' threads
    (what torch does by default, and what the job did before --torch_threads) vs the automatic
    split (cores / workers). Same pairs, same rows."""
    from beam_pipelines.generate import run

    path = write_pairs(pairs, workdir)
    out = []
    for label, threads in ((f"{os.cpu_count()} threads per worker (torch default)", os.cpu_count()),
                           ("auto (cores / workers)", 0)):
        start = time.perf_counter()
        manifest = run(["--input", path, "--output", os.path.join(workdir, f"t{threads}"),
                        "--forward_model", os.path.join(models, "cs-en"),
                        "--backward_model", os.path.join(models, "en-cs"), "--preset", "parabank2-cpu",
                        "--num_sets", "2", "--num_samples", "5", "--dual_xent_threshold", "-1",
                        "--device", "cpu", "--overwrite", "--torch_threads", str(threads),
                        "--runner", "DirectRunner", "--direct_running_mode", "multi_processing",
                        "--direct_num_workers", "2"])
        out.append({"label": label, "threads": manifest["torch_threads_per_worker"],
                    "seconds": time.perf_counter() - start})
    return out


def time_interleaved(fns: dict, rounds: int, repeats: int) -> dict[str, list[float]]:
    """Seconds per call of each function, per round; every function once per round (after one
    untimed call), so a noisy moment of the shared machine hits them all alike."""
    times: dict[str, list[float]] = {label: [] for label in fns}
    for _ in range(rounds):
        for label, fn in fns.items():
            fn()
            start = time.perf_counter()
            for _ in range(repeats):
                fn()
            times[label].append((time.perf_counter() - start) / repeats)
    return times


def bench_matmul(model_dir: str, rows=(20, 138, 500), repeats: int = 30) -> list[dict]:
    """Both products on the same weights and inputs, interleaved, best of 3 rounds each."""
    import torch
    import torch.nn.functional as F
    from models.nmt.engines.fairseq_engine import load_translator
    from models.nmt.decoding.prefix_decoder import decoder_linears

    t = load_translator(model_dir, device="cpu")
    lin = decoder_linears(t.model.decoder)
    layer = t.model.decoder.layers[0]
    cases = [("output projection", t.model.decoder.output_projection.weight, None, lin["output"]),
             ("fc1", layer.fc1.weight, layer.fc1.bias, lin["layers"][0]["fc1"])]
    out = []
    for name, weight, bias, packed in cases:
        for m in rows:
            x = torch.randn(m, weight.shape[1])
            times = time_interleaved({"F.linear": lambda: F.linear(x, weight, bias), "oneDNN": lambda: packed(x)},
                                     rounds=3, repeats=repeats)
            best = {label: min(secs) for label, secs in times.items()}
            flops = 2 * m * weight.shape[0] * weight.shape[1]
            out.append({"product": f"{name} ({m} x {weight.shape[1]}) @ ({weight.shape[1]} x {weight.shape[0]})",
                        "mkl_ms": best["F.linear"] * 1e3, "onednn_ms": best["oneDNN"] * 1e3,
                        "mkl_gflops": flops / best["F.linear"] / 1e9, "onednn_gflops": flops / best["oneDNN"] / 1e9,
                        "packed": packed.packed is not None})
    return out


def bench_scoring(model_dir: str, pairs: list[tuple[str, str]], rounds: int = 3) -> dict:
    """Dual scoring (forced decoding of the foreign source given each English candidate, the
    backward model): our Translator.score vs fairseq's own SequenceScorer (what
    `fairseq-generate --score-reference` runs) on the same length-bucketed batches, interleaved;
    both give the same per-token NLLs (the largest difference is printed)."""
    import torch
    from fairseq.sequence_scorer import SequenceScorer
    from models.nmt.engines.fairseq_engine import load_translator

    t = load_translator(model_dir, device="cpu")
    english, foreign = [e for _, e in pairs], [f for f, _ in pairs]
    scorer = SequenceScorer(t.tgt_dict)

    def fairseq_scores():
        out = [0.0] * len(english)
        with torch.inference_mode():
            for batch, src_tokens, src_lengths, prev, target, _real in t.score_batches(english, foreign):
                sample = {"net_input": {"src_tokens": src_tokens, "src_lengths": src_lengths,
                                        "prev_output_tokens": prev}, "target": target}
                for i, hypos in zip(batch, scorer.generate([t.model], sample)):
                    out[i] = -float(hypos[0]["score"])
        return out

    ours, theirs = t.score(english, foreign), fairseq_scores()
    times = time_interleaved({"fairseq": fairseq_scores, "ours": lambda: t.score(english, foreign)},
                             rounds=rounds, repeats=1)
    return {"pairs": len(pairs), "fairseq_s": statistics.median(times["fairseq"]),
            "ours_s": statistics.median(times["ours"]),
            "speedup": statistics.median(a / b for a, b in zip(times["fairseq"], times["ours"])),
            "max_diff": max(abs(a - b) for a, b in zip(ours, theirs))}


def bench_topk(vocab: int, rows: int = 138, ks=(10, 15), rounds: int = 9, repeats: int = 30) -> list[dict]:
    """torch.topk vs topk_rows on the same log-probabilities, interleaved; median of the rounds."""
    import torch
    from models.nmt.decoding.topk import topk_rows

    x = torch.log_softmax(torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)) * 3, dim=-1)
    out = []
    for k in ks:
        times = time_interleaved({"torch.topk": lambda: x.topk(k, dim=-1), "topk_rows": lambda: topk_rows(x, k)},
                                 rounds=rounds, repeats=repeats)
        out.append({"shape": f"{rows} x {vocab}, k={k}",
                    "torch_ms": statistics.median(times["torch.topk"]) * 1e3,
                    "ours_ms": statistics.median(times["topk_rows"]) * 1e3,
                    "speedup": statistics.median(a / b for a, b in zip(times["torch.topk"], times["topk_rows"]))})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=os.path.join(ROOT, "runs", "multi30k-models"),
                    help="directory with cs-en/ and en-cs/ model dirs (python -m models.nmt.train)")
    ap.add_argument("--bitext", default=os.path.join(ROOT, "..", "shared", "data", "bitext", "multi30k", "val"),
                    help="Moses prefix of the bitext (PREFIX.cs[.gz], PREFIX.en[.gz])")
    # 240 sources: a throughput figure. Each engine's one-off costs (its first batch: heap growth,
    # oneDNN primitives for new shapes) still count, but a job's worker pays them once for
    # thousands of sources; at 60 sources they were ~20% of our time.
    ap.add_argument("--sources", type=int, default=240, help="sources for the sampling comparison")
    ap.add_argument("--samples", type=int, default=30, help="N samples per source")
    ap.add_argument("--sets", type=int, default=5, help="constraint sets in the constrained variant")
    ap.add_argument("--topk", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3, help="sampling rounds (every engine once per round)")
    ap.add_argument("--pairs", type=int, default=200,
                    help="pairs for the DirectRunner overhead run (enough that start-up does not dominate)")
    ap.add_argument("--score_pairs", type=int, default=1000, help="pairs for the dual-scoring comparison")
    ap.add_argument("--skip", default="",
                    help="comma list of sections to skip: sampling,clustering,overhead,workers,matmul,scoring,topk")
    ap.add_argument("--engine_worker", help=argparse.SUPPRESS)      # internal: one timed engine run
    args = ap.parse_args()
    if args.engine_worker:
        print(json.dumps(engine_worker(json.loads(args.engine_worker))))
        return
    logging.getLogger("apache_beam").setLevel(logging.WARNING)    # worker chatter hides the tables
    skip = set(args.skip.split(","))
    pairs = read_pairs(args.bitext, "cs", "en", max(args.sources, args.pairs, args.score_pairs))
    import torch
    print(f"# generation benchmark ({os.cpu_count()} CPUs, torch threads {torch.get_num_threads()})\n")

    if "sampling" not in skip:
        res = bench_sampling(os.path.join(args.models, "cs-en"), [s for s, _ in pairs[:args.sources]],
                             args.samples, args.topk, args.sets, repeats=args.rounds)
        base = res[-1]
        print(f"## Sampling, {args.sources} sources, top-{args.topk} ({args.rounds} rounds, every engine once per round)\n")
        print("| engine | seconds (median) | sources/s | candidates/s | tokens/candidate | "
              "speed-up vs fairseq-generate (median of rounds) | per round |\n|---|---|---|---|---|---|---|")
        for r in res:
            print(f"| {r['engine']} | {r['seconds']:.2f} | {r['sources_per_s']:.2f} | "
                  f"{r['candidates_per_s']:.0f} | {r['tokens_per_candidate']:.1f} | "
                  f"{r['speedup']:.2f}x | {', '.join(f'{x:.2f}' for x in r['speedups'])} |")
        print(f"\n(fairseq-generate process wall time incl. start-up: {base['process_wall_s']:.1f}s)\n")

    if "clustering" not in skip:
        sys.path.insert(0, os.path.join(ROOT, "bench"))
        from bench_clustering import bench_clustering
        c = bench_clustering(num_sources=200, num_candidates=150, seed=0)
        print("## Clustering (150 candidates per source, 200 sources)\n")
        print(f"{c['ms_per_source']:.2f} ms/source (goal <= 2 ms), "
              f"{c['mean_distinct_candidates']:.0f} distinct candidates per source\n")

    if "overhead" not in skip:
        with tempfile.TemporaryDirectory() as tmp:
            o = bench_overhead(pairs[:args.pairs], args.models, tmp, [])
        print(f"## Beam DirectRunner vs plain loop, {o['pairs']} pairs (S=2, N=5)\n")
        print(f"| plain loop s | DirectRunner s | ratio |\n|---|---|---|\n"
              f"| {o['plain_s']:.1f} | {o['beam_s']:.1f} | {o['ratio']:.2f}x |\n")

    if "workers" not in skip:
        with tempfile.TemporaryDirectory() as tmp:
            w = bench_worker_threads(pairs[:args.pairs], args.models, tmp)
        print(f"## DirectRunner, 2 worker processes, {args.pairs} pairs (S=2, N=5): torch threads per worker\n")
        print("| threads per worker | s | speed-up |\n|---|---|---|")
        for r in w:
            print(f"| {r['label']}: {r['threads']} | {r['seconds']:.1f} | {w[0]['seconds'] / r['seconds']:.2f}x |")
        print()

    if "matmul" not in skip:
        print("## Matrix products: F.linear (MKL) vs prepacked oneDNN (models/nmt/decoding/onednn.py Linear)\n")
        print("| product | F.linear ms | oneDNN ms | F.linear GFLOP/s | oneDNN GFLOP/s | speed-up |\n|---|---|---|---|---|---|")
        for r in bench_matmul(os.path.join(args.models, "cs-en")):
            note = "" if r["packed"] else " (oneDNN unavailable: F.linear both)"
            print(f"| {r['product']}{note} | {r['mkl_ms']:.2f} | {r['onednn_ms']:.2f} | {r['mkl_gflops']:.0f} | "
                  f"{r['onednn_gflops']:.0f} | {r['mkl_ms'] / r['onednn_ms']:.2f}x |")
        print()

    if "scoring" not in skip:
        r = bench_scoring(os.path.join(args.models, "en-cs"), pairs[:args.score_pairs])
        print(f"## Dual scoring, {r['pairs']} pairs (en->cs model, forced decoding of the cs side; "
              "median of 3 interleaved rounds)\n")
        print("| fairseq SequenceScorer s | ours (Translator.score) s | speed-up | largest NLL difference |\n"
              f"|---|---|---|---|\n| {r['fairseq_s']:.2f} | {r['ours_s']:.2f} | {r['speedup']:.2f}x | "
              f"{r['max_diff']:.1e} |\n")

    if "topk" not in skip:
        from models.nmt.engines.fairseq_engine import load_translator

        vocab = len(load_translator(os.path.join(args.models, "cs-en"), device="cpu").tgt_dict)
        print("## Top-k over the vocabulary: torch.topk vs models/nmt/decoding/topk.py "
              "(median of 9 interleaved rounds)\n")
        print("| log-probabilities | torch.topk ms | topk_rows ms | speed-up |\n|---|---|---|---|")
        for r in bench_topk(vocab):
            print(f"| {r['shape']} | {r['torch_ms']:.3f} | {r['ours_ms']:.3f} | {r['speedup']:.2f}x |")
        print()

    self_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"## Peak memory\n\nthis process: {self_mb:.0f} MiB; largest child process: {child_mb:.0f} MiB")


if __name__ == "__main__":
    main()
