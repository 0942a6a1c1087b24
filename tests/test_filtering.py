"""Filter job: each filter on hand-computed examples, threshold logic, config validation, the Beam
job on DirectRunner and a real Dask cluster (every row exactly once, with its reasons), report."""
import hashlib
import json
import math
import os
import re
import sys
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from filtering import text_scores as ts
from filtering.config import load_config, parse_config
from common.steps import Rule, decide
from filtering.filters import FILTERS, PairBatch
from filtering.lm import estimate, write_arpa
from filtering.syntax import parse_bracketed, top_levels, tree_edit_distance
from paracorpus.schema import PARAPHRASE_SCHEMA
from tests.toydata import toy_paraphrases, write_generation_run
from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _batch(pairs, **columns):
    data = {"reference": [a for a, _ in pairs], "paraphrase": [b for _, b in pairs], **columns}
    return PairBatch(pa.table(data))


def _score(name, pairs, **params):
    return FILTERS[name](**params).score(_batch(pairs))


# ------------------------------------------------------------------ text-only filters

EDGE = [("", "a man ."), ("Hello", "hello"), ("a man sits .", "a man sits ."), ("a b c d", "a b x")]


def test_length_and_ratio_on_edge_cases():
    s = _score("length", EDGE)
    assert s["reference_length"].tolist() == [0, 1, 4, 4]
    assert s["paraphrase_length"].tolist() == [3, 1, 4, 3]
    r = _score("length_ratio", EDGE + [("", "")])["length_ratio"]
    assert r[0] == math.inf and r[1] == 1.0 and r[3] == pytest.approx(4 / 3) and r[4] == 1.0


def test_ngram_overlap_by_hand():
    s = _score("ngram_overlap", EDGE)
    # empty side: nothing to share; one token each ("hello"): unigram 1, no bigram or trigram
    assert [s["unigram_overlap"][0], s["bigram_overlap"][0], s["trigram_overlap"][0]] == [0, 0, 0]
    assert [s["unigram_overlap"][1], s["bigram_overlap"][1], s["trigram_overlap"][1]] == [1, 0, 0]
    assert [s["unigram_overlap"][2], s["bigram_overlap"][2], s["trigram_overlap"][2]] == [1, 1, 1]   # identical
    # "a b c d" vs "a b x": unigrams {a, b} of 3; bigram (a b) of 2; no shared trigram of 1
    assert s["unigram_overlap"][3] == pytest.approx(2 / 3) and s["bigram_overlap"][3] == pytest.approx(1 / 2)
    assert s["trigram_overlap"][3] == 0
    assert ts.ngram_overlap(["a", "a", "b"], ["a", "b", "b"], 1) == pytest.approx(2 / 3)    # clipped counts
    with pytest.raises(ValueError, match="orders"):
        FILTERS["ngram_overlap"](n=[5])


def test_sentence_bleu_plus_one_by_hand():
    hyp, ref = "a man sits in the park .".split(), "a man is sitting in the park .".split()
    from collections import Counter

    def grams(t, n):
        return Counter(tuple(t[i:i + n]) for i in range(len(t) - n + 1))
    logp = sum(math.log((sum((grams(hyp, n) & grams(ref, n)).values()) + 1) / (len(hyp) - n + 1 + 1))
               for n in range(1, 5))
    expect = math.exp(min(0.0, 1 - (len(ref) + 1) / len(hyp)) + logp / 4)
    assert ts.sentence_bleu(hyp, ref) == pytest.approx(expect)
    s = _score("bleu", EDGE)
    assert s["sentence_bleu"][0] == 0.0 and s["one_minus_bleu"][0] == 1.0          # empty reference side
    # identical 4-token sides: every smoothed precision is 1; the +1 reference length costs exp(1 - 5/4)
    assert s["sentence_bleu"][2] == pytest.approx(math.exp(1 - 5 / 4))
    assert s["sentence_bleu"][1] == pytest.approx(math.exp(1 - 2 / 1 + math.log(2 / 2)))  # one token, equal
    assert np.allclose(s["sentence_bleu"] + s["one_minus_bleu"], 1.0)


def test_bag_of_pieces_by_hand_and_with_a_sentencepiece_model(tmp_path):
    assert ts.bag_of_pieces_similarity(["▁A", "▁man", ","], ["▁a", "▁guy", "."]) == pytest.approx(1 / 3)
    assert ts.bag_of_pieces_similarity([",", "."], ["!"]) == 0.0                      # only punctuation
    assert ts.bag_of_pieces_similarity(["▁x"], ["▁X"]) == 1.0
    from common.text import train_spm

    spm_path = train_spm([s for p in toy_paraphrases(300, seed=2) for s in p], str(tmp_path / "spm"), 60)
    f = FILTERS["bag_of_pieces"](spm_model=spm_path)
    f.setup()
    s = f.score(_batch([("A man sits .", "a man sits !"), ("A man sits .", "The dog runs."), ("", "")]))
    assert s["pieces_iou"][0] == 1.0 and s["pieces_iou"][1] < 0.5 and s["pieces_iou"][2] == 0.0


