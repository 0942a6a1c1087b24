"""The bitext filter (paracorpus/steps.py, models/bitext/scoring.py) with real tiny models (a bilingual encoder, its MLP, a
divergence detector) trained on the synthetic bitext: its decisions, the generation job's stage
on the DirectRunner and on a Dask cluster, the filter job's filters, and the mistakes refused."""
import json
import os
import re

import numpy as np
import pytest

from tests.toydata import toy_bitext

pytestmark = pytest.mark.slow


def misaligned(pairs, seed=0):
    """Each Czech sentence with the English side of a pair that means something else."""
    rng = np.random.default_rng(seed)
    out = []
    for i, (cs, en) in enumerate(pairs):
        j = int(rng.integers(len(pairs)))
        while pairs[j][0] == cs or j == i:
            j = int(rng.integers(len(pairs)))
        out.append((cs, pairs[j][1]))
    return out


@pytest.fixture(scope="module")
def bitext_models(tmp_path_factory):
    """{"encoder", "mlp", "divergence", "threshold"} of tests/bitext_models.py, built for this module."""
    from tests.bitext_models import build_bitext_models

    return build_bitext_models(str(tmp_path_factory.mktemp("bitext-models")))


def _decisions(steps, pairs):
    """{index of a pair: (reason, detail)} of what STEPS reject among (Czech, English) PAIRS."""
    from common.steps import run_steps
    from paracorpus.cleaning import CleanPair

    items = [CleanPair(str(i), "t.tsv", i, a, b) for i, (a, b) in enumerate(pairs)]
    result = run_steps(steps, items)
    assert len(result.kept) + len(result.rejects) == len(items)
    return {r.item.input_index: (r.reason, r.detail) for r in result.rejects if r.stage == "bitext_filter"}


def test_the_filter_rejects_most_misaligned_pairs_and_keeps_most_aligned_ones(bitext_models):
    from paracorpus.steps import BitextFilterConfig, bitext_steps

    cfg = BitextFilterConfig(encoder=bitext_models["encoder"], min_similarity=bitext_models["threshold"],
                             divergence=bitext_models["divergence"])
    steps = bitext_steps(cfg, ("cs", "en"))
    assert [s.NAME for s in steps] == ["bitext_filter", "bitext_filter"]
    aligned = toy_bitext(100, seed=21)
    bad = misaligned(aligned, seed=2)
    pairs = aligned + bad
    decisions = _decisions(steps, pairs)
    kept_aligned = sum(i not in decisions for i in range(100)) / 100
    rejected_bad = sum(i in decisions for i in range(100, 200)) / 100
    assert kept_aligned >= 0.7 and rejected_bad >= 0.7, (kept_aligned, rejected_bad)
    for reason, detail in decisions.values():
        assert reason in ("bitext_similarity", "divergent")
        assert re.fullmatch(r"(cosine [-\d.]+ < [-\d.e]+|P\(equivalent\) [\d.]+ < [\d.]+)", detail), detail
    # the sides in the other order (English first) give the same decisions; a third language is refused
    swapped = _decisions(bitext_steps(cfg, ("en", "cs")), [(e, c) for c, e in pairs])
    assert swapped == decisions
    with pytest.raises(ValueError, match="is for cs-en, not cs-de"):
        bitext_steps(cfg, ("cs", "de"))
    # a similarity threshold above every cosine rejects every pair there, before the detector runs
    strict = bitext_steps(BitextFilterConfig(encoder=bitext_models["encoder"], min_similarity=1.01,
                                             divergence=bitext_models["divergence"]), ("cs", "en"))
    assert {reason for reason, _ in _decisions(strict, pairs).values()} == {"bitext_similarity"}


