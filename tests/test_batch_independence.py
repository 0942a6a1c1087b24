"""A pair's output depends on nothing but the pair: not on the pairs decoded in the same batch, the
work unit it falls in, or the batch size. fairseq's SequenceGenerator takes one length limit from
a batch's padded source length, so a short source's hypothesis that runs to its limit used to get
more steps beside a long source (models/nmt/decoding/beam.py gives each source its own)."""
import json
import os
import subprocess
import sys

import pytest

from beam_pipelines.generate import run

pytestmark = pytest.mark.slow      # tiny NMT models trained once per session, whole jobs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def odd_sources(n: int, seed: int = 0) -> list[str]:
    """Short sources of one to four toy words in no sensible order: the tiny models translate
    them into hypotheses that often run to their length limit."""
    import random

    from tests.toydata import toy_bitext

    words = sorted({w for s, _ in toy_bitext(400, seed=5)[:40] for w in s.split()})
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        out.append(" ".join(rnd.choice(words) for _ in range(rnd.randint(1, 4))))
        out.append(" ".join([rnd.choice(words)] * rnd.randint(2, 4)))
    return list(dict.fromkeys(out))


def _at_limit(engine, source: str, hypothesis) -> bool:
    return len(hypothesis.pieces) >= engine._max_len(len(engine.source_pieces(source)) + 1)


def test_beam_search_of_a_source_is_the_same_alone_and_beside_a_long_source(fwd):
    from tests.toydata import toy_bitext

    sources = odd_sources(30)
    long = " ".join(s for s, _ in toy_bitext(400, seed=5)[:5])
    alone = [fwd.beam_search([s], beam=4, nbest=2)[0] for s in sources]
    batched = fwd.beam_search(sources + [long], beam=4, nbest=2)[:-1]
    assert [[h.token_ids for h in hs] for hs in batched] == [[h.token_ids for h in hs] for hs in alone]
    for hs, gs in zip(batched, alone):
        assert [h.nll for h in hs] == pytest.approx([h.nll for h in gs], abs=1e-5)
    hit = sum(_at_limit(fwd, s, hs[0]) for s, hs in zip(sources, alone))
    assert hit >= 5, "some hypotheses run to their length limit, where batch-mates used to matter"


@pytest.fixture(scope="module")
def mixed_input(tmp_path_factory):
    """Toy pairs and odd short sources (with short references: cleaning bounds the length ratio)."""
    from tests.toydata import toy_bitext

    pairs = toy_bitext(400, seed=31)[:40]
    lines = [f"{s}\t{t}" for s, t in pairs]
    lines += [f"{s}\t{' '.join(t.split()[:len(s.split())])}" for s, (_, t) in zip(odd_sources(20, seed=3), pairs)]
    path = tmp_path_factory.mktemp("mixed") / "in.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


SCORES = ("forward_nll", "backward_nll", "combined_score")


def job_rows(inp: str, out, models: dict, *extra) -> list[dict]:
    """The job's paraphrase rows, without the config hash (--batch_pairs is in it) and the output
    partition (a unit's, so it follows --unit_pairs)."""
    from common import storage
    from paracorpus.commit import committed_files

    run(["--input", inp, "--output", str(out), "--src_lang", "cs", "--tgt_lang", "en",
         "--forward_model", models["forward"], "--backward_model", models["backward"],
         "--score_threshold", "20", "--dual_xent_threshold", "-1", "--num_output_shards", "2",
         "--device", "cpu", "--overwrite", *extra])
    rows = storage.parquet_dataset(committed_files(str(out), "paraphrases")).to_table().to_pylist()
    return sorted(({k: v for k, v in r.items() if k not in ("config_hash", "shard")} for r in rows),
                  key=lambda r: (r["pair_id"], r["rank"]))


def assert_same_rows(rows: list[dict], want: list[dict], score_tolerance: float = 1e-5) -> None:
    """Every column equal; scores to SCORE_TOLERANCE (float sums in batches of other shapes round
    otherwise)."""
    assert len(rows) == len(want)
    for r, w in zip(rows, want):
        assert {k: v for k, v in r.items() if k not in SCORES} == {k: v for k, v in w.items() if k not in SCORES}
        assert [r[k] for k in SCORES] == pytest.approx([w[k] for k in SCORES], abs=score_tolerance)


