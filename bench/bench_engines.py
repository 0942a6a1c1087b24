"""Benchmark of the two engines on one model on a CPU: CTranslate2 (int8, int8_float32, float32)
against the fairseq engine (fp32, and bf16 where the CPU has it), every figure beside the fairseq
engine's fp32 from the same run.

  1. sampling at the parabank2-cpu preset (3 constraint sets x 10 samples, top-k 10, banned
     words per pair), sources/s; and CTranslate2 without banned words (its per-pair calls: each
     (pair, set) is its own call when it has banned words);
  2. beam search (beam 12, the ParaNMT setting), sources/s;
  3. forced decoding (the dual score's half: each reference scored given its source), pairs/s,
     and how far each engine's scores are from fairseq fp32's;
  4. the whole generation job (DirectRunner, one worker) on the same pairs, with a backward model
     of the same engine: sources/s;
  and the peak memory (RSS) of each engine's process.

    python bench/bench_engines.py --work runs/bench-models [--layers 6 --dim 512 | --trained]
        [--sections sample,beam,score,job] [--engines "fairseq fp32,CTranslate2 int8"] [--sources 30] [--repeats 3]

The model is realistic in size, not in quality: a fairseq transformer base (6+6 layers, d512,
ffn 2048, 8 heads, shared embeddings) with random weights on bench_models.py's Multi30k
dictionary and fastBPE codes (prepared there first), in each direction; random weights are fine
for speed, with both engines decoding to the same length limit. With --trained, bench_models.py's
trained 3+3 d256 model instead (and an en->cs one trained once with the same recipe): smaller,
but with a trained model's output lengths and distributions, which decide how many decoding steps
a sample takes and how often a banned word is drawn. Each engine runs in a fresh process, one
thread (the job runs one thread per worker process), rounds interleaved.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))


def random_archive(work: str, src: str, tgt: str, layers: int = 6, dim: int = 512) -> str:
    """WORK/random-SRC-TGT: a hub-style archive of a random transformer base (6+6, d512; or
    LAYERS+LAYERS, dDIM, ffn 4 x DIM)."""
    import argparse as ap

    import torch
    from fairseq.models.transformer import base_architecture
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    out = os.path.join(work, f"random-{src}-{tgt}" + ("" if (layers, dim) == (6, 512) else f"-{layers}x{dim}"))
    if os.path.exists(os.path.join(out, "model.pt")):
        return out
    os.makedirs(out, exist_ok=True)
    data_bin = os.path.join(work, "data-bin")
    torch.manual_seed(0 if src == "cs" else 1)
    heads = 8 if dim % 64 == 0 else 2
    args = ap.Namespace(arch="transformer", encoder_layers=layers, decoder_layers=layers, encoder_embed_dim=dim,
                        decoder_embed_dim=dim, encoder_ffn_embed_dim=4 * dim, decoder_ffn_embed_dim=4 * dim,
                        encoder_attention_heads=heads, decoder_attention_heads=heads, share_all_embeddings=True,
                        max_source_positions=1024, max_target_positions=1024, dropout=0.1)
    base_architecture(args)
    task = TranslationTask.setup_task(TranslationConfig(data=data_bin, source_lang=src, target_lang=tgt))
    model = task.build_model(args)
    args.task = "translation"
    torch.save({"args": None, "cfg": {"model": args, "task": {"_name": "translation", "source_lang": src,
                                                               "target_lang": tgt}},
                "model": model.state_dict()}, os.path.join(out, "model.pt"))
    for lang in ("cs", "en"):
        shutil.copyfile(os.path.join(data_bin, f"dict.{lang}.txt"), os.path.join(out, f"dict.{lang}.txt"))
    shutil.copyfile(os.path.join(work, "bpecodes"), os.path.join(out, "bpecodes"))
    return out


def trained_archive(work: str, src: str, tgt: str, prepared: dict) -> str:
    """WORK/trained-SRC-TGT: a hub-style archive of bench_models.py's trained model in that
    direction (PREPARED: its sizes and updates): cs->en is its first seed; en->cs is trained here
    once, with the same recipe, data and dictionary (a core, about as long as one seed took)."""
    from bench_models import _fairseq, train_args

    out = os.path.join(work, f"trained-{src}-{tgt}")
    if os.path.exists(os.path.join(out, "model.pt")):
        return out
    checkpoints = os.path.join(work, "ck1" if (src, tgt) == ("cs", "en") else f"ck-{src}-{tgt}")
    best = os.path.join(checkpoints, "checkpoint_best.pt")
    if not os.path.exists(best):
        print(f"# training {src}->{tgt} ({prepared['layers']}+{prepared['layers']} d{prepared['dim']}, "
              f"{prepared['updates']} updates) once, into {checkpoints}", flush=True)
        _fairseq("train", [os.path.join(work, "data-bin"), "--source-lang", src, "--target-lang", tgt,
                           *train_args(prepared["layers"], prepared["dim"], prepared["updates"]), "--seed", "1",
                           "--save-dir", checkpoints], os.path.join(work, f"train-{src}-{tgt}.log"))
    os.makedirs(out, exist_ok=True)
    shutil.copyfile(best, os.path.join(out, "model.pt"))
    for lang in ("cs", "en"):
        shutil.copyfile(os.path.join(work, "data-bin", f"dict.{lang}.txt"), os.path.join(out, f"dict.{lang}.txt"))
    shutil.copyfile(os.path.join(work, "bpecodes"), os.path.join(out, "bpecodes"))
    return out


def prepare(work: str, layers: int = 6, dim: int = 512,
            keys: tuple = ("fairseq", "int8", "int8_float32", "float32"), trained: dict | None = None) -> dict:
    """{engine: (forward dir, backward dir)} of the engines KEYS, imported from the random archives
    (kept in WORK), or from the trained ones (TRAINED: bench_models.py's prepared.json)."""
    from models.nmt.importing import import_fairseq_to_ct2, import_model

    dirs = {}
    for src, tgt in (("cs", "en"), ("en", "cs")):
        if trained:
            archive = trained_archive(work, src, tgt, trained)
            size = "-trained"
        else:
            archive = random_archive(work, src, tgt, layers, dim)
            size = os.path.basename(archive)[len(f"random-{src}-{tgt}"):]          # "" for the base, else -LxD
        for engine in keys:
            out = os.path.join(work, f"engine-{engine}-{src}-{tgt}{size}")
            if not os.path.exists(os.path.join(out, "model.json")):
                if engine == "fairseq":
                    import_model(archive, src, tgt, out, tokenizer="moses")
                else:
                    import_fairseq_to_ct2(archive, src, tgt, out, engine, tokenizer="moses")
            dirs.setdefault(engine, []).append(out)
    return dirs


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _engine(model_dir: str, precision: str):
    import torch

    from models.nmt.engines.loading import load_engine

    torch.set_num_threads(1)
    engine = load_engine(model_dir, device="cpu", threads=1, precision=precision)
    engine.start_unit("bench")
    return engine


def decode(model_dir: str, pairs: list, bans: bool, precision: str = "fp32") -> dict:
    """Sampling alone, in this process: sources/s at the parabank2-cpu preset."""
    from models.nmt.engine import SampleRequest
    from paracorpus.constraints import draw_constraint_sets

    engine = _engine(model_dir, precision)
    requests = [SampleRequest(s, f"p{i}:{k}", tuple(words) if bans else (), 10) for i, (s, r) in enumerate(pairs)
                for k, words in enumerate(draw_constraint_sets(r, 3, 1, f"p{i}", 3))]
    start = time.perf_counter()
    hyps = engine.sample(requests, topk=10, seed=1)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "sources_per_s": len(pairs) / seconds, "tokens": sum(len(h.pieces) + 1 for hs in hyps
                                                                                   for h in hs),
            "samples": sum(map(len, hyps)), "peak_rss_mb": _peak_rss_mb()}