def test_the_mlp_gives_probabilities_of_the_encoders_embeddings(bitext_models):
    from models.bitext.scoring import SimilarityScorer

    mlp = SimilarityScorer(bitext_models["encoder"], bitext_models["mlp"])
    cosine = SimilarityScorer(bitext_models["encoder"])
    pairs = toy_bitext(50, seed=31)
    p = mlp.score([c for c, _ in pairs], [e for _, e in pairs], "cs", "en")
    c = cosine.score([c for c, _ in pairs], [e for _, e in pairs], "cs", "en")
    assert mlp.method == "mlp" and cosine.method == "cosine"
    assert p.shape == c.shape == (50,) and ((0 <= p) & (p <= 1)).all() and not np.allclose(p, c)


def _job_input(tmp_path):
    aligned = toy_bitext(24, seed=41)
    bad = misaligned(toy_bitext(8, seed=42), seed=4)
    path = tmp_path / "in.tsv"
    path.write_text("".join(f"{cs}\t{en}\n" for cs, en in aligned + bad), encoding="utf-8")
    return path, len(aligned), len(bad)


@pytest.mark.parametrize("runner", ["direct", "dask"])
def test_generation_job_rejects_before_back_translation_with_reasons(runner, tmp_path, bitext_models,
                                                                    tiny_nmt_models, request):
    from beam_pipelines.generate import run

    inp, n_good, n_bad = _job_input(tmp_path)
    extra = []
    if runner == "dask":
        extra = ["--runner", "DaskRunner", "--dask_client_address", request.getfixturevalue("dask_cluster")]
    out = tmp_path / "out"
    manifest = run(["--input", str(inp), "--output", str(out),
                    "--forward_model", os.path.join(tiny_nmt_models, "cs-en"),
                    "--backward_model", os.path.join(tiny_nmt_models, "en-cs"), "--num_sets", "1",
                    "--num_samples", "2", "--dual_xent_threshold", "-1", "--score_threshold", "-1",
                    "--bitext_encoder", bitext_models["encoder"],
                    "--bitext_min_similarity", str(bitext_models["threshold"]),
                    "--divergence_model", bitext_models["divergence"], *extra])
    assert manifest["counts"]["reconciled"] and manifest["counts"]["records_read"] == n_good + n_bad
    assert {"bitext_encoder", "divergence"} <= set(manifest["models"])
    assert set(manifest["models"]["bitext_encoder"]["sha256"]) >= {"config.json", "weights.pt", "spm.model"}
    import pyarrow.parquet as pq

    rejects = [r for f in (out / "rejects").rglob("*.parquet") for r in pq.read_table(f).to_pylist()]
    at_filter = [r for r in rejects if r["stage"] == "bitext_filter"]
    assert at_filter and {r["reason"] for r in at_filter} <= {"bitext_similarity", "divergent"}
    assert all(re.search(r"\d", r["detail"]) for r in at_filter)         # the score is in the detail
    bad_rejected = sum(r["input_index"] >= n_good for r in at_filter)
    assert bad_rejected >= 0.6 * n_bad, (bad_rejected, at_filter)
    by_reason = manifest["counts"]["rejected_by_reason"]
    assert sum(by_reason.get(r, 0) for r in ("bitext_similarity", "divergent")) == len(at_filter)
    # counters and precision from the records the workers wrote, on Dask too (whose runner reports
    # no Beam metrics: before, its manifests had no counters and no workers' precision)
    counters = manifest["counters"]
    assert sum(counters.get(f"rejected_{r}", 0) for r in ("bitext_similarity", "divergent")) == len(at_filter)
    assert counters["records_read"] == n_good + n_bad and counters["ms_warm_up"] > 0 and counters["ms_sample"] > 0
    precision = manifest["precision"]
    assert set(precision["workers"]) == {"cpu_fp32"} and precision["workers"]["cpu_fp32"] >= 1
    assert precision["units"] == {"fp32": manifest["units"]["written"]} and precision["mixed"] is False