def test_translation_cost_passes_the_column_and_null_never_rejects():
    b = _batch([("a", "b"), ("c", "d"), ("e", "f")], forward_nll=pa.array([1.5, None, 4.0], pa.float32()))
    v = FILTERS["translation_cost"]().score(b)["translation_cost"]
    assert v[0] == 1.5 and math.isnan(v[1]) and v[2] == 4.0
    keep, reasons = decide({"translation_cost": v}, [Rule("translation_cost", "low", None, 3.5)], 3)
    assert keep.tolist() == [True, True, False] and reasons[2] == ["translation_cost>max"]


# ------------------------------------------------------------------ model-based filters

def test_kneser_ney_arpa_is_normalised_and_kenlm_prefers_fluent_text(tmp_path):
    import kenlm

    sents = [ts.tokenize(a) for a, _ in toy_paraphrases(800, seed=5)]
    model = estimate(sents, 3)

    def lp(g):
        if g in model[len(g)]:
            return model[len(g)][g][0]
        if len(g) == 1:
            return model[1][("<unk>",)][0]
        return (model[len(g) - 1].get(g[:-1], (0, None))[1] or 0.0) + lp(g[1:])

    vocab = [g[0] for g in model[1] if g[0] != "<s>"]
    for ctx in [("<s>",), ("a", "man"), ("the",), ("never", "seen")]:
        assert sum(10 ** lp(ctx + (w,)) for w in vocab) == pytest.approx(1.0, abs=1e-6)
    path = write_arpa(sents, str(tmp_path / "lm.arpa"), 3)
    lm = kenlm.Model(path)
    assert lm.order == 3
    fluent, scrambled = "a man is sitting in the park .", "park the man in . sitting a is"
    assert lm.perplexity(fluent) * 10 < lm.perplexity(scrambled)
    f = FILTERS["lm_perplexity"](model=path)
    f.setup()
    v = f.score(_batch([("x", fluent), ("x", scrambled), ("x", "")]))["lm_perplexity"]
    assert v[0] < v[1] and np.isfinite(v).all()
    with pytest.raises(ValueError):
        estimate([], 3)


def test_lm_filter_fits_on_the_sample(tmp_path):
    f = FILTERS["lm_perplexity"]()
    assert f.needs_fit()
    sample = pa.table({"reference": [a for a, _ in toy_paraphrases(200, seed=1)], "paraphrase": ["x"] * 200})
    updates = f.fit(sample, str(tmp_path), log=lambda m: None)
    assert os.path.isfile(updates["model"])
    fitted = FILTERS["lm_perplexity"](**updates)
    fitted.setup()
    fluent = [a for a, _ in toy_paraphrases(20, seed=9)]
    scrambled = [" ".join(sorted(a.split(), key=lambda w: (len(w), w))) for a in fluent]
    ppl = fitted.score(_batch(list(zip(fluent, fluent))))["lm_perplexity"]
    ppl_scrambled = fitted.score(_batch(list(zip(fluent, scrambled))))["lm_perplexity"]
    assert np.median(ppl) < np.median(ppl_scrambled)          # fitted on the references' word order


@pytest.mark.slow
def test_reference_classifier_learns_a_separable_signal(tmp_path):
    from filtering.classifier import load_classifier, train_classifier

    refs = [a for a, _ in toy_paraphrases(600, seed=1)]
    # "machine output" with a tell-tale word choice: "one" for the article
    trans = [re.sub(r"\b[Aa]n? ", "one ", b) for _, b in toy_paraphrases(600, seed=2)]
    acc = train_classifier(refs, trans, "word", str(tmp_path / "clf"), epochs=4, dim=32)
    assert acc > 0.9
    clf = load_classifier(str(tmp_path / "clf"))
    p = clf.p_reference(refs[:50] + trans[:50])
    assert p[:50].mean() > 0.5 > p[50:].mean()
    assert np.mean(p[:50, None] > p[None, 50:]) > 0.95                 # references rank above translations
    f = FILTERS["classifier"](variants=["word"], models={"word": str(tmp_path / "clf")})
    assert not f.needs_fit()
    f.setup()
    assert np.allclose(f.score(_batch([("r", refs[0])]))["p_reference_word"], clf.p_reference([refs[0]]))


