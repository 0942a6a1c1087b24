"""bench/bench_generation.py's dual-scoring section on the tiny models: it runs (it crashed when the
engine's score_batches gained a sixth value), and the project's scores equal those of fairseq's
own SequenceScorer on the same batches (what `fairseq-generate --score-reference` runs)."""
import os
import sys

import pytest

pytestmark = pytest.mark.slow      # the tiny NMT models are trained once per session


def test_dual_scoring_section_runs_and_matches_fairseqs_scorer(tiny_nmt_models):
    from tests.toydata import toy_bitext

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench"))
    import bench_generation

    pairs = toy_bitext(40, seed=9)
    result = bench_generation.bench_scoring(os.path.join(tiny_nmt_models, "en-cs"), pairs, rounds=1)
    assert result["pairs"] == 40 and result["fairseq_s"] > 0 and result["ours_s"] > 0
    assert result["max_diff"] < 1e-4, result
