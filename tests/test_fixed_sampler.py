"""The fixed-shape sampling step (models/nmt/decoding/fixed_step.py, fixed_sampler.py), eager and compiled,
against the eager tree loop (models/nmt/decoding/sampler.py) on the tiny models: the same tokens for the
same seeds, a step that never reads from the device, shapes from a few buckets, and a compiled
step with no graph break that does not recompile when the node bucket or the batch changes."""
import pytest
import torch

from models.nmt.decoding.device_random import gumbel, gumbel_at, row_seeds
from models.nmt.decoding.fixed_sampler import CompiledStep, bucket, fixed_step_of, resolve_step_mode
from models.nmt.decoding.round_trips import computing_ops, count_device_ops, count_round_trips
from models.nmt.engines.fairseq_engine import SampleRequest, Translator


def test_buckets_are_two_sizes_an_octave_and_hold_the_count():
    sizes = sorted({bucket(n) for n in range(1, 5000)})
    assert sizes[:8] == [8, 12, 16, 24, 32, 48, 64, 96]
    for n in range(1, 5000):
        b = bucket(n)
        assert n <= b and (b == 8 or b < 1.5 * n + 1)            # at most a third of a bucket is padding
    assert bucket(70, cap=72) == 72 and bucket(5, cap=6) == 6


def test_the_step_as_a_tensor_gives_the_same_noise_bit_for_bit():
    seeds = row_seeds([3, -7, 2**62, -(2**63)], "cpu")
    for step in (0, 1, 17, 200):
        assert torch.equal(gumbel_at(seeds, torch.tensor(step), 10), gumbel(seeds, step, 10))


def test_step_modes_resolve_and_refuse():
    assert resolve_step_mode("auto", "cpu") == "tree" and resolve_step_mode("auto", "cuda") == "tree"
    assert resolve_step_mode("compiled", "cpu") == "compiled"
    with pytest.raises(ValueError, match="needs a GPU"):
        resolve_step_mode("graphs", "cpu")
    with pytest.raises(ValueError, match="must be one of"):
        resolve_step_mode("fast", "cpu")


def _requests(n_sources, seed=21, free=5, banned=4):
    from tests.toydata import toy_bitext

    out = []
    for i, (src, ref) in enumerate(toy_bitext(300, seed=seed)[:n_sources]):
        words = ref.split()
        out += [SampleRequest(src, f"q{i}", (), free),
                SampleRequest(src, f"q{i}:1", tuple(words[:2]), banned),
                SampleRequest(src, f"q{i}:2", tuple(words[2:5]), banned)]
    return out


def _same_samples(got, want):
    assert [[h.token_ids for h in hs] for hs in got] == [[h.token_ids for h in hs] for hs in want]
    assert [h.nll for hs in got for h in hs] == pytest.approx([h.nll for hs in want for h in hs], abs=1e-5)
    assert [[h.text for h in hs] for hs in got] == [[h.text for h in hs] for hs in want]


@pytest.fixture(scope="module")
def fixed(tiny_nmt_models):
    import os

    return Translator(os.path.join(tiny_nmt_models, "cs-en"), device="cpu", step_mode="fixed")


@pytest.mark.slow
@pytest.mark.parametrize("topk,seed,min_len", [(10, 3, 1), (4, 8, 3), (200, 1, 1)])
def test_the_fixed_step_draws_what_the_tree_loop_draws(fwd, fixed, topk, seed, min_len):
    """Free and banned requests (multi-piece phrases included), k above the vocabulary, a minimum
    length: the same tokens in the same order per request, the same NLLs to float rounding."""
    requests = _requests(12)
    assert sum(len(p) > 1 for r in requests for p in fwd.banned_phrases(r.banned_words)) > 5
    _same_samples(fixed.sample(requests, topk=topk, seed=seed, min_len=min_len),
                  fwd.sample(requests, topk=topk, seed=seed, min_len=min_len))


