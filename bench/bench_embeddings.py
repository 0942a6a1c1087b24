"""Benchmark of the embedding job on paraphrases generated from Multi30k (issue: embedding job).

Prints, in one run, STS Pearson (×100) on the STS 2012 subsets and the STS Benchmark dev set for:
  - WORD and WORD+TRIGRAM trained on the generation job's paraphrases (reference, paraphrase);
  - the same encoders trained on the raw bitext pairs (English reference, Czech source), i.e.
    without back-translation (a bilingual model: the vocabulary and trigrams are shared);
  - a sentence-BLEU baseline (no training);
  - WORD with mega-batch M = 1, 20, 40 (ParaNMT Table 6);
and training pairs/s of each run. The best epoch is picked on STS Benchmark *train* (never on a
reported set).

    python bench/bench_embeddings.py --paraphrases runs/m30k-2000-out \
        --bitext ../shared/data/bitext/multi30k --raw_lines 2000 --sts ../shared/data/sts
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from embeddings.data import PairSource  # noqa: E402
from embeddings.sts import evaluate, sentence_bleu_similarity  # noqa: E402
from embeddings.train import TrainConfig, train  # noqa: E402
from models.sentence.sentence_encoder import load_encoder  # noqa: E402


def _raw_pairs(bitext: str, lines: int) -> list[tuple[str, str]]:
    def read(lang):
        with gzip.open(os.path.join(bitext, f"train.{lang}.gz"), "rt", encoding="utf-8") as f:
            return [next(f).strip() for _ in range(lines)]
    return list(zip(read("en"), read("cs")))


def _report_sets(sts_root: str) -> dict[str, str]:
    sets = {}
    year = os.path.join(sts_root, "2012")
    for f in sorted(os.listdir(year)):
        if f.endswith(".tsv"):
            sets[f"2012/{f[:-4]}"] = os.path.join(year, f)
    sets["stsb/dev"] = os.path.join(sts_root, "stsb", "dev.tsv")
    return sets


def _score(sim, sets: dict[str, str]) -> dict[str, float]:
    out = {}
    for name, path in sets.items():
        out[name] = evaluate(sim, path)["mean_of_subsets"]["pearson"]
    out["2012 mean"] = sum(out[n] for n in out if n.startswith("2012/")) / sum(n.startswith("2012/") for n in out)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--paraphrases", required=True, help="generation job output directory")
    ap.add_argument("--where", action="append", default=[], help="row filter on the paraphrases (e.g. rank<=2)")
    ap.add_argument("--bitext", default="../shared/data/bitext/multi30k")
    ap.add_argument("--raw_lines", type=int, default=2000, help="raw pairs: first N lines (the generation input)")
    ap.add_argument("--sts", default="../shared/data/sts")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--dim", type=int, default=300)
    ap.add_argument("--megabatches", default="1,20,40")
    ap.add_argument("--json", help="write all figures here")
    a = ap.parse_args(argv)
    sets = _report_sets(a.sts)
    dev = os.path.join(a.sts, "stsb", "train.tsv")
    para = PairSource(a.paraphrases, where=a.where)
    raw = _raw_pairs(a.bitext, a.raw_lines)
    n_para = sum(1 for _ in para)
    print(f"paraphrase pairs: {n_para} ({para.describe()}); raw bitext pairs: {len(raw)}; "
          f"dev (epoch selection): {dev}", flush=True)
    runs = [("sentence BLEU (no training)", None, None, None)]
    for enc in ("word", "word+trigram"):
        runs.append((f"{enc.upper()}, paraphrases", para, enc, 1))
        runs.append((f"{enc.upper()}, raw pairs (en, cs)", raw, enc, 1))
    for m in (int(x) for x in a.megabatches.split(",")):
        if m != 1:
            runs.append((f"WORD, paraphrases, M={m}", para, "word", m))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, data, enc, m) in enumerate(runs):
            t0 = time.time()
            if data is None:
                scores, speed, best = _score(sentence_bleu_similarity, sets), None, None
            else:
                out = os.path.join(tmp, f"run{i}")
                rep = train(data, out, TrainConfig(encoder=enc, dim=a.dim, epochs=a.epochs, megabatch=m,
                                                   progress=False), dev, log=lambda msg: None)
                seconds = sum(e["seconds"] for e in rep["epochs"])      # rounded to 0.01 s: 0 on a tiny run
                speed = sum(e["pairs"] for e in rep["epochs"]) / seconds if seconds else None
                best = rep["best_epoch"]
                scores = _score(load_encoder(out).similarity, sets)
            results.append({"run": label, "megabatch": m, "pairs_per_s": speed, "best_epoch": best, **scores})
            print(f"  {label}: 2012 mean {scores['2012 mean']:.1f}, STSB dev {scores['stsb/dev']:.1f}"
                  + (f", {speed:.0f} training pairs/s, best epoch {best}" if speed else "")
                  + f" ({time.time() - t0:.0f}s)", flush=True)
    names = list(sets) + ["2012 mean"]
    print()
    print("| run | " + " | ".join(names) + " | train pairs/s |")
    print("|---|" + "---:|" * (len(names) + 1))
    for r in results:
        speed = f"{r['pairs_per_s']:.0f}" if r["pairs_per_s"] else "-"
        print(f"| {r['run']} | " + " | ".join(f"{r[n]:.1f}" for n in names) + f" | {speed} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"paraphrase_pairs": n_para, "raw_pairs": len(raw), "epochs": a.epochs, "dim": a.dim,
                       "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