@pytest.mark.slow
def test_classifier_accuracy_is_balanced_so_no_signal_scores_near_chance(tmp_path):
    from filtering.classifier import train_classifier

    # Same distribution for both classes, five translations per reference: plain accuracy of
    # "always translation" would be 0.83; the balanced figure must stay near 0.5.
    sents = [a for a, _ in toy_paraphrases(1200, seed=7)]
    acc = train_classifier(sents[:200], sents[200:1200], "word", str(tmp_path / "clf"), epochs=3, dim=16)
    assert acc < 0.7


def test_paraphrase_score_is_the_encoder_cosine(tmp_path):
    from embeddings.train import TrainConfig, train
    from models.sentence.sentence_encoder import load_encoder

    train(toy_paraphrases(300, seed=1), str(tmp_path / "enc"), TrainConfig(dim=16, epochs=1, progress=False),
          log=lambda m: None)
    f = FILTERS["paraphrase_score"](model=str(tmp_path / "enc"))
    f.setup()
    pairs = [("A man sits .", "A man sits ."), ("A man sits .", "A dog runs on the beach ."), ("", "x")]
    v = f.score(_batch(pairs))["paraphrase_score"]
    assert v[0] == pytest.approx(1.0) and v[0] <= 1.0 and v[1] < v[0]
    enc = load_encoder(str(tmp_path / "enc"))
    a, b = enc.encode(["A man sits ."]), enc.encode(["A dog runs on the beach ."])
    assert v[1] == pytest.approx(float((a[0] @ b[0]) / np.linalg.norm(a[0]) / np.linalg.norm(b[0])), abs=1e-5)
    with pytest.raises(ValueError, match="needs model"):
        FILTERS["paraphrase_score"]()


def test_tree_edit_distance_on_hand_made_trees():
    a = parse_bracketed("(S (NP a man.n) (VP is.v (VP riding.v (NP a bike.n))) .)")
    assert a[0] == "S" and a[1][0] == ("NP", (("a", ()), ("man.n", ())))
    assert top_levels(a, 1) == ("S", ())
    assert top_levels(a, 2) == ("S", (("NP", ()), ("VP", ())))                      # words dropped
    assert top_levels(a, 3) == ("S", (("NP", ()), ("VP", (("VP", ()),))))
    b = parse_bracketed("(S (PP on (NP the street.n)) (NP a man.n) (VP rides.v))")
    assert tree_edit_distance(top_levels(a, 3), top_levels(a, 3)) == 0
    # a: S(NP, VP(VP)); b: S(PP(NP), NP, VP): insert PP and its NP, delete the inner VP -> 3
    assert tree_edit_distance(top_levels(a, 3), top_levels(b, 3)) == 3
    assert tree_edit_distance(top_levels(a, 2), top_levels(b, 2)) == 1                # insert PP
    assert tree_edit_distance(("S", ()), ("X", ())) == 1                               # rename
    with pytest.raises((ValueError, IndexError)):
        parse_bracketed("(S (NP a) extra")


def test_tree_edit_filter_with_link_grammar():
    try:
        f = FILTERS["tree_edit"]()
        f.setup()
    except ImportError as e:
        pytest.skip(f"link-grammar not installed ({e}); scripts/install_parser.sh installs it")
    v = f.score(_batch([("A man is riding a bike .", "A man is riding a bike ."),
                        ("A man is riding a bike .", "On the street , a bike is ridden by a man ."),
                        ("", "A man .")]))["tree_edit_distance"]
    assert v[0] == 0 and v[1] > 0 and math.isnan(v[2])                               # empty: no parse
    # A typical ungrammatical back-translation still gets a (robust, null-link) parse.
    w = f.score(_batch([("Two young men are outside.", "Two young men are outside a lot of store.")]))
    assert not math.isnan(w["tree_edit_distance"][0])


# ------------------------------------------------------------------ decisions and config

def test_decide_applies_bounds_and_names_the_rules():
    scores = {"s": np.array([0.1, 0.5, 0.9, np.nan]), "t": np.array([1.0, 5.0, 2.0, 9.0])}
    rules = [Rule("s", "between", 0.4, 0.8), Rule("t", "low", None, 4.0)]
    keep, reasons = decide(scores, rules, 4)
    assert keep.tolist() == [False, False, False, False]
    assert reasons == [["s<min"], ["t>max"], ["s>max"], ["t>max"]]                  # NaN s passes
    keep, reasons = decide(scores, [Rule("s", "high", 0.5, None)], 4)
    assert keep.tolist() == [False, True, True, True] and reasons[0] == ["s<min"]
    assert decide(scores, [], 4)[0].all()                                             # no rules: keep all


