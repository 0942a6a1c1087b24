"""Choose a filter threshold from data instead of by hand.

- from a target keep rate: the quantile of a score column of a filter run that keeps that share
  of rows (for a score kept high, the (1 - rate) quantile is the minimum; kept low, the rate
  quantile is the maximum);
- from a labelled development set (``label<TAB>sentence1<TAB>sentence2``, label 1 = good pair):
  the bound that maximises accuracy of keep == label.

    python -m filtering.tune --scored runs/filtered/scored --score trigram_overlap --direction low --keep_rate 0.8
    python -m filtering.tune --dev dev.tsv --config paranmt --encoder runs/enc --score paraphrase_score --direction high
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

MAX_DEV_LINE_CHARS = 10_000     # bytes; a dev line longer than this is not a sentence pair


def threshold_for_keep_rate(values, direction: str, rate: float) -> float:
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if not v.size:
        raise ValueError("no finite scores")
    if not 0 < rate <= 1:
        raise ValueError("keep rate must be in (0, 1]")
    if direction == "high":
        return float(np.quantile(v, 1 - rate))
    if direction == "low":
        return float(np.quantile(v, rate))
    raise ValueError("tune a 'high' (min) or 'low' (max) bound")


def threshold_from_dev(values, labels, direction: str) -> tuple[float, float]:
    """(bound, accuracy): the candidate bound (a midpoint between sorted scores) with the best
    accuracy of 'kept' against LABELS (1 good, 0 bad)."""
    v = np.asarray(values, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    ok = np.isfinite(v)
    v, y = v[ok], y[ok]
    if v.size < 2 or y.all() or not y.any():
        raise ValueError("need finite scores for both good and bad development pairs")
    s = np.unique(v)
    cands = np.concatenate([[s[0] - 1e-9], (s[:-1] + s[1:]) / 2, [s[-1] + 1e-9]])
    if direction == "high":
        acc = [(np.mean((v >= c) == y), c) for c in cands]
    elif direction == "low":
        acc = [(np.mean((v <= c) == y), c) for c in cands]
    else:
        raise ValueError("tune a 'high' (min) or 'low' (max) bound")
    best = max(acc, key=lambda t: (t[0], -abs(t[1])))
    return float(best[1]), float(best[0])


def _dev_scores(path: str, config: str, score: str, overrides: dict):
    import pyarrow as pa

    from filtering.config import load_config
    from filtering.filters import PairBatch

    from common.shards import bounded_lines, open_binary

    labels, s1, s2 = [], [], []
    skipped = 0
    with open_binary(path) as f:
        for raw, overlong in bounded_lines(f, MAX_DEV_LINE_CHARS):    # never holds a huge line
            parts = raw.decode("utf-8", errors="replace").split("\t")
            if overlong or len(parts) != 3 or parts[0] not in ("0", "1"):
                skipped += 1
                continue
            labels.append(int(parts[0]))
            s1.append(parts[1])
            s2.append(parts[2])
    if skipped:
        print(f"warning: {path}: skipped {skipped} line(s) that are not 'label<TAB>sentence<TAB>sentence' "
              f"with label 0/1 and at most {MAX_DEV_LINE_CHARS} bytes", file=sys.stderr)
    if not labels:
        raise ValueError(f"{path}: no usable dev line (want label<TAB>sentence<TAB>sentence, label 0/1)")
    cfg = load_config(config, overrides)
    flt = next((f for f in cfg.filters if score in f.scores), None)
    if flt is None:
        raise ValueError(f"no filter of {config} produces {score!r}")
    flt.setup()
    return flt.score(PairBatch(pa.table({"reference": s1, "paraphrase": s2})))[score], labels


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m filtering.tune", description=__doc__, allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--score", required=True, help="score column, e.g. paraphrase_score (required)")
    ap.add_argument("--direction", required=True, choices=["high", "low"],
                    help="whether the score is kept high or low (required)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--scored", metavar="DIR", help="a filter run (its output directory or scored/)")
    src.add_argument("--dev", metavar="FILE", help="label<TAB>sentence1<TAB>sentence2 development file")
    ap.add_argument("--keep_rate", type=float, help="with --scored: share of rows to keep, 0-1 (required with it)")
    ap.add_argument("--config", default="paranmt",
                    help="with --dev: config file or preset holding the filter (default paranmt)")
    ap.add_argument("--encoder", metavar="DIR", help="with --dev: encoder for paraphrase_score (default: the config's)")
    a = ap.parse_args(argv)
    try:
        if a.scored:
            from common import storage
            from paracorpus.runs import open_input

            if a.keep_rate is None:
                ap.error("--scored needs --keep_rate")
            files = list(open_input(a.scored).files)
            col = storage.parquet_dataset(files).to_table(columns=[a.score]).column(0)
            values = np.array([np.nan if x is None else x for x in col.to_pylist()], dtype=np.float64)
            bound = threshold_for_keep_rate(values, a.direction, a.keep_rate)
            kept = np.mean(values >= bound) if a.direction == "high" else np.mean(values <= bound)
            print(f"{a.score}: {'min' if a.direction == 'high' else 'max'} {bound:.4f} keeps {100 * kept:.1f}% "
                  f"of {values.size} rows")
        else:
            overrides = {"paraphrase_score": {"model": a.encoder}} if a.encoder else {}
            values, labels = _dev_scores(a.dev, a.config, a.score, overrides)
            bound, acc = threshold_from_dev(values, labels, a.direction)
            print(f"{a.score}: {'min' if a.direction == 'high' else 'max'} {bound:.4f}, dev accuracy "
                  f"{100 * acc:.1f}% on {len(labels)} pairs")
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    key = "min" if a.direction == "high" else "max"
    print(f"config: thresholds: {{{a.score}: {{{key}: {bound:.4f}}}}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