def beam(model_dir: str, pairs: list, precision: str = "fp32") -> dict:
    """Beam search (beam 12, the best hypothesis), in this process: sources/s."""
    engine = _engine(model_dir, precision)
    start = time.perf_counter()
    hyps = engine.beam_search([s for s, _ in pairs], beam=12, nbest=1)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "sources_per_s": len(pairs) / seconds,
            "tokens": sum(len(h.pieces) + 1 for hs in hyps for h in hs), "peak_rss_mb": _peak_rss_mb()}


def score(model_dir: str, pairs: list, precision: str = "fp32") -> dict:
    """Forced decoding of each reference given its source, in this process: pairs/s, the scores."""
    engine = _engine(model_dir, precision)
    start = time.perf_counter()
    scores = engine.score([s for s, _ in pairs], [r for _, r in pairs])
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "sources_per_s": len(pairs) / seconds, "scores": [float(x) for x in scores],
            "peak_rss_mb": _peak_rss_mb()}


def job(forward: str, backward: str, pairs: list, workdir: str, precision: str | None = None) -> dict:
    """The whole generation job (DirectRunner, one worker) on PAIRS: sources/s."""
    from beam_pipelines.generate import run

    inp = os.path.join(workdir, "in.tsv")
    with open(inp, "w", encoding="utf-8") as f:
        f.writelines(f"{s}\t{t}\n" for s, t in pairs)
    start = time.perf_counter()
    manifest = run(["--input", inp, "--output", os.path.join(workdir, "out"), "--forward_model", forward,
                    "--backward_model", backward, "--preset", "parabank2-cpu", "--torch_threads", "1",
                    "--score_threshold", "-1", "--dual_xent_threshold", "-1", "--allow_empty",
                    *(["--precision", precision] if precision else [])])
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "sources_per_s": len(pairs) / seconds,
            "paraphrase_rows": manifest["counts"]["paraphrase_rows"], "peak_rss_mb": _peak_rss_mb()}


