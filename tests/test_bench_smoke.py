"""Every script in bench/ runs at a tiny size and prints its table (issue 70): a benchmark that
nothing runs rots (bench_generation's dual-scoring section crashed for weeks after the engine's
score_batches changed). Each script runs as a user runs it, a process of its own, and so do the
jobs it measures (both forked from the warm interpreter of tests/warm_python.py, which has
imported what they import: PARAGEN_WARM_ZYGOTE), with the smallest arguments that still go
through its sections, except that the measurements it would run in fresh processes run in its
own (PARAGEN_BENCH_IN_PROCESS=1: a process start costs 2-5 s of imports, and the fresh-process
path has its own test); its figures mean nothing at this size and
are not checked, only that it finishes (exit 0) and prints what its docs/benchmarks.md table is
made of. The scripts that cannot run here are listed with the reason (NOT_HERE), and a script
added to bench/ without a smoke run fails test_every_bench_script_has_a_smoke_run.

Real data: the scripts read ../shared/data as documented (Multi30k, the divergence and STS sets);
where it is absent their runs are skipped with that reason."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests import warm_python
from tests.toydata import toy_bitext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
DATA = os.path.join(ROOT, "..", "shared", "data")
M30K = os.path.join(DATA, "bitext", "multi30k")

# script -> (arguments, a line of what it prints). $MODELS: the tiny cs-en/en-cs models; $WORK: a
# folder of the test; $DATA, $M30K: ../shared/data, its Multi30k; $GEN: a generation run of the
# tiny models; $ENCODER: an embedding job's encoder of that run; $BITEXT_MODELS: a tiny cs-en
# bilingual encoder and divergence detector (tests/bitext_models.py).
SMOKE = {
    "bench_alignment.py": (["--data", "$DATA/divergence", "--pairs", "800", "--aligners", "fast_align"],
                           "| fast_align | grow-diag-final-and |"),
    "bench_bitext.py": (["--data", "$DATA", "--encoders", "$BITEXT_MODELS/enc-{lang}", "--mlp_pairs", "40",
                         "--eval", "$WORK/eval", "--train", "$WORK/train", "--pairs", "20", "--filter_lang", "cs",
                         "--nmt", "$MODELS", "--divergence", "$BITEXT_MODELS/div"],
                        "| bitext filter |"),
    "bench_cluster.py": (["--models", "$MODELS", "--bitext", "$M30K/train", "--pairs", "16", "--skip",
                          "scale,memory,bucket"], "resume / whole"),
    "bench_clustering.py": (["--sources", "5", "--candidates", "10", "--repeats", "1"], "ms/source"),
    "bench_constrained.py": (["--model", "$MODELS/cs-en", "--bitext", "$M30K", "--sources", "4", "--rounds", "1"],
                             "|---"),
    "bench_crash_points.py": (["--models", "$MODELS", "--pairs", "8", "--cases", "generate:local:same:KILL",
                               "--points", "1"], "| generate | local | same |"),
    "bench_divergence.py": (["--data", "$DATA/divergence", "--max_pairs", "300", "--epochs", "1", "--folds", "2",
                             "--repeats", "1", "--speed_pairs", "100", "--bootstrap", "10", "--members", "1",
                             "--save", "$WORK/div"], "|---"),
    "bench_embeddings.py": (["--paraphrases", "$GEN", "--bitext", "$M30K", "--raw_lines", "40", "--sts", "$DATA/sts",
                             "--epochs", "1", "--dim", "16", "--megabatches", "1"], "|---"),
    "bench_faults.py": (["--models", "$MODELS", "--pairs", "40", "--unit_pairs", "4", "--only", "sigterm"],
                        "| SIGTERM of the driver"),
    "bench_filter.py": (["--input", "$GEN", "--encoder", "$ENCODER", "--repeat", "1"], "rows/s"),
    "bench_generation.py": (["--models", "$MODELS", "--bitext", "$M30K/val", "--sources", "4", "--samples", "3",
                             "--rounds", "1", "--pairs", "8", "--score_pairs", "20", "--skip", "workers,overhead"],
                            "## Dual scoring"),
    "bench_gpu.py": (["--forward_model", "$MODELS/cs-en", "--backward_model", "$MODELS/en-cs", "--bitext", "$M30K",
                      "--pairs", "16", "--sources", "4", "--unit_pairs", "4", "--job_variants", "1:tree:fp32:off",
                      "--step_modes", "tree,fixed", "--step_precisions", "fp32", "--out", "$WORK/gpu.json",
                      "--rehearse"], "|---"),
    "bench_mining.py": (["--n", "2000", "--d", "16", "--exact_queries", "100", "--threads", "1"], "|---"),
    "bench_models.py": (["--work", "$WORK/models", "--layers", "1", "--dim", "32", "--updates", "10", "--merges",
                         "200", "--train_lines", "300", "--sources", "4", "--sentences", "20", "--repeats", "1"],
                        "|---"),
    "bench_refresh.py": (["--bitext", "$M30K/train", "--models", "$MODELS", "--shards", "2", "--pairs_per_shard",
                          "8"], "|---"),
    "bench_runners.py": (["--models", "$MODELS", "--records", "16", "--skip", "flink"], "| Dask"),
    "bench_scale.py": (["--work", "$WORK/scale", "--models", "$MODELS", "--sizes", "20", "--units", "10",
                        "--unit_pairs", "2", "--parts", "memory,cost"], "## 2. Cost growth"),
    "bench_unreachable.py": (["--models", "$MODELS", "--budget", "3", "--stores", "refused,never_answers",
                              "--jobs", "generate"], "| s3, never answers | generate | 2 |"),
    "sample_digests.py": (["--forward_model", "$MODELS/cs-en", "--backward_model", "$MODELS/en-cs", "--bitext",
                           "$M30K", "--sources", "4"], "sample tree "),
}
# not run by the suite, and why
NOT_HERE = {
    "bench_slurm.py": "a real SLURM started as root; its runs take minutes (tests/test_slurm*.py run the same paths)",
    "bench_slurm_lifetime.py": "worker jobs that reach a SLURM time limit of whole minutes several times",
}
# run one after the other by the last test: each needs what the one before made
CHAINED = {"bench_models.py": "bench_engines.py", "bench_divergence.py": "bench_divergence_ensemble.py"}
HELPERS = {"fresh_process.py", "opusfilter_runner.py"}      # imported by the scripts, not run


def test_every_bench_script_has_a_smoke_run():
    scripts = {n for n in os.listdir(BENCH) if n.endswith(".py")} - HELPERS
    known = set(SMOKE) | set(NOT_HERE) | set(CHAINED.values())
    assert scripts == known, scripts ^ known


def _need_data(*names):
    for name in names:
        if not os.path.exists(os.path.join(DATA, name)):
            pytest.skip(f"{os.path.join(DATA, name)} is absent (../shared/data: the benchmarks' real data)")


def _run(script: str, args: list[str], marker: str, env: dict | None = None) -> str:
    # the script and the jobs it measures (bench/fresh_process.py's job_run/job_popen) forked from the
    # warm interpreter (tests/warm_python.py); a measurement's fresh process runs in the script's own
    env = {**os.environ, "PYTHONPATH": ROOT, "PARAGEN_BENCH_IN_PROCESS": "1",
           warm_python.ADDRESS_VARIABLE: warm_python.address(), **(env or {})}
    done = warm_python.run([sys.executable, os.path.join(BENCH, script), *args], cwd=ROOT, capture_output=True,
                           text=True, timeout=900, stdin=subprocess.DEVNULL, env=env)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert marker in done.stdout, done.stdout[-3000:]
    assert "bench error" not in done.stdout, done.stdout[-3000:]        # bench_faults.py's row of a failed scenario
    failed = re.findall(r"^## (\w+_error)$", done.stdout, re.M)         # bench_gpu.py's section that raised
    assert not failed, (failed, done.stdout[-3000:])
    return done.stdout


@pytest.fixture(scope="module")
def generated(tiny_nmt_models, tmp_path_factory):
    """{"gen": a generation run of the tiny models on 40 toy pairs, "encoder": an embedding job's
    word+trigram encoder trained on it}."""
    from beam_pipelines.generate import run as generate
    from embeddings.train import run as train_embeddings
    from tests.jobs import quick_args

    root = tmp_path_factory.mktemp("bench-smoke")
    bitext = root / "bitext.tsv"
    bitext.write_text("".join(f"{cs}\t{en}\n" for cs, en in toy_bitext(40, seed=5)), encoding="utf-8")
    gen = str(root / "gen")
    generate(quick_args(str(bitext), gen, tiny_nmt_models))
    enc = str(root / "enc")
    train_embeddings(["--input", gen, "--output", enc, "--encoder", "word+trigram", "--dim", "16", "--epochs", "1",
                      "--no_progress"])
    return {"gen": gen, "encoder": enc}


@pytest.fixture(scope="module")
def bitext_models(tmp_path_factory):
    from tests.bitext_models import build_bitext_models

    return build_bitext_models(str(tmp_path_factory.mktemp("bitext-models")))


def _expand(args, **places):
    out = []
    for a in args:
        for key in sorted(places, key=len, reverse=True):
            a = a.replace(f"${key}", places[key])
        out.append(a)
    return out


def _small_multi30k(work: str, lines: int = 60):
    """WORK/eval.{cs,en}.gz and WORK/train.{cs,en}.gz: the first LINES of Multi30k val and train."""
    import gzip

    for split, name in (("val", "eval"), ("train", "train")):
        for lang in ("cs", "en"):
            with gzip.open(os.path.join(M30K, f"{split}.{lang}.gz"), "rt", encoding="utf-8") as f:
                head = [next(f) for _ in range(lines)]
            with gzip.open(os.path.join(work, f"{name}.{lang}.gz"), "wt", encoding="utf-8") as f:
                f.writelines(head)


@pytest.mark.slow          # the tiny NMT models; each script is a process of its own
@pytest.mark.parametrize("script", sorted(set(SMOKE) - set(CHAINED)))
def test_a_bench_script_runs_at_smoke_size(script, tiny_nmt_models, tmp_path, request):
    args, marker = SMOKE[script]
    joined = " ".join(args)
    if "$DATA" in joined or "$M30K" in joined:
        _need_data("bitext/multi30k", *(["divergence"] if "divergence" in joined else []),
                   *(["sts"] if "$DATA/sts" in joined else []))
    places = {"MODELS": tiny_nmt_models, "WORK": str(tmp_path), "DATA": DATA, "M30K": M30K}
    if "$GEN" in joined or "$ENCODER" in joined:
        built = request.getfixturevalue("generated")
        places.update(GEN=built["gen"], ENCODER=built["encoder"])
    if "$BITEXT_MODELS" in joined:
        models = request.getfixturevalue("bitext_models")
        folder = os.path.dirname(models["encoder"])
        os.symlink(models["encoder"], os.path.join(folder, "enc-cs"))      # the {lang} of --encoders
        places["BITEXT_MODELS"] = folder
        _small_multi30k(str(tmp_path))
    _run(script, _expand(args, **places), marker)


@pytest.mark.slow
def test_the_engines_and_the_ensemble_scripts_on_what_their_first_step_made(tiny_nmt_models, tmp_path):
    """bench_engines.py on the folder bench_models.py prepared; bench_divergence_ensemble.py on
    the detector bench_divergence.py saved."""
    _need_data("bitext/multi30k", "divergence")
    models_args, _ = SMOKE["bench_models.py"]
    _run("bench_models.py", _expand(models_args, WORK=str(tmp_path), M30K=M30K, DATA=DATA), "|---")
    _run("bench_engines.py", ["--work", str(tmp_path / "models"), "--layers", "1", "--dim", "64", "--sources", "2",
                              "--repeats", "1", "--engines", "CTranslate2 int8"], "## 4. The whole job")
    div_args, _ = SMOKE["bench_divergence.py"]
    _run("bench_divergence.py", _expand(div_args, WORK=str(tmp_path), DATA=DATA), "|---")
    _run("bench_divergence_ensemble.py", [str(tmp_path / "div"), "--dev", os.path.join(DATA, "divergence",
                                                                                     "opensubs.dev.tsv")], "|")


def test_a_measurement_in_a_fresh_process_gives_what_it_gives_in_process(monkeypatch):
    """The smoke runs above take bench/fresh_process.py's in-process path; the fresh-process path
    that users' runs take is checked here, on a function whose result the seed fixes."""
    monkeypatch.syspath_prepend(BENCH)
    from fresh_process import in_fresh_process

    args = ("bench_clustering", "bench_clustering", 3, 20, 7)
    monkeypatch.delenv("PARAGEN_BENCH_IN_PROCESS", raising=False)
    fresh = in_fresh_process(*args)
    monkeypatch.setenv("PARAGEN_BENCH_IN_PROCESS", "1")
    here = in_fresh_process(*args)
    assert fresh.keys() == here.keys() and "ms_per_source" in fresh
    assert fresh["mean_distinct_candidates"] == here["mean_distinct_candidates"] > 1
