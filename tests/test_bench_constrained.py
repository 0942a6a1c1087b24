"""bench/bench_constrained.py runs end to end on the tiny models and prints a table whose figures
come from the run (the same samples each round: the digest is that of a fresh sample() call)."""
import gzip
import hashlib
import json
import os
import sys

import pytest

pytestmark = pytest.mark.slow      # the tiny NMT models are trained once per session


def test_bench_constrained_prints_both_rows_and_the_samples_digest(tiny_nmt_models, fwd, tmp_path, capsys):
    from tests.toydata import toy_bitext

    pairs = toy_bitext(12, seed=5)
    for lang, col in (("cs", 0), ("en", 1)):
        with gzip.open(tmp_path / f"val.{lang}.gz", "wt", encoding="utf-8") as f:
            f.writelines(p[col] + "\n" for p in pairs)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench"))
    import bench_constrained
    from bench_gpu import constrained_requests

    assert bench_constrained.main(["--model", os.path.join(tiny_nmt_models, "cs-en"), "--bitext", str(tmp_path),
                                   "--sources", "12", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "| 30 samples |" in out and "| 5 sets x 6 samples |" in out
    want = hashlib.sha256(json.dumps([[h.token_ids for h in hs] for hs in fwd.sample(
        constrained_requests(pairs, 5, 6), topk=10, seed=0)]).encode()).hexdigest()[:16]
    assert f"digest of the constrained samples: {want}" in out