def _fresh(function: str, *args) -> dict:
    """FUNCTION(*ARGS) of this module in a fresh process (its own caches, threads and peak memory)."""
    from fresh_process import in_fresh_process

    return in_fresh_process("bench_engines", function, *args)


# row: (the imported directory, the fairseq engine's precision)
ENGINES = {"fairseq fp32": ("fairseq", "fp32"), "fairseq bf16": ("fairseq", "bf16"),
           "CTranslate2 int8": ("int8", "fp32"), "CTranslate2 int8_float32": ("int8_float32", "fp32"),
           "CTranslate2 float32": ("float32", "fp32")}
SECTIONS = ("sample", "beam", "score", "job")


def _bf16_cpu() -> bool:
    import torch

    return bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)())


def _table(title: str, unit: str, runs_of: dict, extra: str, extra_of) -> None:
    """One section's Markdown table: the median rate of each row and its ratio to fairseq fp32's
    in the same round (the first row)."""
    base = next(iter(runs_of.values()))
    print(f"\n## {title}, {unit}\n")
    print(f"| engine | {unit} | vs fairseq fp32 | {extra} | peak RSS MB |\n|---|---|---|---|---|")
    for name, runs in runs_of.items():
        ratio = statistics.median(r["sources_per_s"] / b["sources_per_s"] for r, b in zip(runs, base))
        print(f"| {name} | {statistics.median(r['sources_per_s'] for r in runs):.2f} | {ratio:.2f}x | "
              f"{extra_of(runs)} | {max(r['peak_rss_mb'] for r in runs):.0f} |", flush=True)


