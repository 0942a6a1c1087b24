"""The one step shape (common/steps.py) and the generation job's steps (paracorpus/steps.py) on
plain batches with a fake translator: no Beam, no model files. The last test runs a step through
the one Beam adapter (transforms/steps.py)."""
import dataclasses

import numpy as np
import pytest

from common.steps import Rejected, Rule, ScoringStep, Step, StepResult, decide, run_steps
from models.nmt.engine import Hypothesis
from paracorpus.cleaning import CleaningConfig, CleanPair
from paracorpus.config import PRESETS
from paracorpus.steps import CleanStep, DualXentStep, ParaphraseStep, PieceLimitStep, decoding_steps


class FakeTranslator:
    """Whitespace "pieces"; NLL = words of the output; samples: the source's words reversed and
    respelled (never a word of the reference, so no negative constraint is broken) plus a counter,
    so candidates differ and their scores are known."""
    src_lang, tgt_lang = "cs", "en"
    max_source_positions = max_target_positions = 1024

    def __init__(self, score_bias: float = 0.0):
        self.score_bias = score_bias
        self.calls = 0

    def pieces(self, text):
        return text.split()

    source_pieces = target_pieces = pieces

    def score(self, sources, targets):
        self.calls += 1
        return [len(t.split()) + self.score_bias for t in targets]

    def sample(self, requests, topk, seed):
        out = []
        for r in requests:
            words = [w + "x" for w in r.source.split()[::-1]]
            out.append([Hypothesis(" ".join(words + [f"v{k}"] * (k + 1)), (), (), 1.0 + k)
                        for k in range(r.num_samples)])
        return out


def pairs(*texts):
    return [CleanPair(f"p{i}", "t.tsv", i, src, ref) for i, (src, ref) in enumerate(texts)]


# ---------------------------------------------------------------- the shape
def test_rules_refuse_bounds_against_their_direction():
    assert Rule("s", "between", 0.1, 0.9).check() == Rule("s", "between", 0.1, 0.9)
    for bad, msg in ((Rule("s", "high", None, 1.0), "only min"), (Rule("s", "low", 0.1), "only max"),
                     (Rule("s", "between", 2.0, 1.0), "above max"), (Rule("s", "up", 1.0), "direction"),
                     (Rule("s", "high", "0.5"), "must be a number"), (Rule("s", "high", float("nan")), "number")):
        with pytest.raises(ValueError, match=msg):
            bad.check()


class Twice(ScoringStep):
    NAME = "twice"
    SCORES = {"a": "high", "b": "low"}
    REASONS = {"a": "too_small"}

    def score(self, batch):
        return {"a": np.array(batch, dtype=float), "b": 2 * np.array(batch, dtype=float)}


def test_a_scoring_step_rejects_at_the_first_failed_rule_and_keeps_the_rest():
    step = Twice([Rule("a", "high", min=2), Rule("b", "low", max=8)])
    result = step.apply([1, 2, 3, 5, float("nan")])
    assert len(result.kept) == 3 and result.kept[:2] == [2, 3] and np.isnan(result.kept[2])   # NaN passes
    assert [(r.item, r.stage, r.reason, r.detail) for r in result.rejects] == \
        [(1, "twice", "too_small", "a 1 < 2"), (5, "twice", "b", "b 10 > 8")]
    assert Twice().apply([0, 1]).kept == [0, 1]                          # no thresholds: nothing rejected
    with pytest.raises(ValueError, match="no score 'c'"):
        Twice([Rule("c", "high", 1)])
    with pytest.raises(ValueError, match="kept high, not low"):
        Twice([Rule("a", "low", max=1)])
    keep, reasons = decide(Twice().score([1, 5]), [Rule("a", "high", 2), Rule("b", "low", max=8)], 2)
    assert keep.tolist() == [False, False] and reasons == [["a<min"], ["b>max"]]


def test_steps_refuse_unknown_parameters():
    class WithParams(Step):
        NAME = "p"
        PARAMS = {"n": 1}

    assert WithParams(n=3).params == {"n": 3}
    with pytest.raises(ValueError, match="unknown parameter"):
        WithParams(m=3)


def test_run_steps_feeds_each_step_what_the_one_before_kept():
    class Odd(Step):
        NAME = "odd"

        def apply(self, items):
            out = StepResult(kept=[i for i in items if i % 2], counters={"seen": len(items)})
            out.rejects = [Rejected(i, self.NAME, "even", str(i)) for i in items if not i % 2]
            return out

    class Rows(Step):
        NAME = "rows"

        def apply(self, items):
            return StepResult(rows=[{"v": i} for i in items])

    result = run_steps([Odd(), Odd(), Rows()], list(range(6)))
    assert [r.item for r in result.rejects] == [0, 2, 4] and result.rows == [{"v": 1}, {"v": 3}, {"v": 5}]
    assert result.kept == [] and result.counters["seen"] == 6 + 3