@pytest.mark.slow
def test_a_rows_samples_do_not_depend_on_its_batch_mates_or_the_batch_size(fixed):
    """Sources alone, together, and split into many small batches (other buckets of sources,
    rows and nodes): the same samples."""
    requests = _requests(10)
    together = fixed.sample(requests, topk=10, seed=5)
    alone = [fixed.sample(requests[i:i + 3], topk=10, seed=5) for i in range(0, len(requests), 3)]
    _same_samples(together, [hs for part in alone for hs in part])
    budget = fixed.sample_batch_tokens
    try:
        fixed.sample_batch_tokens = 300                     # several batches
        _same_samples(fixed.sample(requests, topk=10, seed=5), together)
    finally:
        fixed.sample_batch_tokens = budget


@pytest.mark.slow
def test_a_step_never_reads_from_the_device_and_its_ops_do_not_grow_with_the_batch(fixed):
    """Inside a step: no host round trip (each would be a GPU sync); its tensor operations are
    the same count whatever the rows, bans and node bucket."""
    from models.nmt.decoding.fixed_sampler import FixedBatch

    step = fixed_step_of(fixed)
    per_step = {}
    for n_sources in (2, 9):
        requests = _requests(n_sources)
        src_ids = {r.source: fixed._ids(fixed.src_dict, r.source, "src") for r in requests}
        b = FixedBatch(fixed, step, requests, src_ids, seed=0)
        width = min(10 + b.ban_width, len(fixed.tgt_dict))
        n_nodes, counts = b.n_src, []
        with torch.inference_mode():
            for _ in range(4):
                with count_round_trips() as trips, count_device_ops() as ops:
                    status = step.module(b.state, n_nodes, 16, 10, width, 1)
                assert trips.total == 0, trips.by_kind
                counts.append(computing_ops(ops))
                n_nodes = bucket(int(status[1]), cap=b.rows)
        assert len(set(counts)) == 1, counts
        per_step[n_sources] = counts[0]
    assert per_step[2] == per_step[9]


@pytest.mark.slow
def test_the_compiled_step_has_no_graph_break_gives_the_eager_samples_and_compiles_once(fixed, tiny_nmt_models):
    """inductor with fullgraph=True (a graph break or a host read inside the step would raise),
    dynamic shapes: batches of other sizes and node buckets reuse the one compilation."""
    import os

    from torch._dynamo.utils import counters

    compiled = Translator(os.path.join(tiny_nmt_models, "cs-en"), device="cpu", step_mode="compiled")
    step = fixed_step_of(compiled)
    assert isinstance(step, CompiledStep) and step.mode == "compiled"
    before = counters["stats"]["unique_graphs"]
    batches = [_requests(12), _requests(3, seed=4, free=7, banned=2), _requests(20, seed=9)]
    for requests in batches:
        _same_samples(compiled.sample(requests, topk=10, seed=2), fixed.sample(requests, topk=10, seed=2))
    assert step.compile_seconds > 0
    assert counters["stats"]["unique_graphs"] - before == 1, dict(counters["stats"])


@pytest.mark.slow
def test_the_graphs_mode_runs_its_code_path_on_a_cpu(fixed, tiny_nmt_models):
    """--decode_step graphs is refused on a CPU (CUDA graphs need a GPU); its code path (the
    step's buffers marked as static addresses, inductor's "reduce-overhead" mode, a step marked
    before each call) still runs here, where inductor leaves the graphs out, and draws the same
    samples, batch after batch."""
    import os

    engine = Translator(os.path.join(tiny_nmt_models, "cs-en"), device="cpu", step_mode="fixed")
    engine.step_mode = "graphs"                         # past the refusal, for this test only
    step = fixed_step_of(engine)
    assert step.mode == "graphs"
    for requests in (_requests(6), _requests(3, seed=4)):
        _same_samples(engine.sample(requests, topk=10, seed=1), fixed.sample(requests, topk=10, seed=1))
    assert step.compilations >= 1