def main(argv=None) -> int:
    from bench_models import DATA, prepare as prepare_models, read_lines

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default=os.path.join(ROOT, "runs", "bench-models"))
    ap.add_argument("--sources", type=int, default=30, help="Multi30k val pairs (default 30)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"of {','.join(SECTIONS)} (default: all)")
    ap.add_argument("--skip_job", action="store_true", help="the same as leaving job out of --sections")
    ap.add_argument("--engines", default=",".join(ENGINES),
                    help="the rows, of: " + ",".join(ENGINES) + " (default: all; fairseq fp32 always, the baseline)")
    ap.add_argument("--layers", type=int, default=6, help="encoder and decoder layers of the random models (default 6)")
    ap.add_argument("--dim", type=int, default=512, help="their model dimension; ffn 4x (default 512)")
    ap.add_argument("--trained", action="store_true",
                    help="bench_models.py's trained models (3+3 d256, cs->en; en->cs trained here once) instead "
                         "of random ones: real output lengths and distributions, the largest size that trains on "
                         "two cores in reasonable time")
    a = ap.parse_args(argv)
    sections = [x for x in a.sections.split(",") if x and not (a.skip_job and x == "job")]
    if set(sections) - set(SECTIONS):
        ap.error(f"unknown --sections: {a.sections}")
    asked = {x.strip() for x in a.engines.split(",") if x.strip()}
    if asked - set(ENGINES):
        ap.error(f"unknown --engines: {', '.join(sorted(asked - set(ENGINES)))}")
    if not os.path.isdir(DATA):
        print(f"error: {DATA} not found (../shared/data)", file=sys.stderr)
        return 2
    prepared = prepare_models(a.work, 3, 256, 300, 8000)     # the dictionary and codes the random models use
    pairs = list(zip(read_lines("val", "cs", a.sources), read_lines("val", "en", a.sources)))
    engines = {name: spec for name, spec in ENGINES.items()
               if (name in asked or name == "fairseq fp32") and (spec[1] != "bf16" or _bf16_cpu())}
    dirs = prepare(a.work, a.layers, a.dim, tuple(dict.fromkeys(key for key, _ in engines.values())),
                   prepared if a.trained else None)
    model = (f"transformer {prepared['layers']}+{prepared['layers']} d{prepared['dim']}, trained "
             f"({prepared['updates']} updates on Multi30k)" if a.trained
             else f"transformer {a.layers}+{a.layers} d{a.dim}, random weights")
    print(f"# bench_engines: {model}, Multi30k dictionary; "
          f"{len(pairs)} sources; {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, one thread per engine process"
          + ("" if _bf16_cpu() else "; no bf16 row: this CPU has no AVX512-BF16"))
    if "sample" in sections:
        no_bans = ["CTranslate2 int8, no banned words"] if "CTranslate2 int8" in engines else []
        rows = {name: [] for name in [*engines, *no_bans]}
        for _ in range(a.repeats):                     # interleaved: every engine under the same load
            for name, (key, precision) in engines.items():
                rows[name].append(_fresh("decode", dirs[key][0], pairs, True, precision))
            for name in no_bans:
                rows[name].append(_fresh("decode", dirs["int8"][0], pairs, False))
        _table("1. Sampling, parabank2-cpu (3 sets x 10 samples, top-k 10, banned words)", "sources/s", rows,
               "tokens", lambda runs: runs[0]["tokens"])
    if "beam" in sections:
        rows = {name: [] for name in engines}
        for _ in range(a.repeats):
            for name, (key, precision) in engines.items():
                rows[name].append(_fresh("beam", dirs[key][0], pairs, precision))
        _table("2. Beam search (beam 12, the best hypothesis)", "sources/s", rows, "tokens",
               lambda runs: runs[0]["tokens"])
    if "score" in sections:
        rows = {name: [] for name in engines}
        for _ in range(a.repeats):
            for name, (key, precision) in engines.items():
                rows[name].append(_fresh("score", dirs[key][0], pairs, precision))
        reference = rows["fairseq fp32"][0]["scores"]
        _table("3. Forced decoding (each reference given its source)", "pairs/s", rows,
               "largest score difference from fairseq fp32",
               lambda runs: f"{max(abs(x - y) for x, y in zip(runs[0]['scores'], reference)):.3g}")
    if "job" in sections:
        rows = {name: [] for name in engines}
        for _ in range(max(1, a.repeats - 1)):
            for name, (key, precision) in engines.items():
                with tempfile.TemporaryDirectory() as tmp:
                    rows[name].append(_fresh("job", dirs[key][0], dirs[key][1], pairs, tmp,
                                             precision if key == "fairseq" else None))
        _table("4. The whole job (DirectRunner, 1 worker, forward and backward of the same engine)", "sources/s",
               rows, "paraphrase rows", lambda runs: runs[0]["paraphrase_rows"])
    return 0

if __name__ == "__main__":
    sys.exit(main())
