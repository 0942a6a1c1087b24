"""Runs inside a separate virtualenv with OpusFilter 3.3.1 (its pins differ from ours); called by
bench/bench_filter.py. Reads ``reference<TAB>paraphrase`` lines, scores them with OpusFilter's
LengthFilter, LengthRatioFilter and SimilarityFilter (word-level, the overlap-style filter), and
prints JSON: seconds and pairs/s per filter and for the three together, and the accept counts."""
import json
import sys
import time

from opusfilter.filters import LengthFilter, LengthRatioFilter, SimilarityFilter


def main(path):
    with open(path, encoding="utf-8") as f:
        pairs = [tuple(line.rstrip("\n").split("\t")) for line in f]
    filters = {"length": LengthFilter(unit="word", min_length=1, max_length=30),
               "length_ratio": LengthRatioFilter(unit="word", threshold=3),
               "similarity": SimilarityFilter(unit="word", threshold=0.7)}
    out = {"pairs": len(pairs)}
    total = 0.0
    for name, flt in filters.items():
        t0 = time.perf_counter()
        scores = list(flt.score(pairs))
        accepted = sum(bool(flt.accept(s)) for s in scores)
        dt = time.perf_counter() - t0
        total += dt
        out[name] = {"seconds": dt, "pairs_per_s": len(pairs) / dt, "accepted": accepted}
    out["together"] = {"seconds": total, "pairs_per_s": len(pairs) / total}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
