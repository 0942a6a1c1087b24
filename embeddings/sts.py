"""STS evaluation: Pearson and Spearman of a similarity function against gold scores.

A directory is laid out as ``<year or name>/<subset>.tsv`` with lines ``score<TAB>s1<TAB>s2``
(any names; ../shared/data/sts is one such directory). Results: per subset, the mean per year
(over its subsets), the mean of the yearly means and the mean over all subsets.

    paragen-sts --model runs/example-encoder --sts_dir ../shared/data/sts --json runs/sts.json
    paragen-sts --baseline sentence_bleu --sts_dir ../shared/data/sts
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
from scipy.stats import pearsonr, spearmanr

from common.atomic import write_json

Similarity = Callable[[Sequence[str], Sequence[str]], np.ndarray]


@dataclass
class StsSubset:
    name: str                      # "<year>/<subset>"
    gold: list[float] = field(default_factory=list)
    s1: list[str] = field(default_factory=list)
    s2: list[str] = field(default_factory=list)
    skipped: int = 0               # malformed lines (not 3 fields, score not a finite number, bad UTF-8)


def read_subset(path: str, name: str) -> StsSubset:
    sub = StsSubset(name)
    with open(path, "rb") as f:
        for raw in f:
            try:
                fields = raw.decode("utf-8").rstrip("\r\n").split("\t")
                score = float(fields[0]) if len(fields) == 3 else math.nan
            except (UnicodeDecodeError, ValueError):
                score = math.nan
            if not math.isfinite(score):
                sub.skipped += 1
                continue
            sub.gold.append(score)
            sub.s1.append(fields[1])
            sub.s2.append(fields[2])
    return sub


def read_sts_dir(root: str) -> dict[str, list[StsSubset]]:
    """{year: [subsets]} for every ``<root>/<year>/<subset>.tsv``, sorted by name. ROOT may also be
    one year's directory (``<subset>.tsv`` files) or a single .tsv file (e.g. STS Benchmark dev).
    A bucket URL is copied to the local cache first."""
    from common import storage

    if storage.is_url(root):
        if not storage.exists(root):
            raise FileNotFoundError(f"STS directory {root} does not exist")
        root = storage.local_copy(root)
    if os.path.isfile(root):
        year = os.path.basename(os.path.dirname(os.path.abspath(root)))
        return {year: [read_subset(root, f"{year}/{os.path.basename(root)[:-4]}")]}
    if not os.path.isdir(root):
        raise FileNotFoundError(f"STS directory {root} does not exist")
    if any(f.endswith(".tsv") for f in os.listdir(root)):
        year = os.path.basename(os.path.abspath(root))
        return {year: [read_subset(os.path.join(root, f), f"{year}/{f[:-4]}") for f in sorted(os.listdir(root))
                       if f.endswith(".tsv")]}
    years = {}
    for year in sorted(os.listdir(root)):
        ydir = os.path.join(root, year)
        if not os.path.isdir(ydir):
            continue
        subs = [read_subset(os.path.join(ydir, f), f"{year}/{f[:-4]}") for f in sorted(os.listdir(ydir))
                if f.endswith(".tsv")]
        if subs:
            years[year] = subs
    if not years:
        raise ValueError(f"{root} holds no <year>/<subset>.tsv files")
    return years


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else math.nan


def evaluate(similarity: Similarity, root: str) -> dict:
    """Scores of SIMILARITY (pairs of sentence lists -> array of scores) on every subset of ROOT.
    Pearson and Spearman are ×100, as the papers report them."""
    years = read_sts_dir(root)
    subsets, year_means = {}, {}
    for year, subs in years.items():
        for sub in subs:
            if len(sub.gold) < 2:
                subsets[sub.name] = {"pearson": math.nan, "spearman": math.nan, "n": len(sub.gold),
                                     "skipped": sub.skipped}
                continue
            pred = np.asarray(similarity(sub.s1, sub.s2), dtype=np.float64)
            gold = np.asarray(sub.gold, dtype=np.float64)
            constant = np.ptp(pred) == 0 or np.ptp(gold) == 0   # correlation undefined: report 0
            subsets[sub.name] = {
                "pearson": 0.0 if constant else 100 * float(pearsonr(pred, gold)[0]),
                "spearman": 0.0 if constant else 100 * float(spearmanr(pred, gold)[0]),
                "n": len(sub.gold), "skipped": sub.skipped}
        names = [s.name for s in subs]
        year_means[year] = {m: _mean([subsets[n][m] for n in names]) for m in ("pearson", "spearman")}
    return {
        "subsets": subsets,
        "years": year_means,
        "mean_of_year_means": {m: _mean([y[m] for y in year_means.values()]) for m in ("pearson", "spearman")},
        "mean_of_subsets": {m: _mean([s[m] for s in subsets.values()]) for m in ("pearson", "spearman")},
    }


def markdown(results: dict, title: str = "") -> str:
    lines = [f"### {title}", ""] if title else []
    lines += ["| subset | n | Pearson | Spearman |", "|---|---:|---:|---:|"]
    for name, r in results["subsets"].items():
        lines.append(f"| {name} | {r['n']} | {r['pearson']:.1f} | {r['spearman']:.1f} |")
    for year, r in results["years"].items():
        lines.append(f"| **{year} mean** | | {r['pearson']:.1f} | {r['spearman']:.1f} |")
    for key, label in (("mean_of_year_means", "mean of yearly means"), ("mean_of_subsets", "mean of all subsets")):
        r = results[key]
        lines.append(f"| **{label}** | | {r['pearson']:.1f} | {r['spearman']:.1f} |")
    return "\n".join(lines) + "\n"


def sentence_bleu_similarity(s1: Sequence[str], s2: Sequence[str]) -> np.ndarray:
    """Baseline: smoothed sentence BLEU (sacrebleu, add-one smoothing of the n-gram counts as in
    Nakov et al. 2012, lower-cased), averaged over both directions so it is symmetric."""
    from sacrebleu.metrics import BLEU

    bleu = BLEU(effective_order=True, smooth_method="add-k", lowercase=True)
    return np.array([(bleu.sentence_score(a, [b]).score + bleu.sentence_score(b, [a]).score) / 2
                     for a, b in zip(s1, s2)])


def run(argv=None) -> dict:
    from common.cli import UsageError

    ap = argparse.ArgumentParser(prog="paragen-sts", description=__doc__, allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sts_dir", required=True, metavar="DIR",
                    help="directory of <year>/<subset>.tsv files (gold<TAB>sentence1<TAB>sentence2) (required)")
    who = ap.add_mutually_exclusive_group(required=True)
    who.add_argument("--model", metavar="DIR", help="encoder directory (paragen-train-embeddings --output)")
    who.add_argument("--baseline", choices=["sentence_bleu"], help="score with a baseline instead of a model")
    ap.add_argument("--json", metavar="FILE", help="also write the results here as JSON (default: print only)")
    a = ap.parse_args(argv)
    try:
        read_sts_dir(a.sts_dir)                          # a bad STS directory fails before the model loads
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if a.model:
        from models.sentence.sentence_encoder import load_encoder

        sim, title = load_encoder(a.model).similarity, a.model
    else:
        sim, title = sentence_bleu_similarity, "sentence BLEU"
    results = evaluate(sim, a.sts_dir)
    if a.json:
        write_json(a.json, results)
    print(markdown(results, title))
    return results


def main(argv=None) -> int:
    from common.cli import cli_main

    return cli_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
