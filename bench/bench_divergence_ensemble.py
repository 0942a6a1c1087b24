"""ROC AUC of saved divergence detectors, of each of their members, and of the mean of all their
members' P(equivalent).

    python bench/bench_divergence.py --seed S --members 5 --save runs/div-sS      # S = 1, 2, 3, ...
    python bench/bench_divergence_ensemble.py runs/div-s1 runs/div-s2 runs/div-s3 \\
        [--dev ../shared/data/divergence/commoncrawl.dev.tsv --dev .../opensubs.dev.tsv]

A detector's dev figures move with its seed by more than the aligners differ (docs/benchmarks.md,
"Semantic divergence"). This pools every member of the detectors given (a single detector is one
member) and prints, per dev set: each detector's AUC, the members' mean, spread and range, and
the AUC and cross-validated macro F1 of the mean of all members' P(equivalent): the limit that
averaging more seeds approaches.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main() -> None:
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from bench_divergence import cross_validated_f1, roc_auc

    from models.bitext.divergence import load_divergence_detector, read_dev_tsv

    data = os.path.join(ROOT, "..", "shared", "data", "divergence")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+", help="detector directories (bench_divergence.py --save)")
    ap.add_argument("--dev", action="append", default=None, metavar="TSV",
                    help="labelled TSV (default: the commoncrawl and opensubs dev sets)")
    args = ap.parse_args()
    devs = args.dev or [os.path.join(data, f"{n}.dev.tsv") for n in ("commoncrawl", "opensubs")]
    detectors = [load_divergence_detector(m, device="cpu") for m in args.models]
    members = [m for d in detectors for m in d.member_detectors()]
    print("| dev set | " + " | ".join(os.path.basename(m.rstrip("/")) for m in args.models)
          + f" | {len(members)} members: mean AUC ± std (range) | mean of all members' P: AUC, F1 (cv) |\n|---|"
          + "---:|" * (len(detectors) + 2))
    for path in devs:
        rows = read_dev_tsv(path)
        labels = np.array([y for _, _, y in rows])
        texts = ([e for e, _, _ in rows], [f for _, f, _ in rows])
        whole = [roc_auc(d.score(*texts), labels) for d in detectors]
        scores = np.array([m.score(*texts) for m in members])
        aucs = [roc_auc(s, labels) for s in scores]
        pooled = scores.mean(0)
        cv, _ = cross_validated_f1(pooled, labels)
        print(f"| {os.path.basename(path)} | " + " | ".join(f"{a:.3f}" for a in whole)
              + f" | {np.mean(aucs):.3f} ± {np.std(aucs):.3f} ({min(aucs):.3f}-{max(aucs):.3f}) | "
              f"{roc_auc(pooled, labels):.3f}, {100 * cv:.1f} |", flush=True)


if __name__ == "__main__":
    main()
