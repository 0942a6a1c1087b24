"""ROC AUC of saved divergence detectors alone and of the mean of their P(equivalent).

    python bench/bench_divergence.py --seed S --save runs/div-sS      # for S = 1, 2, 3, ...
    python bench/bench_divergence_ensemble.py runs/div-s1 runs/div-s2 runs/div-s3 \\
        [--dev ../shared/data/divergence/commoncrawl.dev.tsv --dev .../opensubs.dev.tsv]

A detector's dev figures move with its seed by more than the aligners differ (docs/benchmarks.md,
"Semantic divergence"); this measures whether averaging detectors of several seeds steadies them.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main() -> None:
    from sklearn.metrics import roc_auc_score

    from models.bitext.divergence import load_divergence_detector, read_dev_tsv

    data = os.path.join(ROOT, "..", "shared", "data", "divergence")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+", help="detector directories (bench_divergence.py --save)")
    ap.add_argument("--dev", action="append", default=None, metavar="TSV",
                    help="labelled TSV (default: the commoncrawl and opensubs dev sets)")
    args = ap.parse_args()
    devs = args.dev or [os.path.join(data, f"{n}.dev.tsv") for n in ("commoncrawl", "opensubs")]
    detectors = [load_divergence_detector(m, device="cpu") for m in args.models]
    print("| dev set | " + " | ".join(os.path.basename(m.rstrip("/")) for m in args.models)
          + f" | mean of {len(detectors)} detectors' scores |\n|---|" + "---:|" * (len(detectors) + 1))
    for path in devs:
        rows = read_dev_tsv(path)
        labels = np.array([y for _, _, y in rows])
        scores = [d.score([e for e, _, _ in rows], [f for _, f, _ in rows]) for d in detectors]
        cells = [f"{roc_auc_score(labels, s):.3f}" for s in scores + [np.mean(scores, 0)]]
        print(f"| {os.path.basename(path)} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
