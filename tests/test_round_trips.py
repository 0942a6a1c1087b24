"""Host<->device round trips while decoding (models/nmt/decoding/round_trips.py), the CPU proxy for a GPU
left idle: a constant number per decoder step in sample(), whatever the rows and banned phrases,
and a constant number per call in score(). These tests fail when a change brings per-row or
per-phrase round trips back."""
import pytest

from models.nmt.decoding.round_trips import computing_ops, count_decoder_steps, count_device_ops, count_round_trips
from models.nmt.engines.fairseq_engine import SampleRequest

pytestmark = pytest.mark.slow      # the tiny NMT models are trained once per session


@pytest.fixture(scope="module")
def many_sources():
    from tests.toydata import toy_bitext

    return toy_bitext(600, seed=9)


def _requests(pairs, n_sources, sets, samples):
    reqs = []
    for i, (src, ref) in enumerate(pairs[:n_sources]):
        words = ref.split()
        for s in range(sets):
            banned = tuple(words[s:s + 3]) if sets > 1 else ()
            reqs.append(SampleRequest(src, f"r{i}:{s}", banned, samples))
    return reqs


def _trips_per_step(engine, reqs, monkeypatch):
    """(round trips, decoder steps) of one sample() call (one batch)."""
    monkeypatch.setattr(engine, "sample_batch_tokens", 10**9)          # one batch: steps are comparable
    with count_round_trips() as trips, count_decoder_steps() as steps:
        out = engine.sample(reqs, topk=10, seed=3)
    assert sum(len(h) for h in out) == sum(r.num_samples for r in reqs)
    assert steps.total > 10
    return trips.total, steps.total


def test_sampling_round_trips_per_step_do_not_grow_with_rows_or_bans(fwd, many_sources, monkeypatch):
    free100 = _trips_per_step(fwd, _requests(many_sources, 100, 1, 30), monkeypatch)
    banned20 = _trips_per_step(fwd, _requests(many_sources, 20, 5, 6), monkeypatch)
    banned100 = _trips_per_step(fwd, _requests(many_sources, 100, 5, 6), monkeypatch)
    per_step = {name: trips / steps for name, (trips, steps) in
                {"free100": free100, "banned20": banned20, "banned100": banned100}.items()}
    # The bound: constrained at most 2x unconstrained, 100 sources each.
    assert banned100[0] <= 2 * free100[0], per_step
    # One read-back per step plus a per-batch constant (sources, rows, bans in, rows out).
    for name, (trips, steps) in {"free100": free100, "banned20": banned20, "banned100": banned100}.items():
        assert trips <= steps + 40, (name, trips, steps)
    # Five times the rows and phrases: not one more round trip per step.
    assert per_step["banned100"] <= per_step["banned20"] + 0.5, per_step


def test_scoring_round_trips_are_per_batch_not_per_pair(bwd, many_sources, monkeypatch):
    def count(n):
        english = [ref for _, ref in many_sources[:n]]
        foreign = [src for src, _ in many_sources[:n]]
        with count_round_trips() as trips:
            scores = bwd.score(english, foreign)
        assert len(scores) == n
        return trips.total, len(list(bwd.score_batches(english, foreign)))

    # The bound, at the engine's own budget: 5x the pairs, at most 2.5x the round trips.
    (small, _), (large, _) = count(100), count(500)
    assert large <= 2.5 * small, (small, large)
    # With small batches: a constant per batch (fairseq's encoder and decoder each check their
    # padding once per forward pass), one transfer in and one out per call, nothing per pair.
    monkeypatch.setattr(bwd, "batch_tokens", 2_000)
    for n in (100, 500):
        trips, batches = count(n)
        assert batches > 3 and trips <= 8 * batches + 4, (n, trips, batches)


def test_device_ops_are_counted_by_name_views_apart():
    import torch

    a = torch.ones(6)
    with count_device_ops() as ops:
        b = (a + 1).view(2, 3).t()
        b.sum()
    assert ops.by_kind["add"] == 1 and ops.by_kind["sum"] == 1 and ops.by_kind["(views)"] == 2
    assert computing_ops(ops) == 2
    a * 2                                                    # outside the block: not counted
    assert computing_ops(ops) == 2


def test_sampling_ops_per_step_do_not_grow_with_rows(fwd, many_sources, monkeypatch):
    """On a GPU a host-bound step costs its kernel launches: their number per step must not grow
    with the rows (no per-row work) and bans must add only a few. The logits are taken in one
    block, as on a GPU (the CPU's cache-sized blocks add ops with the rows by design)."""
    from models.nmt.engines import fairseq_engine as translator

    monkeypatch.setattr(fwd, "sample_batch_tokens", 10**9)
    monkeypatch.setattr(translator, "_LOGIT_ROWS", 10**9)
    per_step = {}
    for name, reqs in {"free20": _requests(many_sources, 20, 1, 30), "free100": _requests(many_sources, 100, 1, 30),
                       "banned100": _requests(many_sources, 100, 5, 6)}.items():
        with count_device_ops() as ops, count_decoder_steps() as steps:
            fwd.sample(reqs, topk=10, seed=3)
        per_step[name] = computing_ops(ops) / steps.total
    assert per_step["free100"] <= per_step["free20"] * 1.1 + 5, per_step
    assert per_step["banned100"] <= per_step["free100"] * 1.5, per_step