def test_filter_job_scores_source_against_reference_and_paraphrase(tmp_path, bitext_models):
    from beam_pipelines.filter import run as filter_run
    from tests.toydata import paraphrase_rows, write_generation_run

    aligned = toy_bitext(30, seed=51)
    bad = misaligned(toy_bitext(10, seed=52), seed=5)
    rows = paraphrase_rows([(en, en) for _, en in aligned + bad])
    for row, (cs, _) in zip(rows, aligned + bad):
        row["source"] = cs
    write_generation_run(tmp_path / "gen", rows)
    (tmp_path / "cfg.yaml").write_text(
        "filters:\n"
        f"  - name: bitext_similarity\n    encoder: {bitext_models['encoder']}\n"
        f"    thresholds: {{bitext_similarity_reference: {{min: {bitext_models['threshold']}}}}}\n"
        f"  - name: divergence\n    model: {bitext_models['divergence']}\n"
        "    thresholds: {equivalence_reference: {min: 0.5}}\n", encoding="utf-8")
    filter_run(["--input", str(tmp_path / "gen"), "--output", str(tmp_path / "out"),
                "--config", str(tmp_path / "cfg.yaml"), "--no_report"])
    manifest = json.load(open(tmp_path / "out" / "_filter_manifest.json"))
    assert manifest["reconciled"] and manifest["rows_in"] == 40
    import pyarrow.parquet as pq

    scored = [r for f in (tmp_path / "out").rglob("*.parquet") for r in pq.read_table(f).to_pylist()]
    assert len(scored) == 40
    for r in scored:
        for col in ("bitext_similarity_reference", "bitext_similarity_paraphrase", "equivalence_reference",
                    "equivalence_paraphrase"):
            assert r[col] is not None
    by_source = {r["source"]: r for r in scored}
    rejected_bad = sum("equivalence_reference<min" in by_source[cs]["reasons"] for cs, _ in bad)
    kept_good = sum(by_source[cs]["keep"] for cs, _ in aligned)
    assert rejected_bad >= 7 and kept_good >= 20, (rejected_bad, kept_good)
    assert {x for r in scored for x in r["reasons"]} <= {"equivalence_reference<min", "bitext_similarity_reference<min"}


def test_mistakes_are_refused_before_anything_runs(tmp_path, bitext_models, tiny_nmt_models):
    import shutil

    from beam_pipelines.generate import run
    from common.cli import UsageError

    inp, _, _ = _job_input(tmp_path)
    base = ["--input", str(inp), "--forward_model", os.path.join(tiny_nmt_models, "cs-en"),
            "--backward_model", os.path.join(tiny_nmt_models, "en-cs")]
    with pytest.raises(UsageError, match="needs --bitext_min_similarity"):
        run([*base, "--output", str(tmp_path / "o1"), "--bitext_encoder", bitext_models["encoder"]])
    with pytest.raises(UsageError, match="not a model directory"):
        run([*base, "--output", str(tmp_path / "o2"), "--divergence_model", str(tmp_path)])
    other = tmp_path / "de-en"
    shutil.copytree(bitext_models["encoder"], other)
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "src_lang": "de"}))
    with pytest.raises(UsageError, match="is a de-en model; this job is cs-en"):
        run([*base, "--output", str(tmp_path / "o3"), "--bitext_encoder", str(other),
             "--bitext_min_similarity", "0.5"])
    assert not any((tmp_path / o).exists() for o in ("o1", "o2", "o3"))


def test_a_bitext_model_changed_since_the_job_started_is_refused(tmp_path, bitext_models):
    """Workers check every file against the sha256 the driver recorded, as for the NMT models."""
    import shutil

    from beam_pipelines.generation.model_checks import directory_sha256
    from models.safety import UnsafeModelError
    from paracorpus.steps import BitextFilterConfig, bitext_steps

    enc = tmp_path / "enc"
    shutil.copytree(bitext_models["encoder"], enc)
    cfg = BitextFilterConfig(encoder=str(enc), min_similarity=0.5)
    recorded = {"bitext_encoder": directory_sha256(str(enc))}
    assert len(bitext_steps(cfg, ("cs", "en"), sha256=recorded)) == 1           # unchanged: loads
    (enc / "spm.model").write_bytes((enc / "spm.model").read_bytes() + b"\0")
    with pytest.raises(UnsafeModelError, match="spm.model changed since the job started"):
        bitext_steps(cfg, ("cs", "en"), sha256=recorded)
