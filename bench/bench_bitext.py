"""Benchmark of the bitext models: alignment recovery (Kim et al. 2019's evaluation), encoding
speed, and the generation job's bitext filter on a bitext with injected misaligned pairs.

    python bench/bench_bitext.py --data ../shared/data [--part align,filter]
        [--encoders runs/bilingual-{lang}-en] [--nmt runs/bench-cluster-models]

Parts (Markdown on stdout, every figure beside its baseline from the same run):

  align   for each of cs-en, de-en, fr-en with an encoder directory (--encoders, {lang} filled in):
          the Multi30k ``val`` set (1,014 pairs), target side shuffled, each sentence's match
          recovered by cosine, Euclidean, CSLS, margin (ratio, distance) and an MLP trained here on
          --mlp_pairs training pairs (random negatives), vs the Levenshtein and length baselines;
          and encoding speed (sentences/s on this CPU).
  filter  the generation job on --pairs Multi30k cs-en training pairs of which 10% are replaced
          by misaligned ones (a Czech sentence with another line's English), with and without the
          bitext filter (the cs-en encoder's cosine at the 10th percentile of clean held-out pairs,
          and a divergence detector trained here on --div_pairs cs-en pairs): recall of the
          injected pairs, share of clean pairs kept, mean dual score of the paraphrases.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
PY = sys.executable


def lines(path: str, limit: int | None = None, skip: int = 0) -> list[str]:
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if limit is not None and i >= skip + limit:
                break
            if i >= skip:
                out.append(line.rstrip("\n"))
    return out


def part_align(a, bitext: str) -> None:
    from models.alignment_recovery import markdown, recover_alignment
    from models.bilingual_encoder import load_bilingual_encoder
    from models.pair_classifier import make_negatives, train_pair_classifier

    for lang in ("cs", "de", "fr"):
        enc_dir = a.encoders.format(lang=lang)
        if not os.path.isfile(os.path.join(enc_dir, "config.json")):
            print(f"\n(no {lang}-en encoder in {enc_dir}: skipped)")
            continue
        enc = load_bilingual_encoder(enc_dir, device="cpu")
        src, tgt = lines(f"{bitext}/val.{lang}.gz"), lines(f"{bitext}/val.en.gz")
        start = time.perf_counter()
        e_src, e_tgt = enc.encode(src, lang), enc.encode(tgt, "en")
        speed = (len(src) + len(tgt)) / (time.perf_counter() - start)
        mlp = None
        if a.mlp_pairs:
            tr_src, tr_tgt = lines(f"{bitext}/train.{lang}.gz", a.mlp_pairs), lines(f"{bitext}/train.en.gz", a.mlp_pairs)
            pa, pb = enc.encode(tr_src, lang), enc.encode(tr_tgt, "en")
            mlp = train_pair_classifier(pa, pb, *make_negatives("random", pa, pb, seed=0), epochs=10, seed=0)
        results = recover_alignment(src, tgt, embeddings=(e_src, e_tgt), mlp=mlp, k=4, seed=0)
        results.update(src_lang=lang, tgt_lang="en")
        print()
        print(markdown(results))
        print(f"encoding: {speed:,.0f} sentences/s on this CPU ({len(src) + len(tgt):,} sentences, "
              f"{enc.dim}-dim embeddings)" + (f"; MLP trained on {a.mlp_pairs:,} training pairs" if mlp else ""))


def _generate(args: list[str]) -> tuple[float, dict]:
    start = time.perf_counter()
    done = subprocess.run([PY, "-m", "beam_pipelines.generate", *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    out = args[args.index("--output") + 1]
    return time.perf_counter() - start, json.load(open(os.path.join(out, "_manifest.json")))


def _rows(out: str, table: str) -> list[dict]:
    import pyarrow.parquet as pq

    return [r for f in sorted(__import__("pathlib").Path(out, table).rglob("*.parquet"))
            for r in pq.read_table(f).to_pylist()]


def part_filter(a, bitext: str, tmp: str) -> None:
    from models.bilingual_encoder import load_bilingual_encoder
    from models.similarity import cosine_pairs

    enc_dir = a.encoders.format(lang="cs")
    cs, en = lines(f"{bitext}/train.cs.gz", a.pairs), lines(f"{bitext}/train.en.gz", a.pairs)
    rng = random.Random(7)
    injected = set(rng.sample(range(len(cs)), len(cs) // 10))
    shuffled = {i: (i + rng.randrange(1, len(cs))) % len(cs) for i in injected}
    inp = os.path.join(tmp, "bitext.tsv")
    with open(inp, "w", encoding="utf-8") as f:
        for i in range(len(cs)):
            f.write(f"{cs[i]}\t{en[shuffled[i]] if i in injected else en[i]}\n")

    held_cs, held_en = lines(f"{bitext}/val.cs.gz", 500), lines(f"{bitext}/val.en.gz", 500)
    enc = load_bilingual_encoder(enc_dir, device="cpu")
    threshold = float(np.percentile(cosine_pairs(enc.encode(held_cs, "cs"), enc.encode(held_en, "en")), 10))
    div_dir = os.path.join(tmp, "divergence-cs-en")
    src_file, tgt_file = os.path.join(tmp, "div.cs"), os.path.join(tmp, "div.en")
    with open(src_file, "w", encoding="utf-8") as f:
        f.writelines(s + "\n" for s in lines(f"{bitext}/train.cs.gz", a.div_pairs, skip=10000))
    with open(tgt_file, "w", encoding="utf-8") as f:
        f.writelines(s + "\n" for s in lines(f"{bitext}/train.en.gz", a.div_pairs, skip=10000))
    start = time.perf_counter()
    subprocess.run([PY, "-m", "models.train_divergence", "--src", src_file, "--tgt", tgt_file, "--src_lang", "cs",
                    "--tgt_lang", "en", "--output", div_dir, "--epochs", "2"], cwd=ROOT, check=True,
                   capture_output=True, text=True)
    div_seconds = time.perf_counter() - start

    base = ["--input", inp, "--forward_model", f"{a.nmt}/cs-en", "--backward_model", f"{a.nmt}/en-cs",
            "--preset", "parabank2-cpu", "--num_sets", "2", "--num_samples", "4", "--dual_xent_threshold", "-1",
            "--device", "cpu"]
    plain_s, plain = _generate([*base, "--output", os.path.join(tmp, "plain")])
    filt_s, filt = _generate([*base, "--output", os.path.join(tmp, "filtered"), "--bitext_encoder", enc_dir,
                              "--bitext_min_similarity", str(threshold), "--divergence_model", div_dir])
    rejected = {r["input_index"]: r["reason"] for r in _rows(os.path.join(tmp, "filtered"), "rejects")
                if r["stage"] == "bitext_filter"}
    clean = [i for i in range(len(cs)) if i not in injected]

    def mean_score(out):
        rows = _rows(out, "paraphrases")
        return np.mean([r["combined_score"] for r in rows]), len(rows)

    plain_score, plain_rows = mean_score(os.path.join(tmp, "plain"))
    filt_score, filt_rows = mean_score(os.path.join(tmp, "filtered"))
    by_reason = {}
    for i, reason in rejected.items():
        by_reason.setdefault(reason, [0, 0])[0 if i in injected else 1] += 1
    print()
    print(f"### Bitext filter in the generation job: {len(cs)} Multi30k cs-en pairs, {len(injected)} "
          f"(10%) replaced by misaligned ones")
    print()
    print(f"cosine threshold {threshold:.4f} (10th percentile of 500 clean val pairs); divergence detector "
          f"trained on {a.div_pairs:,} cs-en pairs in {div_seconds:.0f} s, its own threshold")
    print()
    print("| run | injected pairs rejected (recall) | clean pairs kept | paraphrase rows | mean dual score "
          "(combined_score, lower is better) | seconds |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| no bitext filter (baseline) | 0 / {len(injected)} | {len(clean)} / {len(clean)} | {plain_rows} | "
          f"{plain_score:.3f} | {plain_s:.0f} |")
    recall = sum(i in rejected for i in injected)
    kept = sum(i not in rejected for i in clean)
    print(f"| bitext filter | {recall} / {len(injected)} ({recall / len(injected):.0%}) | {kept} / {len(clean)} "
          f"({kept / len(clean):.0%}) | {filt_rows} | {filt_score:.3f} | {filt_s:.0f} |")
    print()
    print("rejects by reason (injected, clean): " + ", ".join(f"{k} {v[0]}, {v[1]}" for k, v in sorted(by_reason.items())))
    assert plain["counts"]["reconciled"] and filt["counts"]["reconciled"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data"))
    ap.add_argument("--part", default="align,filter")
    ap.add_argument("--encoders", default=os.path.join(ROOT, "runs", "bilingual-{lang}-en"))
    ap.add_argument("--nmt", default=os.path.join(ROOT, "runs", "bench-cluster-models"),
                    help="cs-en/ and en-cs/ NMT models (bench/bench_cluster.py trains them)")
    ap.add_argument("--mlp_pairs", type=int, default=5000, help="training pairs of the MLP (0: no MLP)")
    ap.add_argument("--pairs", type=int, default=500, help="pairs of the filter run")
    ap.add_argument("--div_pairs", type=int, default=5000, help="pairs the cs-en divergence detector learns from")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    bitext = os.path.join(a.data, "bitext", "multi30k")
    parts = set(a.part.split(","))
    if "align" in parts:
        part_align(a, bitext)
    if "filter" in parts:
        with tempfile.TemporaryDirectory(prefix="bench-bitext-") as tmp:
            part_filter(a, bitext, tmp)


if __name__ == "__main__":
    main()