def test_presets_load_and_match_the_papers():
    cfg = load_config("paranmt", {"paraphrase_score": {"model": "some/encoder"}})
    rules = {r.score: (r.min, r.max) for r in cfg.rules}
    assert rules["paraphrase_score"] == (0.4, 1.0) and rules["trigram_overlap"] == (None, 0.7)
    assert rules["reference_length"] == (None, 30) and rules["paraphrase_length"] == (None, 30)
    cfg = load_config("wieting2017")
    assert {f.NAME for f in cfg.filters} >= {"length", "lm_perplexity", "classifier", "translation_cost"}
    assert {r.score: (r.min, r.max) for r in cfg.rules}["paraphrase_length"] == (0, 10)


@pytest.mark.parametrize("raw,message", [
    ({"filters": [{"name": "lenght"}]}, "unknown filter 'lenght'"),
    ({"filters": [{"name": "length", "thresholds": {"reference_length": {"max": "thirty"}}}]}, "must be a number"),
    ({"filters": [{"name": "length", "thresholds": {"reference_length": {"min": 5, "max": 2}}}]}, "above max"),
    ({"filters": [{"name": "length", "thresholds": {"ref_len": {"max": 3}}}]}, "has no score 'ref_len'"),
    ({"filters": [{"name": "translation_cost", "thresholds": {"translation_cost": {"min": 1}}}]}, "only max"),
    ({"filters": [{"name": "classifier", "variants": ["svm"]}]}, "variants"),
    ({"filters": [{"name": "length", "colour": "red"}]}, "unknown parameter"),
    ({"filters": []}, "non-empty"),
    ({"filters": [{"name": "length"}, {"name": "length"}]}, "twice"),
    ({"filters": [{"name": "length"}], "fit_sample": "lots"}, "fit_sample"),
])
def test_bad_configs_fail_clearly(raw, message):
    with pytest.raises(ValueError, match=message):
        parse_config(raw, "test.yaml")


# ------------------------------------------------------------------ the job

CONFIG = """
filters:
  - name: length
    thresholds: {reference_length: {max: 30}, paraphrase_length: {max: 9}}
  - name: ngram_overlap
    thresholds: {trigram_overlap: {max: 0.7}}
  - name: bleu
  - name: translation_cost
    thresholds: {translation_cost: {max: 2.5}}
  - name: lm_perplexity
  - name: classifier
    variants: [word]
    epochs: 1
    dim: 16
  - name: paraphrase_score
    thresholds: {paraphrase_score: {min: 0.4, max: 1.0}}
fit_sample: 200
"""