# ---------------------------------------------------------------- the generation job's steps
def test_clean_step_rewrites_and_rejects_with_the_cleaning_reasons():
    step = CleanStep(CleaningConfig(src_lang="cs", tgt_lang="en"))
    recs = [{"pair_id": "a", "source": "Muž  sedí\u00a0.", "reference": "A man sits ."},
            {"pair_id": "b", "source": "Pes", "reference": ""},
            {"pair_id": "c", "source": "x\x07", "reference": "y"}]
    result = step.apply(recs)
    assert result.kept == [{"pair_id": "a", "source": "Muž sedí .", "reference": "A man sits ."}]
    assert [(r.item["pair_id"], r.stage, r.reason) for r in result.rejects] == \
        [("b", "clean", "empty_tgt"), ("c", "clean", "control_chars")]


def test_piece_limit_and_dual_xent_steps():
    fwd, bwd = FakeTranslator(), FakeTranslator(score_bias=1.0)
    batch = pairs(("a b c", "x y"), ("a b c d e", "x"), ("a", "x y z w"))
    result = PieceLimitStep(fwd, (4, 3)).apply(batch)
    assert [p.pair_id for p in result.kept] == ["p0"]
    assert [(r.reason, r.detail) for r in result.rejects] == \
        [("too_many_pieces_src", "5 pieces > 4"), ("too_many_pieces_tgt", "4 pieces > 3")]
    # dual x-ent = mean(forward NLL of the reference, backward NLL of the source) = mean(2, 3 + 1)
    scores = DualXentStep(fwd, bwd, 3.5).score(batch[:1])
    assert scores["dual_xent"].tolist() == [3.0]
    result = DualXentStep(fwd, bwd, 2.5).apply(batch[:1])
    assert result.kept == [] and result.rejects[0].detail == "3.000 > 2.5" and result.rejects[0].reason == "dual_xent"


def test_paraphrase_step_makes_rows_and_counts(monkeypatch):
    cfg = dataclasses.replace(PRESETS["parabank2-cpu"], num_sets=1, num_samples=4, clusters=2, keep=2,
                              score_threshold=None, dual_xent_threshold=None)
    step = ParaphraseStep(FakeTranslator(), FakeTranslator(), cfg, "h")
    result = step.apply(pairs(("one two three", "three two one"), ("alpha beta", "beta alpha")))
    assert result.kept == [] and not result.rejects
    assert {r["pair_id"] for r in result.rows} == {"p0", "p1"}
    assert all(r["config_hash"] == "h" and r["rank"] in (1, 2) for r in result.rows)
    assert result.counters["pairs_generated"] == 2 and result.counters["candidates_decoded"] == 8


def test_decoding_steps_put_the_dual_xent_filter_in_only_with_a_backward_model_and_threshold():
    cfg = PRESETS["parabank2-cpu"]
    names = [s.NAME for s in decoding_steps(FakeTranslator(), FakeTranslator(), cfg, "h", (10, 10))]
    assert names == ["segment", "dual_xent", "generate"]
    assert [s.NAME for s in decoding_steps(FakeTranslator(), None, cfg, "h", (10, 10))] == ["segment", "generate"]
    off = dataclasses.replace(cfg, dual_xent_threshold=None)
    assert "dual_xent" not in [s.NAME for s in decoding_steps(FakeTranslator(), FakeTranslator(), off, "h", (9, 9))]


@pytest.mark.slow
def test_the_beam_adapter_emits_kept_items_and_reject_rows():
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from transforms.io import MAIN_TAG, REJECTS_TAG, SplitTagged
    from transforms.steps import ApplyStep

    recs = [{"pair_id": "a", "input_shard": "t.tsv", "input_index": 0, "source": "Pes .", "reference": "A dog ."},
            {"pair_id": "b", "input_shard": "t.tsv", "input_index": 1, "source": "", "reference": "Cat ."}]
    with TestPipeline() as p:
        out = (p | beam.Create(recs) | beam.ParDo(ApplyStep(CleanStep(CleaningConfig()), "h", "pairs_clean"))
               | SplitTagged((MAIN_TAG, REJECTS_TAG)))
        assert_that(out[MAIN_TAG] | "Ids" >> beam.Map(lambda r: r["pair_id"]), equal_to(["a"]), label="kept")
        assert_that(out[REJECTS_TAG] | "Why" >> beam.Map(lambda r: (r["pair_id"], r["stage"], r["reason"])),
                    equal_to([("b", "clean", "empty_src")]), label="rejects")