# Three unit sizes, two batch sizes and one or two torch threads (one run each with a different
# combination of them).
LAYOUTS = [("--unit_pairs", "7", "--batch_pairs", "3", "--torch_threads", "1"),
           ("--unit_pairs", "25", "--batch_pairs", "3", "--torch_threads", "2"),
           ("--unit_pairs", "5000", "--batch_pairs", "64", "--torch_threads", "2")]


def subprocess_rows(inp: str, out, models: dict, *extra) -> list[dict]:
    """job_rows() of the same command run as a process of its own (a fresh interpreter: none of
    this test process's torch settings, caches or loaded models), through JSON."""
    rows = f"{out}.rows.json"
    code = ("import json, sys; from tests.test_batch_independence import job_rows; "
            "json.dump(job_rows(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), *sys.argv[5:]), "
            "open(sys.argv[4], 'w'), default=str)")
    done = subprocess.run([sys.executable, "-c", code, inp, str(out), json.dumps(models), rows, *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr[-3000:]
    with open(rows) as f:
        return json.load(f)


@pytest.mark.parametrize("mode", [("--preset", "paranmt", "--beam", "4"),
                                  ("--preset", "parabank2-cpu", "--num_sets", "2", "--num_samples", "4")])
def test_job_rows_do_not_depend_on_unit_batch_size_threads_or_process(mixed_input, tiny_nmt_models, tmp_path, mode):
    """The rows of one input whatever the unit and batch sizes and torch threads (scores to 1e-5),
    and, for one layout, exactly the rows of the same command in another process with another
    thread count (rows compared as JSON: equal floats, equal bits)."""
    models = {"forward": os.path.join(tiny_nmt_models, "cs-en"), "backward": os.path.join(tiny_nmt_models, "en-cs")}
    runs = [job_rows(mixed_input, tmp_path / f"r{i}", models, *mode, *layout) for i, layout in enumerate(LAYOUTS)]
    assert len(runs[0]) >= 40
    for other in runs[1:]:
        assert_same_rows(other, runs[0])
    elsewhere = subprocess_rows(mixed_input, tmp_path / "elsewhere", models, *mode, *LAYOUTS[1][:4], "--torch_threads", "1")
    assert elsewhere == json.loads(json.dumps(runs[1], default=str))


def test_the_fixed_shape_step_eager_and_compiled_writes_the_tree_loops_rows(mixed_input, tiny_nmt_models, tmp_path):
    """--decode_step fixed and compiled (models/nmt/decoding/fixed_sampler.py: rows padded to buckets of
    sources, nodes and lengths) in other unit and batch layouts: the tree loop's rows, scores to
    float rounding."""
    models = {"forward": os.path.join(tiny_nmt_models, "cs-en"), "backward": os.path.join(tiny_nmt_models, "en-cs")}
    mode = ("--preset", "parabank2-cpu", "--num_sets", "2", "--num_samples", "4")
    want = job_rows(mixed_input, tmp_path / "tree", models, *mode, *LAYOUTS[0])
    for i, step in enumerate(("fixed", "compiled")):
        assert_same_rows(job_rows(mixed_input, tmp_path / step, models, *mode, *LAYOUTS[i + 1], "--decode_step", step),
                         want)
    # the manifest counts every compilation, those a unit's new batch shape made apart
    decode_step = json.load(open(tmp_path / "compiled" / "_manifest.json"))["decode_step"]
    assert decode_step["workers"] == {"compiled": 1} and decode_step["compile_ms"] > 0
    assert 0 <= decode_step["compile_in_units_ms"] <= decode_step["compile_ms"]


def test_translate_cli_gives_a_line_the_same_output_alone_and_among_long_ones(tiny_nmt_models, fwd):
    from tests.toydata import toy_bitext

    model = os.path.join(tiny_nmt_models, "cs-en")
    lines = [s for s in odd_sources(30) if _at_limit(fwd, s, fwd.beam_search([s], beam=5)[0][0])][:4]
    assert lines, "some lines run to their length limit"
    long = [" ".join(s for s, _ in toy_bitext(400, seed=k)[:4]) for k in range(3)]

    def translate(text):
        done = subprocess.run([sys.executable, "-m", "models.nmt.translate", "--model", model, "--beam", "5"],
                              input=text, capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.splitlines()

    alone = [translate(line + "\n")[0] for line in lines[:2]]
    among = translate("\n".join([long[0], lines[0], long[1], lines[1], long[2]]) + "\n")
    assert [among[1], among[3]] == alone