@pytest.fixture(scope="module")
def generation_output(tmp_path_factory):
    """A generation-job output (contract schema, Hive layout, 3 shards) plus an encoder."""
    from embeddings.train import TrainConfig, train

    root = tmp_path_factory.mktemp("gen")
    rows = []
    for i, (a, b) in enumerate(toy_paraphrases(900, seed=3)):
        row = {f.name: None for f in PARAPHRASE_SCHEMA}
        row.update(pair_id=hashlib.sha1(str(i // 3).encode()).hexdigest()[:16], reference=a, paraphrase=b,
                   rank=1 + i % 3, forward_nll=None if i % 50 == 0 else 1.0 + (i % 7) / 3, constraint_set=[],
                   src_lang="cs", tgt_lang="en", mode="sample")
        rows.append(row)
    rows[5]["paraphrase"] = ""                                       # hostile rows are scored, not lost
    rows[6]["paraphrase"] = "x" * 5000
    write_generation_run(root, rows, shards=3)
    train(toy_paraphrases(500, seed=1), str(root / "enc"), TrainConfig(dim=16, epochs=1, progress=False),
          log=lambda m: None)
    (root / "cfg.yaml").write_text(CONFIG)
    return root, rows


def _run(gen, out, *extra):
    from beam_pipelines.filter import run

    root, _ = gen
    return run(["--input", str(root), "--output", str(out), "--config", str(root / "cfg.yaml"),
                "--encoder", str(root / "enc"), *extra])


def _scored(out):
    """The scored rows the filter run's manifest lists."""
    from common import storage
    from paracorpus.commit import committed_files

    return storage.parquet_dataset(committed_files(str(out), "scored", "_filter_manifest.json")).to_table()


@pytest.fixture(scope="module")
def direct_filter_run(generation_output, tmp_path_factory):
    out = tmp_path_factory.mktemp("filtered")
    manifest = _run(generation_output, out, "--runner", "DirectRunner")
    return out, manifest


@pytest.mark.slow
def test_every_row_once_with_its_reasons(generation_output, direct_filter_run):
    _, rows = generation_output
    out, manifest = direct_filter_run
    t = _scored(out)
    assert t.num_rows == len(rows) == manifest["rows_in"] == manifest["rows_out"] and manifest["reconciled"]
    assert manifest["input_config_hash"] == "toy"                                    # read from _manifest.json
    got = sorted((r["pair_id"], r["rank"]) for r in t.select(["pair_id", "rank"]).to_pylist())
    assert got == sorted((r["pair_id"], r["rank"]) for r in rows)                    # exactly once each
    assert set(PARAPHRASE_SCHEMA.names) <= set(t.column_names)                       # every input column kept
    cfg = load_config(str(generation_output[0] / "cfg.yaml"), {"paraphrase_score": {"model": "x"}})
    for name in cfg.score_columns + ["keep", "reasons", "fit_sample"]:
        assert name in t.column_names
    kept = 0
    for r in t.to_pylist():
        expect = []
        for rule in cfg.rules:
            v = r[rule.score]
            if v is not None and rule.min is not None and v < rule.min:
                expect.append(f"{rule.score}<min")
            if v is not None and rule.max is not None and v > rule.max:
                expect.append(f"{rule.score}>max")
        assert r["reasons"] == expect and r["keep"] == (not expect)
        kept += r["keep"]
    assert 0 < kept < len(rows) and kept == manifest["kept"]
    assert sum(t.column("fit_sample").to_pylist()) > 0
    assert manifest["rejected_by_reason"] == dict(sorted(Counter(
        reason for rs in t.column("reasons").to_pylist() for reason in rs).items()))
    assert manifest["rejected_by_reason"]["translation_cost>max"] > 0
    nulls = {c: t.column(c).null_count for c in cfg.score_columns}
    assert manifest["unscored_by_score"] == {c: n for c, n in sorted(nulls.items()) if n}
    assert manifest["unscored_by_score"]["translation_cost"] == sum(r["forward_nll"] is None for r in rows) > 0


@pytest.mark.slow
def test_report_is_written(direct_filter_run):
    out, manifest = direct_filter_run
    listed = {e["path"] for e in manifest["files"]["report"]}        # under the run's own name
    report_dir = os.path.join(out, "report", manifest["run_id"])
    assert {f"report/{manifest['run_id']}/{n}" for n in os.listdir(report_dir)} == listed
    assert sorted(os.listdir(os.path.join(out, "report"))) == [manifest["run_id"]]
    report = json.load(open(os.path.join(report_dir, "report.json")))
    assert report["rows"] == manifest["rows_in"] and report["kept"] == manifest["kept"]
    assert set(report["diversity_by_rank"]) == {"1", "2", "3"}
    for side in ("references", "paraphrases"):
        s = report["text"][side]
        assert 0 < s["unigram_entropy"] < s["trigram_entropy"] and s["average_idf"] > 0
    assert set(report["plots"]) == {f"hist_{c}.png" for c in report["scores"]} | {"lengths.png"}
    assert "translation_cost" in report["scores"] and "lm_perplexity" in report["scores"]
    for plot in report["plots"]:
        assert open(os.path.join(report_dir, plot), "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    md = open(os.path.join(report_dir, "report.md")).read()
    assert "Rejections by reason" in md and "translation_cost>max" in md and "Diversity by rank" in md


@pytest.mark.slow
def test_dask_cluster_gives_the_same_rows(generation_output, direct_filter_run, dask_cluster, tmp_path):
    out, _ = direct_filter_run
    manifest = _run(generation_output, tmp_path / "dask", "--runner", "DaskRunner", "--dask_client_address",
                    dask_cluster, "--no_report")
    assert manifest["reconciled"]
    # its counters from what the workers wrote, as on the DirectRunner (Dask's runner reports no metrics)
    direct = direct_filter_run[1]
    assert manifest["counters"] == direct["counters"] and manifest["counters"]["rows"] == manifest["rows_out"]
    assert sum(v for k, v in manifest["counters"].items() if k.startswith("rejected_")) > 0
    cols = ["pair_id", "rank", "keep", "reasons", "trigram_overlap", "paraphrase_score", "lm_perplexity"]

    def rows(path):
        return sorted(_scored(path).select(cols).to_pylist(), key=lambda r: (r["pair_id"], r["rank"]))
    a, b = rows(tmp_path / "dask"), rows(out)
    assert [(r["pair_id"], r["rank"], r["keep"], r["reasons"]) for r in a] == \
           [(r["pair_id"], r["rank"], r["keep"], r["reasons"]) for r in b]
    for c in ("trigram_overlap", "paraphrase_score", "lm_perplexity"):
        va = np.array([np.nan if r[c] is None else r[c] for r in a], dtype=float)
        vb = np.array([np.nan if r[c] is None else r[c] for r in b], dtype=float)
        assert np.allclose(va, vb, atol=1e-6, equal_nan=True), c


@pytest.mark.slow
def test_cli_fails_before_work_on_bad_config(generation_output, tmp_path):
    root, _ = generation_output
    bad = tmp_path / "bad.yaml"
    bad.write_text("filters:\n  - name: lenght\n")
    out = tmp_path / "out"
    r = warm_python.run([sys.executable, "-m", "beam_pipelines.filter", "--input", str(root), "--output", str(out),
                         "--config", str(bad)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown filter 'lenght'" in r.stderr and not out.exists()
    bad.write_text("filters:\n  - name: length\n    thresholds: {paraphrase_length: {max: -}}\n")
    r = warm_python.run([sys.executable, "-m", "beam_pipelines.filter", "--input", str(root), "--output", str(out),
                         "--config", str(bad)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "must be a number" in r.stderr and not out.exists()
    r = warm_python.run([sys.executable, "-m", "beam_pipelines.filter", "--help"], cwd=ROOT, capture_output=True,
                        text=True, timeout=120)
    assert r.returncode == 0 and "--config" in r.stdout and "paranmt" in r.stdout


@pytest.mark.slow
def test_unreconciled_generation_run_is_refused(generation_output, tmp_path):
    import shutil

    from beam_pipelines.filter import run

    from common.cli import UsageError
    from tests.toydata import write_generation_run

    gen = write_generation_run(tmp_path / "gen", generation_output[1], reconciled=False)
    args = ["--input", os.path.join(gen, "paraphrases"), "--output", str(tmp_path / "out"), "--config", "paranmt",
            "--no_report"]
    with pytest.raises(UsageError, match="do not reconcile"):
        run(args)
    assert not (tmp_path / "out").exists()
    os.remove(os.path.join(gen, "_manifest.json"))       # a run without its manifest: refused
    with pytest.raises(UsageError, match="without its manifest"):
        run(["--input", gen] + args[2:])
    plain = tmp_path / "plain"                           # Parquet of one's own: warned, then filtered
    shutil.copytree(os.path.join(gen, "paraphrases"), plain)
    manifest = run(["--input", str(plain)] + args[2:-3] + ["--config", str(generation_output[0] / "cfg.yaml"),
                                                          "--encoder", str(generation_output[0] / "enc"), "--no_report"])
    assert manifest["reconciled"] and manifest["input_config_hash"] is None and manifest["rows_in"] == 900


def test_threshold_tuning_from_keep_rate_and_dev_set():
    from filtering.tune import threshold_for_keep_rate, threshold_from_dev

    v = np.arange(100, dtype=float)
    lo = threshold_for_keep_rate(v, "high", 0.25)
    assert np.mean(v >= lo) == pytest.approx(0.25, abs=0.01)
    hi = threshold_for_keep_rate(np.append(v, np.nan), "low", 0.6)
    assert np.mean(v <= hi) == pytest.approx(0.6, abs=0.01)
    scores = [0.1, 0.2, 0.35, 0.5, 0.6, 0.9]
    labels = [0, 0, 0, 1, 1, 1]
    bound, acc = threshold_from_dev(scores, labels, "high")
    assert 0.35 < bound < 0.5 and acc == 1.0
    bound, acc = threshold_from_dev([1.0, 2.0, 3.0, 4.0], [1, 1, 0, 1], "low")
    assert 2.0 < bound and acc == 0.75
    with pytest.raises(ValueError):
        threshold_from_dev([0.1, 0.2], [1, 1], "high")
    with pytest.raises(ValueError):
        threshold_for_keep_rate(v, "between", 0.5)


def test_dev_set_reader_counts_bad_lines_and_refuses_an_empty_set(tmp_path, capsys):
    from filtering.tune import _dev_scores

    (tmp_path / "cfg.yaml").write_text("filters:\n  - name: ngram_overlap\n")
    dev = tmp_path / "dev.tsv"
    dev.write_text("1\ta man sits\ta man sits\n0\ta dog\tthe cat ran\nbad line\n2\tx\ty\n"
                   + "1\t" + "w " * 6000 + "\tz\n", encoding="utf-8")
    scores, labels = _dev_scores(str(dev), str(tmp_path / "cfg.yaml"), "trigram_overlap", {})
    assert labels == [1, 0] and scores[0] == 1.0 and scores[1] == 0.0
    assert "skipped 3 line(s)" in capsys.readouterr().err
    dev.write_text("no\ttabs here\n")
    with pytest.raises(ValueError, match="no usable dev line"):
        _dev_scores(str(dev), str(tmp_path / "cfg.yaml"), "trigram_overlap", {})


@pytest.mark.slow
def test_tune_cli_on_a_filter_run(direct_filter_run):
    out, _ = direct_filter_run
    r = warm_python.run([sys.executable, "-m", "filtering.tune", "--scored", os.path.join(out, "scored"),
                         "--score", "trigram_overlap", "--direction", "low", "--keep_rate", "0.5"],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "trigram_overlap: max" in r.stdout and "thresholds: {trigram_overlap: {max:" in r.stdout


# ------------------------------------------------------------------ vectorised token-level scores

HOSTILE = ["", " ", "x", "A", ".", "'", "''", "'a", "a'", "a'b'c", "a''b", "don't", "Don't STOP", "''quoted''",
           "rock 'n' roll", "it's the dog's", "l'homme", "don’t", "it’s ’quoted’", "Ďáblova žena",
           "ĎÁBLOVA ŽENA", "naïve café", "NAÏVE CAFÉ", "ﬁne ﬂower", "Ⅻ ½ x²", "İstanbul", "ΟΔΟΣ ΣΑΣ",
           "straße STRASSE", "tab\there", "null\x00byte", "bell\x07 esc\x1b[0m", "del\x7fc1\x85\x9f",
           "line\nbreak\r\n", "\x0b\x0c\x1c\x1d\x1e\x1f", "nbsp\u00a0here", "zero\u200bwidth",
           "emoji 😀 🎉!", "👍🏽👍", "中文句子。", "日本語のテキスト、です", "한국어 문장", "مرحبا بالعالم",
           "under_score snake_case __x__", "123 4.5 6,7 -8", "a-b a/b a\\b", "$%^&*()[]{}<>|~`",
           " ".join(["word"] * 300), " ".join(f"w{i}" for i in range(300)), "x" * 6000,
           ("ab " * 3000) + "tail", "a" * 4999 + " b", "a" * 5001, "é" * 4999 + "a b"]


def _vector_pairs():
    """Toy paraphrases, every ordered pair of hostile strings, random ASCII noise and mixed rows."""
    import random

    rng = random.Random(7)
    pairs = list(toy_paraphrases(1500, seed=11))
    pairs += [(a, b) for a in HOSTILE[::3] for b in HOSTILE[1::2]]
    pairs += [(s, s) for s in HOSTILE]                                     # identical sides
    pairs += [(s, "") for s in HOSTILE] + [("", s) for s in HOSTILE]
    alphabet = "aAbB zZ09_'’.,!?-\"'\t\n\x00\x1f\x7f"
    for _ in range(800):
        pairs.append(tuple("".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40))) for _ in range(2)))
    words = "a the man dog is sitting . , ' don't x y ’ café Ďábel 😀 中".split()
    for _ in range(800):
        pairs.append(tuple(" ".join(rng.choice(words) for _ in range(rng.randrange(0, 25))) for _ in range(2)))
    return pairs


def test_vectorised_tokens_equal_tokenize():
    from common.text import tokenize

    pairs = _vector_pairs()
    assert len(pairs) > 3000
    ref, para = ts.tokenize_columns(pa.array([a for a, _ in pairs]), pa.array([b for _, b in pairs]))
    assert ref.token_lists() == [tokenize(a) for a, _ in pairs]
    assert para.token_lists() == [tokenize(b) for _, b in pairs]
    assert (ref.lengths <= 100).all() and ref.ids.dtype == np.int32
    # chunked columns with nulls, string and large_string, a RecordBatch, a sliced array
    chunks = pa.chunked_array([pa.array(["A man .", None, "don't"]), pa.array([None, "Ďáblova žena"], pa.string())])
    other = pa.array(["x", "y", None, "zz", "’s"], pa.large_string())
    b = PairBatch(pa.table({"reference": chunks, "paraphrase": other}))
    assert b.ref_tokens == [tokenize(s or "") for s in chunks.to_pylist()]
    assert b.para_tokens == [tokenize(s or "") for s in other.to_pylist()]
    assert b.reference[1] == "" and len(b) == 5
    rb = pa.RecordBatch.from_pydict({"reference": ["A b", "c"], "paraphrase": ["d", "E f g"]})
    assert PairBatch(rb).para_lengths.tolist() == [1, 3]
    sliced = pa.array(["skip", "A'b c", "d’e", "tail"]).slice(1, 2)
    (col,) = ts.tokenize_columns(sliced)
    assert col.token_lists() == [["a'b", "c"], tokenize("d’e")]
    empty = ts.tokenize_columns(pa.array([], pa.string()), pa.array([], pa.string()))
    assert [len(c) for c in empty] == [0, 0]
    assert ts.ngram_match_counts(*empty, 4)[3].shape == (0,)


def _reference_scores(pairs):
    from common.text import tokenize

    rt, pt = [tokenize(a) for a, _ in pairs], [tokenize(b) for _, b in pairs]
    out = {"reference_length": [len(t) for t in rt], "paraphrase_length": [len(t) for t in pt]}
    ratio = []
    for a, b in zip(rt, pt):
        lo, hi = sorted((len(a), len(b)))
        ratio.append(hi / lo if lo else (math.inf if hi else 1.0))
    out["length_ratio"] = ratio
    for k, name in ((1, "unigram"), (2, "bigram"), (3, "trigram"), (4, "fourgram")):
        out[f"{name}_overlap"] = [ts.ngram_overlap(a, b, k) for a, b in zip(rt, pt)]
    out["sentence_bleu"] = [ts.sentence_bleu(b, a) for a, b in zip(rt, pt)]
    out["one_minus_bleu"] = [1.0 - v for v in out["sentence_bleu"]]
    return {k: np.array(v, dtype=np.float64) for k, v in out.items()}


def test_vectorised_scores_equal_the_per_pair_functions():
    pairs = _vector_pairs()
    expect = _reference_scores(pairs)
    batch = _batch(pairs)
    got = {}
    for f in (FILTERS["length"](), FILTERS["length_ratio"](), FILTERS["ngram_overlap"](n=[1, 2, 3, 4]),
              FILTERS["bleu"]()):
        got.update(f.score(batch))
    assert set(got) == set(expect)
    for name, v in expect.items():
        assert got[name].shape == v.shape and got[name].dtype == np.float64, name
        assert np.allclose(got[name], v, rtol=0, atol=1e-9), name
        assert (np.isinf(got[name]) == np.isinf(v)).all(), name
    # the overlap filter alone with some orders; BLEU on a fresh batch (its own n-gram pass)
    s = FILTERS["ngram_overlap"](n=[3, 1]).score(_batch(pairs))
    assert np.allclose(s["trigram_overlap"], expect["trigram_overlap"], rtol=0, atol=1e-9)
    assert np.allclose(s["unigram_overlap"], expect["unigram_overlap"], rtol=0, atol=1e-9)
    s = FILTERS["bleu"]().score(_batch(pairs))
    assert np.allclose(s["sentence_bleu"], expect["sentence_bleu"], rtol=0, atol=1e-9)


def test_ngram_match_counts_for_every_key_layout():
    """Keys with global ids, with ids renumbered within rows (a large vocabulary), and the sort per
    order (fields too wide for one int64) all give the per-pair clipped counts."""
    pairs = _vector_pairs()[:1500] + [("a a a b", "a a b b"), ("the " * 50, "the " * 20), ("b a b a", "a b a b")]
    ref, para = ts.tokenize_columns(pa.array([a for a, _ in pairs]), pa.array([b for _, b in pairs]))
    rt, pt = ref.token_lists(), para.token_lists()
    expect = [np.array([sum((ts.ngrams(a, n) & ts.ngrams(b, n)).values()) for a, b in zip(rt, pt)])
              for n in (1, 2, 3, 4)]
    big = pa.array([str(i) for i in range(1 << 21)])              # 22-bit ids: 4 fields do not fit
    wide = (ts.TokenColumn(ref.ids, ref.offsets, big), ts.TokenColumn(para.ids, para.offsets, big))
    for got in (ts.ngram_match_counts(ref, para, 4), ts.ngram_match_counts(*wide, 4),
                ts._ngram_match_counts_by_order(ref, para, 4), ts.ngram_match_counts(ref, para, 2) + [None, None]):
        for n in (1, 2, 3, 4):
            if got[n - 1] is not None:
                assert got[n - 1].tolist() == expect[n - 1].tolist(), n
    bleu = ts.sentence_bleu_batch(np.array([3, 0, 2]), np.array([3, 2, 0]),
                                  [np.array([3, 0, 0]), np.array([2, 0, 0]), np.array([1, 0, 0]), np.array([0, 0, 0])])
    assert bleu[0] == pytest.approx(ts.sentence_bleu(list("abc"), list("abc")), abs=1e-12)
    assert bleu[1:].tolist() == [0.0, 0.0]


@pytest.mark.slow
def test_fit_sample_is_sized_from_the_input_and_keeps_pairs_whole(generation_output):
    from beam_pipelines.filter import fit_sample
    from paracorpus.runs import open_input

    gen, rows = generation_output
    files = list(open_input(str(gen)).files)
    for want in (90, 300):
        sample = fit_sample(files, want)
        assert want / 3 <= sample.num_rows <= want          # about WANT rows, never more
        ids = sample.column("pair_id").to_pylist()
        assert ids == fit_sample(files, want).column("pair_id").to_pylist()     # deterministic
        per_pair = {i: sum(r["pair_id"] == i for r in rows) for i in set(ids)}
        whole = sum(ids.count(i) == n for i, n in per_pair.items())
        assert whole >= len(per_pair) - 1                  # only the last pair may be cut by the cap
