"""Benchmark of the filter job on a generation run's output (e.g. the Multi30k real run).

Prints, in one run on the same rows:
  - pairs/s of every filter alone (fresh batch each: tokenisation included);
  - pairs/s of our length + length-ratio + n-gram-overlap filters together vs OpusFilter 3.3.1's
    LengthFilter + LengthRatioFilter + SimilarityFilter (word level) on the same pairs (OpusFilter
    runs in its own virtualenv: python -m venv .venv-opusfilter && .venv-opusfilter/bin/pip
    install opusfilter==3.3.1), goal >= 2x;
  - rows/s of the whole job (paranmt preset, DirectRunner, one process).

    python bench/bench_filter.py --input runs/m30k-2000-out --encoder runs/enc-wt
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import storage  # noqa: E402
from filtering.filters import FILTERS, PairBatch  # noqa: E402
from paracorpus.commit import committed_files  # noqa: E402


def _best_of(fn, repeat):
    best = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return best


def main(argv=None) -> int:
    from beam_pipelines.filter import _spm_from_manifest, run

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", required=True, help="generation job output directory")
    ap.add_argument("--encoder", required=True, help="encoder for the paraphrase score")
    ap.add_argument("--opusfilter_python", default=".venv-opusfilter/bin/python")
    ap.add_argument("--repeat", type=int, default=3, help="best of N timings")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    table = storage.parquet_dataset(committed_files(a.input, "paraphrases")).to_table()
    n = table.num_rows
    print(f"{n} paraphrase rows from {a.input}", flush=True)
    results = {"rows": n, "filters": {}}
    work = tempfile.mkdtemp(prefix="bench-filter-")
    spm = _spm_from_manifest(storage.read_json(storage.join(a.input, "_manifest.json")))
    params = {"paraphrase_score": {"model": a.encoder}, "bag_of_pieces": {"spm_model": spm}}
    sample = table.slice(0, min(2000, n))
    for name, cls in FILTERS.items():
        try:
            f = cls(**params.get(name, {}))
        except ValueError as e:            # a filter that needs a model this benchmark was not given
            print(f"  {name}: skipped ({e})")
            continue
        if f.needs_fit():
            f.params.update(f.fit(sample, work, log=lambda m: None))
        try:
            f.setup()
        except (ImportError, ValueError) as e:
            print(f"  {name}: skipped ({e})")
            continue
        fitted = dict(f.params)

        def fresh_score():       # a new instance per timing: no cache survives from the last one
            g = cls(**params.get(name, {}))
            g.params.update(fitted)
            g.setup()
            t0 = time.perf_counter()
            g.score(PairBatch(table))
            return time.perf_counter() - t0
        dt = min(fresh_score() for _ in range(a.repeat))
        results["filters"][name] = n / dt
        print(f"  {name:>17}: {n / dt:10.0f} pairs/s", flush=True)
    ours = [FILTERS[k]() for k in ("length", "length_ratio", "ngram_overlap")]

    def equivalent():
        b = PairBatch(table)
        for f in ours:
            f.score(b)
    dt = _best_of(equivalent, a.repeat)
    results["ours_equivalent"] = n / dt
    tsv = os.path.join(work, "pairs.tsv")
    with open(tsv, "w", encoding="utf-8") as fh:
        for r, p in zip(table.column("reference").to_pylist(), table.column("paraphrase").to_pylist()):
            fh.write(f"{' '.join((r or '').split())}\t{' '.join((p or '').split())}\n")
    if os.path.exists(a.opusfilter_python):
        runs = [json.loads(subprocess.run([a.opusfilter_python, os.path.join(os.path.dirname(__file__),
                                           "opusfilter_runner.py"), tsv], capture_output=True, text=True,
                                          check=True).stdout) for _ in range(a.repeat)]
        opus = max(r["together"]["pairs_per_s"] for r in runs)
        results["opusfilter_equivalent"] = opus
        results["opusfilter_per_filter"] = {k: max(r[k]["pairs_per_s"] for r in runs)
                                            for k in ("length", "length_ratio", "similarity")}
        print(f"length + length ratio + overlap: ours {n / dt:.0f} pairs/s, OpusFilter (length + length ratio + "
              f"similarity) {opus:.0f} pairs/s: {n / dt / opus:.2f}x", flush=True)
    else:
        print(f"length + length ratio + overlap: ours {n / dt:.0f} pairs/s; OpusFilter not found at "
              f"{a.opusfilter_python}")
    t0 = time.perf_counter()
    manifest = run(["--input", a.input, "--output", os.path.join(work, "job"), "--config", "paranmt",
                    "--encoder", a.encoder, "--no_report", "--runner", "DirectRunner"])
    results["job_rows_per_s"] = manifest["rows_in"] / (time.perf_counter() - t0)
    print(f"whole job (paranmt preset, DirectRunner): {results['job_rows_per_s']:.0f} rows/s, "
          f"kept {manifest['kept']} of {manifest['rows_in']}", flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
