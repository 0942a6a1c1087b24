"""Benchmark of imported fairseq models (paragen-import-model), every figure beside its baseline
from the same run:

  1. tokenization cost per 1,000 sentences: Moses + subword-nmt, Moses + fastBPE, fairseq's
     sentencepiece and the project's own sentencepiece convention (encode, then decode);
  2. a 2-member ensemble vs one member: sources/s at the parabank2-cpu preset (3 constraint sets x
     10 samples, top-k 10, banned words) and at beam 12;
  3. our sampler vs ``fairseq-generate --sampling`` on the ensemble and on one member (same
     sources, k, N, length limit; fairseq-generate with ``--required-batch-size-multiple 1`` and
     its output count checked: it drops a last partial batch otherwise).

    python bench/bench_models.py --work runs/bench-models              # prepares once, then measures

The models: a Multi30k cs->en transformer (3+3 layers, d256 by default) trained here with fairseq's
own CLI on Moses-tokenized text with fastBPE codes (the WMT19 archives' layout), two seeds, for a
few hundred updates (--updates): enough for realistic output lengths and distributions, not for
quality. They are kept in --work and reused. Speed only: the figures compare engines on the same
weights, not model quality.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
from fresh_process import job_run  # noqa: E402  (the jobs it measures: bench/fresh_process.py)
DATA = os.path.join(ROOT, "..", "shared", "data", "bitext", "multi30k")


def read_lines(split: str, lang: str, n: int | None = None) -> list[str]:
    with gzip.open(os.path.join(DATA, f"{split}.{lang}.gz"), "rt", encoding="utf-8") as f:
        return [line.strip() for i, line in enumerate(f) if n is None or i < n]


def _fairseq(command: str, args: list[str], log: str) -> None:
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with open(log, "w") as f:
        done = job_run([sys.executable, "-m", "models.nmt.model_files.fairseq_compat", command, *args],
                       cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"fairseq-{command} failed; see {log}")


def train_args(layers: int, dim: int, updates: int) -> list[str]:
    """fairseq-train's model and optimisation options of the benchmark models (LAYERS+LAYERS, dDIM,
    ffn 4 x DIM, 4 heads, shared embeddings; UPDATES updates on the CPU)."""
    return ["--arch", "transformer", "--encoder-layers", str(layers), "--decoder-layers", str(layers),
            "--encoder-embed-dim", str(dim), "--decoder-embed-dim", str(dim),
            "--encoder-ffn-embed-dim", str(4 * dim), "--decoder-ffn-embed-dim", str(4 * dim),
            "--encoder-attention-heads", "4", "--decoder-attention-heads", "4", "--share-all-embeddings",
            "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt",
            "--warmup-updates", str(max(10, updates // 10)), "--criterion", "label_smoothed_cross_entropy",
            "--label-smoothing", "0.1", "--dropout", "0.1", "--max-tokens", "4096", "--max-update", str(updates),
            "--no-epoch-checkpoints", "--no-last-checkpoints", "--no-save-optimizer-state", "--num-workers", "0",
            "--log-format", "simple", "--log-interval", "50", "--cpu", "--required-batch-size-multiple", "1"]


def prepare(work: str, layers: int, dim: int, updates: int, merges: int, train_lines: int | None = None) -> dict:
    """A hub-style archive WORK/archive (model1.pt, model2.pt, dicts, fastBPE bpecodes) and the
    imported directories WORK/ensemble (both members) and WORK/single (model1.pt); reused."""
    from models.nmt.importing import import_model
    from tests.fairseq_fixtures import learn_subword_nmt, moses_tokenize, write_fastbpe_codes

    done = os.path.join(work, "prepared.json")
    if os.path.exists(done):
        return json.load(open(done))
    os.makedirs(work, exist_ok=True)
    text = os.path.join(work, "text")
    os.makedirs(text, exist_ok=True)
    t0 = time.time()
    raw = {split: (read_lines(split, "cs", train_lines), read_lines(split, "en", train_lines))
           for split in ("train", "val")}
    tok = {split: (moses_tokenize(cs, "cs"), moses_tokenize(en, "en")) for split, (cs, en) in raw.items()}
    fast = os.path.join(work, "bpecodes")
    write_fastbpe_codes(learn_subword_nmt(tok["train"][0] + tok["train"][1], os.path.join(work, "codes.subword_nmt"),
                                          merges), fast)
    import fastBPE

    bpe = fastBPE.fastBPE(fast)
    for split, (cs, en) in tok.items():
        name = "valid" if split == "val" else split
        for lang, lines in (("cs", cs), ("en", en)):
            with open(os.path.join(text, f"{name}.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(line + "\n" for line in bpe.apply(lines))
    data_bin = os.path.join(work, "data-bin")
    _fairseq("preprocess", ["--source-lang", "cs", "--target-lang", "en", "--trainpref", f"{text}/train",
                            "--validpref", f"{text}/valid", "--destdir", data_bin, "--joined-dictionary",
                            "--workers", "2"], os.path.join(work, "preprocess.log"))
    model = train_args(layers, dim, updates)
    with ThreadPoolExecutor(2) as pool:          # the two seeds side by side, a core each
        list(pool.map(lambda seed: _fairseq("train", [data_bin, "--source-lang", "cs", "--target-lang", "en", *model,
                                                      "--seed", str(seed), "--save-dir", os.path.join(work, f"ck{seed}")],
                                            os.path.join(work, f"train{seed}.log")), (1, 2)))
    archive = os.path.join(work, "archive")
    os.makedirs(archive, exist_ok=True)
    for seed in (1, 2):
        shutil.copyfile(os.path.join(work, f"ck{seed}", "checkpoint_best.pt"), os.path.join(archive, f"model{seed}.pt"))
    for lang in ("cs", "en"):
        shutil.copyfile(os.path.join(data_bin, f"dict.{lang}.txt"), os.path.join(archive, f"dict.{lang}.txt"))
    shutil.copyfile(fast, os.path.join(archive, "bpecodes"))
    for name, checkpoints in (("ensemble", "model1.pt,model2.pt"), ("single", "model1.pt")):
        import_model(archive, "cs", "en", os.path.join(work, name), checkpoints=checkpoints, tokenizer="moses",
                     overwrite=True)
    info = {"layers": layers, "dim": dim, "updates": updates, "merges": merges, "seconds": round(time.time() - t0)}
    with open(done, "w") as f:
        json.dump(info, f)
    return info


# ------------------------------------------------------------------ 1. tokenization
def bench_tokenization(work: str, sentences: list[str], repeats: int) -> list[tuple]:
    from common.text import train_spm
    from models.nmt.model_files.tokenization import Tokenization
    from tests.fairseq_fixtures import learn_subword_nmt, moses_tokenize, train_sentencepiece

    codes = os.path.join(work, "codes.subword_nmt")
    if not os.path.exists(codes):
        learn_subword_nmt(moses_tokenize(read_lines("train", "en", 20000), "en"), codes, 8000)
    spm_hub = os.path.join(work, "sentencepiece.bpe.model")
    if not os.path.exists(spm_hub):
        shutil.copyfile(train_sentencepiece(read_lines("train", "en", 20000), os.path.join(work, "sp"), 8000), spm_hub)
    spm_own = os.path.join(work, "spm.model")
    if not os.path.exists(spm_own):
        train_spm(read_lines("train", "en", 20000), os.path.join(work, "spm"), 8000)
    setups = [("Moses + subword-nmt", Tokenization("moses", "subword_nmt", codes, "cs", "en")),
              ("Moses + fastBPE", Tokenization("moses", "fastbpe", os.path.join(work, "bpecodes"), "cs", "en")),
              ("sentencepiece (fairseq's)", Tokenization("none", "sentencepiece", spm_hub, "cs", "en")),
              ("sentencepiece (paragen-train-nmt's)", Tokenization("none", "spm", spm_own, "cs", "en"))]
    rows = []
    for name, tok in setups:
        tok.encode("warm up", "tgt")                   # libraries load once per process
        encode, decode = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            pieces = [tok.encode(s, "tgt") for s in sentences]
            t1 = time.perf_counter()
            [tok.decode(p, "tgt") for p in pieces]
            t2 = time.perf_counter()
            encode.append(t1 - t0)
            decode.append(t2 - t1)
        per = 1000 / len(sentences)
        rows.append((name, statistics.median(encode) * per * 1000, statistics.median(decode) * per * 1000,
                     sum(map(len, pieces)) / len(pieces)))
    return rows


# ------------------------------------------------------------------ 2. ensemble vs one member
def _sampling_round(model_dir: str, pairs: list, mode: str) -> dict:
    """One engine, in this process: sources/s at the parabank2-cpu preset (sample) or beam 12."""
    import torch

    from models.nmt.engine import SampleRequest
    from models.nmt.engines.loading import load_engine
    from paracorpus.constraints import draw_constraint_sets

    torch.set_num_threads(1)
    engine = load_engine(model_dir, device="cpu")
    t0 = time.perf_counter()
    if mode == "sample":
        requests = [SampleRequest(s, f"p{i}:{k}", tuple(words), 10) for i, (s, r) in enumerate(pairs)
                    for k, words in enumerate(draw_constraint_sets(r, 3, 1, f"p{i}", 3))]
        hyps = engine.sample(requests, topk=10, seed=1)
    else:
        hyps = engine.beam_search([s for s, _ in pairs], beam=12, nbest=1)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "sources_per_s": len(pairs) / seconds, "hypotheses": sum(map(len, hyps)),
            "tokens": sum(len(h.token_ids) + 1 for hs in hyps for h in hs)}


def _in_subprocess(function: str, *args) -> dict:
    """FUNCTION(*ARGS) of this module in a fresh process (its own caches, threads and peak memory)."""
    from fresh_process import in_fresh_process

    return in_fresh_process("bench_models", function, *args)


# ------------------------------------------------------------------ 3. fairseq-generate --sampling
def fairseq_generate_sampling(archive: str, members: str, model_dir: str, sources: list[str], samples: int,
                              topk: int) -> dict:
    """fairseq-generate --sampling with the archive's checkpoints MEMBERS ('model1.pt:model2.pt': its
    own ensemble), on the same sources tokenized as the imported model does; checks it returned
    every hypothesis."""
    from models.nmt.engines.loading import load_engine

    engine = load_engine(model_dir, device="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        for lang in ("cs", "en"):                    # the target side is a placeholder: generate needs one
            with open(os.path.join(tmp, f"test.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(" ".join(engine.source_pieces(s)) + "\n" for s in sources)
        job_run([sys.executable, "-m", "fairseq_cli.preprocess", "--source-lang", "cs", "--target-lang", "en",
                 "--testpref", os.path.join(tmp, "test"), "--destdir", os.path.join(tmp, "bin"),
                 "--srcdict", os.path.join(archive, "dict.cs.txt"), "--tgtdict",
                 os.path.join(archive, "dict.en.txt"), "--workers", "1"], check=True, capture_output=True)
        cmd = [sys.executable, "-m", "models.nmt.model_files.fairseq_compat", "generate", os.path.join(tmp, "bin"),
               "--path",
               ":".join(os.path.join(archive, m) for m in members.split(":")), "--gen-subset", "test", "--sampling",
               "--sampling-topk", str(topk), "--beam", str(samples), "--nbest", str(samples),
               "--max-len-a", str(engine.max_len_a), "--max-len-b", str(engine.max_len_b), "--batch-size", "16",
               # fairseq drops the last partial batch without this (fairseq #5036, #5351)
               "--required-batch-size-multiple", "1",
               "--cpu", "--seed", "0", "--source-lang", "cs", "--target-lang", "en"]
        start = time.perf_counter()
        done = job_run(cmd, capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"})
        wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"fairseq-generate failed:\n{done.stderr[-3000:]}")
    hyps = [line for line in done.stdout.splitlines() if line.startswith("H-")]
    if len(hyps) != samples * len(sources):
        raise SystemExit(f"fairseq-generate returned {len(hyps)} hypotheses for {len(sources)} sources x {samples}: "
                         "it dropped sentences, the baseline did not do all the work")
    m = re.search(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s", done.stderr + done.stdout)
    tokens = sum(len(line.split("\t")[1].split()) for line in done.stdout.splitlines() if line.startswith("P-"))
    return {"seconds": float(m.group(3)) if m else wall, "hypotheses": len(hyps), "tokens": tokens,
            "sources_per_s": len(sources) / (float(m.group(3)) if m else wall)}


def ours_sampling(model_dir: str, sources: list[str], samples: int, topk: int) -> dict:
    import torch

    from models.nmt.engine import SampleRequest
    from models.nmt.engines.loading import load_engine

    torch.set_num_threads(1)
    engine = load_engine(model_dir, device="cpu")
    t0 = time.perf_counter()
    hyps = engine.sample([SampleRequest(s, f"s{i}", (), samples) for i, s in enumerate(sources)], topk=topk, seed=1)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "hypotheses": sum(map(len, hyps)), "sources_per_s": len(sources) / seconds,
            "tokens": sum(len(h.token_ids) + 1 for hs in hyps for h in hs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default=os.path.join(ROOT, "runs", "bench-models"), help="models and scratch (kept)")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--updates", type=int, default=400)
    ap.add_argument("--merges", type=int, default=8000)
    ap.add_argument("--train_lines", type=int, help="train on the first N Multi30k pairs (default: all 29,000)")
    ap.add_argument("--sources", type=int, default=100, help="Multi30k val pairs decoded (default 100)")
    ap.add_argument("--sentences", type=int, default=1000, help="sentences tokenized (default 1000)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds, engines interleaved (default 3)")
    a = ap.parse_args(argv)
    if not os.path.isdir(DATA):
        print(f"error: {DATA} not found (../shared/data)", file=sys.stderr)
        return 2
    info = prepare(a.work, a.layers, a.dim, a.updates, a.merges, a.train_lines)
    print(f"# bench_models: Multi30k cs->en, {info['layers']}+{info['layers']} layers d{info['dim']}, "
          f"{info['updates']} updates, fastBPE {info['merges']} merges, 2 seeds (prepared in {info['seconds']} s); "
          f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, one torch thread per engine\n")

    rows = bench_tokenization(a.work, read_lines("val", "en", a.sentences), a.repeats)
    print("## 1. Tokenization, ms per 1,000 English sentences (median of rounds)\n")
    print("| pipeline | encode | decode | pieces per sentence | encode + decode vs the last row |\n|---|---|---|---|---|")
    base = rows[-1][1] + rows[-1][2]
    for name, enc, dec, pieces in rows:
        print(f"| {name} | {enc:.1f} | {dec:.1f} | {pieces:.1f} | {(enc + dec) / base:.2f}x |")
    pairs = list(zip(read_lines("val", "cs", a.sources), read_lines("val", "en", a.sources)))
    print("\n## 2. A 2-member ensemble vs one member (same weights for member 1), sources/s\n")
    print("| mode | one member | ensemble | ratio |\n|---|---|---|---|")
    for mode in ("sample", "beam"):
        one, two = [], []
        for _ in range(a.repeats):                       # interleaved: both under the same load
            one.append(_in_subprocess("_sampling_round", os.path.join(a.work, "single"), pairs, mode))
            two.append(_in_subprocess("_sampling_round", os.path.join(a.work, "ensemble"), pairs, mode))
        r1, r2 = (statistics.median(x["sources_per_s"] for x in runs) for runs in (one, two))
        ratios = [b["sources_per_s"] / s["sources_per_s"] for s, b in zip(one, two)]
        label = "parabank2-cpu (3 sets x 10 samples, bans)" if mode == "sample" else "beam 12"
        print(f"| {label} | {r1:.2f} | {r2:.2f} | {statistics.median(ratios):.2f}x (tokens {one[0]['tokens']} vs "
              f"{two[0]['tokens']}) |")
    print("\n## 3. Our sampler vs fairseq-generate --sampling, 30 samples/source, top-k 10\n")
    print("| model | fairseq-generate sources/s | ours sources/s | speed-up (median of rounds) | hypotheses | "
          "tokens fairseq / ours |\n|---|---|---|---|---|---|")
    sources = [s for s, _ in pairs]
    for label, directory, members in (("ensemble (2 checkpoints)", "ensemble", "model1.pt:model2.pt"),
                                      ("one member", "single", "model1.pt")):
        ours, theirs = [], []
        for _ in range(a.repeats):
            theirs.append(_in_subprocess("fairseq_generate_sampling", os.path.join(a.work, "archive"), members,
                                         os.path.join(a.work, directory), sources, 30, 10))
            ours.append(_in_subprocess("ours_sampling", os.path.join(a.work, directory), sources, 30, 10))
        speedups = [o["sources_per_s"] / t["sources_per_s"] for o, t in zip(ours, theirs)]
        print(f"| {label} | {statistics.median(t['sources_per_s'] for t in theirs):.2f} | "
              f"{statistics.median(o['sources_per_s'] for o in ours):.2f} | {statistics.median(speedups):.2f}x | "
              f"{ours[0]['hypotheses']} | {theirs[0]['tokens']} / {ours[0]['tokens']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
