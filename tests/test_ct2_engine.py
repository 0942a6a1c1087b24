"""The CTranslate2 engine on fairseq models (converted by paragen-import-model --engine
ctranslate2, from the checked tensors): in float32 its beam outputs equal the fairseq engine's and
its scores are within 1e-3 of fairseq's forced decoding; in int8 within 0.3 nats; banned words
never appear in samples; a unit decoded again gives the same samples; paragen-translate works on
it; the generation job runs on it end to end (DirectRunner, a Dask cluster, and --resume after a
kill gives an uninterrupted run's rows); refusals are one line."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from models.nmt.engines.ct2_engine import CT2Engine
from models.nmt.engine import SampleRequest
from models.nmt.engines.loading import load_engine
from paracorpus.paraphrasing import violates
from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow          # models trained with fairseq-train, converted with CTranslate2


def _import(info, output, *extra):
    from models.nmt.importing import run

    args = [info["source"], "--src_lang", info["src_lang"], "--tgt_lang", info["tgt_lang"], "--output", output,
            "--engine", "ctranslate2", *extra]
    if info["data"]:
        args += ["--data", info["data"], "--bpe_codes", info["bpe_codes"]]
    if info["tokenizer"] == "moses":
        args += ["--tokenizer", "moses"]
    return run(args)


@pytest.fixture(scope="module")
def converted(fairseq_layouts, tmp_path_factory):
    """{name: (model directory for the fairseq engine, for CTranslate2)}: float32 and int8 of two
    layouts (sentencepiece; Moses + subword-nmt), and one member each way of the ensembles."""
    from models.nmt.importing import import_model

    out = tmp_path_factory.mktemp("ct2")
    dirs = {}
    for name, compute in (("train_spm", "float32"), ("hub_single", "float32"), ("hub_single", "int8")):
        info = fairseq_layouts[name]
        fairseq_dir, ct2_dir = str(out / f"{name}-fairseq"), str(out / f"{name}-{compute}")
        if not os.path.exists(fairseq_dir):
            import_model(info["source"], info["src_lang"], info["tgt_lang"], fairseq_dir, data=info["data"],
                         tokenizer="moses" if info["tokenizer"] == "moses" else None,
                         bpe_codes=info["bpe_codes"] if info["data"] else None)
        _import(info, ct2_dir, "--compute_type", compute)
        dirs[f"{name}-{compute}"] = (fairseq_dir, ct2_dir)
    for name in ("hub_ensemble", "hub_ensemble_en_cs"):
        _import(fairseq_layouts[name], str(out / f"{name}-int8"), "--checkpoints", "model1.pt")
        dirs[name] = (None, str(out / f"{name}-int8"))
    return dirs


def test_a_converted_directory_names_engine_family_compute_type_and_files(converted):
    meta = json.load(open(os.path.join(converted["hub_single-int8"][1], "model.json")))
    assert (meta["engine"], meta["family"], meta["compute_type"]) == ("ctranslate2", "fairseq", "int8")
    assert {"model.bin", "config.json", "bpecodes"} <= set(meta["sha256"])
    assert meta["tokenization"] == {"tokenizer": "moses", "bpe": "subword_nmt", "codes": "bpecodes"}
    assert "model.pt" not in os.listdir(converted["hub_single-int8"][1])


@pytest.mark.parametrize("name", ["train_spm-float32", "hub_single-float32"])
def test_float32_beam_and_scores_equal_the_fairseq_engine(converted, fairseq_layouts, name):
    info = fairseq_layouts[name.split("-")[0]]
    fairseq_dir, ct2_dir = converted[name]
    ref, ct2 = load_engine(fairseq_dir, device="cpu"), load_engine(ct2_dir, device="cpu")
    sentences = info["test_sentences"]
    assert [h[0].text for h in ct2.beam_search(sentences, beam=5)] == [h[0].text for h in ref.beam_search(sentences, beam=5)]
    targets = info["test_references"] + info["test_references"][1:] + info["test_references"][:1]
    sources = sentences + sentences
    want, got = ref.score(sources, targets), ct2.score(sources, targets)
    assert got == pytest.approx(want, abs=1e-3)
    assert max(got) - min(got) > 1.0


def test_int8_scores_are_within_0_3_nats(converted, fairseq_layouts):
    info = fairseq_layouts["hub_single"]
    ref = load_engine(converted["hub_single-int8"][0], device="cpu")
    ct2 = load_engine(converted["hub_single-int8"][1], device="cpu")
    sources = info["test_sentences"]
    targets = info["test_references"][::-1]
    assert ct2.score(sources, targets) == pytest.approx(ref.score(sources, targets), abs=0.3)


@pytest.mark.parametrize("name", ["train_spm-float32", "hub_single-int8"])
def test_samples_never_contain_a_banned_word_and_a_unit_gives_the_same_samples(converted, fairseq_layouts, name):
    from paracorpus.constraints import draw_constraint_sets

    info = fairseq_layouts[name.split("-")[0]]
    engine = load_engine(converted[name][1], device="cpu")
    requests = [SampleRequest(src, f"p{i}:{k}", tuple(words), 10)
                for i, (src, ref) in enumerate(zip(info["test_sentences"], info["test_references"]))
                for k, words in enumerate(draw_constraint_sets(ref, 3, 1, f"p{i}", 2))]
    engine.start_unit("run:7")
    first = engine.sample(requests, topk=10, seed=1)
    assert sum(map(len, first)) == 10 * len(requests) >= 240          # 3 sets x 10 of 8 to 12 sentences
    broken = [(r.banned_words, h.text) for r, hs in zip(requests, first) for h in hs if violates(h.text, r.banned_words)]
    assert not broken, broken[:5]
    engine.start_unit("run:8")                              # another unit draws other samples
    other = engine.sample(requests, topk=10, seed=1)
    engine.start_unit("run:7")                              # the same unit again: the same samples
    again = engine.sample(requests, topk=10, seed=1)
    texts = [[h.text for h in hs] for hs in first]
    assert [[h.text for h in hs] for hs in again] == texts
    assert [[h.text for h in hs] for hs in other] != texts
    assert [[h.nll for h in hs] for hs in again] == [[h.nll for h in hs] for hs in first]
    # As the job decodes a unit: both engines score (dual_xent), then the forward one samples. A
    # unit draws the same whether it is a process's first (right after the engines' warm-up) or
    # comes after others, whatever the seed; the backward engine's calls move CTranslate2's
    # global seed in between.
    for seed in (1, 3):
        forward, backward = (CT2Engine(converted[name][1], device="cpu") for _ in range(2))   # fresh, not cached
        for e in (forward, backward):
            e.warm_up("sample")

        def unit_draws(key):
            for e in (forward, backward):
                e.start_unit(key)
            forward.score([r.source for r in requests[:4]], [r.source for r in requests[:4]])
            backward.score([r.source for r in requests[:4]], [r.source for r in requests[:4]])
            return [[h.text for h in hs] for hs in forward.sample(requests, topk=10, seed=seed)]
        first_unit = unit_draws("run:9")
        unit_draws("run:8")
        assert unit_draws("run:9") == first_unit, seed


def test_paragen_translate_runs_a_ctranslate2_directory(converted, fairseq_layouts):
    info = fairseq_layouts["train_spm"]
    fairseq_dir, ct2_dir = converted["train_spm-float32"]
    ref = load_engine(fairseq_dir, device="cpu")
    sentences = info["test_sentences"][:5]

    def cli(*args, stdin):
        done = warm_python.run([sys.executable, "-m", "models.nmt.translate", "--model", ct2_dir, *args],
                               input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=300,
                               env={**os.environ, "PYTHONPATH": ROOT})
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.split("\n")[:-1]
    assert cli("--beam", "5", stdin="\n".join(sentences) + "\n") == [h[0].text for h in ref.beam_search(sentences, 5)]
    pairs = list(zip(sentences, info["test_references"][:5]))
    scores = cli("--score", stdin="".join(f"{s}\t{t}\n" for s, t in pairs))
    assert [float(x) for x in scores] == pytest.approx(ref.score(*zip(*pairs)), abs=1e-3)
    lines = [f"{s}\t{' '.join(t.split()[1:3])}" for s, t in pairs]
    samples = cli("--sample", "--num_samples", "12", stdin="\n".join(lines) + "\n")
    assert len(samples) == 5
    for line, out in zip(lines, samples):
        banned = tuple(line.split("\t")[1].split())
        assert len(out.split("\t")) == 12 and not any(violates(t, banned) for t in out.split("\t"))


# ------------------------------------------------------------------ the generation job
def _job_args(converted, inp, out, *extra):
    return ["--input", str(inp), "--output", str(out), "--forward_model", converted["hub_ensemble"][1],
            "--backward_model", converted["hub_ensemble_en_cs"][1], "--num_sets", "2", "--num_samples", "5",
            "--score_threshold", "20", "--dual_xent_threshold", "20", "--unit_pairs", "4", "--batch_pairs", "4",
            "--num_output_shards", "2", *extra]


def test_with_ctranslate2_the_batch_size_is_part_of_the_plan(converted, tmp_path):
    # its samples depend on the other pairs of a unit's batch (docs/contract.md), unlike the
    # project's engine, whose runs share a plan whatever --batch_pairs (tests/test_phases.py)
    from beam_pipelines.generation.check import check

    inp = tmp_path / "in.tsv"
    inp.write_text("a b\tc d\n")
    hashes = {check(_job_args(converted, inp, tmp_path / "out", "--batch_pairs", size))[1].config_hash
              for size in ("4", "8")}
    assert len(hashes) == 2


@pytest.fixture(scope="module")
def job_input(fairseq_layouts, tmp_path_factory):
    from tests.toydata import toy_bitext

    info = fairseq_layouts["hub_ensemble"]
    lines = [f"{s}\t{t}\n" for s, t in zip(info["test_sentences"], info["test_references"])]
    lines += [f"{s}\t{t}\n" for s, t in toy_bitext(400, seed=77)[:20]]
    path = tmp_path_factory.mktemp("ct2-in") / "in.tsv"
    path.write_text("".join(lines))
    return path


def _rows(out, table="paraphrases"):
    from common import storage
    from paracorpus.commit import committed_files

    files = committed_files(str(out), table)
    rows = storage.parquet_dataset(files).to_table().to_pylist() if files else []
    return sorted(rows, key=lambda r: (r["pair_id"], r.get("rank") or 0))


@pytest.fixture(scope="module")
def uninterrupted(converted, job_input, tmp_path_factory):
    from beam_pipelines.generate import run

    out = tmp_path_factory.mktemp("ct2-whole")
    manifest = run(_job_args(converted, job_input, out))
    return out, manifest


def test_the_generation_job_runs_on_ctranslate2(uninterrupted, converted):
    from paracorpus.schema import PARAPHRASE_SCHEMA

    out, manifest = uninterrupted
    assert manifest["counts"]["reconciled"] and manifest["counts"]["pairs_with_paraphrases"] >= 20
    for side in ("forward", "backward"):
        entry = manifest["models"][side]
        assert (entry["engine"], entry["family"], entry["compute_type"]) == ("ctranslate2", "fairseq", "int8")
        assert {"model.bin", "bpecodes"} <= set(entry["sha256"])
    assert manifest["precision"]["workers"] == {"cpu_int8": 1}
    rows = _rows(out)
    assert rows and set(rows[0]) == set(PARAPHRASE_SCHEMA.names)
    assert all(not violates(r["paraphrase"], tuple(r["constraint_set"])) for r in rows)
    assert all("@@" not in r["paraphrase"] and r["backward_nll"] is not None for r in rows)


def _finished_units(out) -> int:
    work = os.path.join(out, "_work")
    return sum(len(os.listdir(os.path.join(work, r, "units"))) for r in os.listdir(work)
               if os.path.isdir(os.path.join(work, r, "units"))) if os.path.isdir(work) else 0


def test_resume_after_a_kill_gives_the_uninterrupted_rows(converted, job_input, uninterrupted, tmp_path):
    from beam_pipelines.generate import run

    out = tmp_path / "out"
    proc = warm_python.popen([sys.executable, "-m", "beam_pipelines.generate", *_job_args(converted, job_input, out)],
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                             env={**os.environ, "PYTHONPATH": ROOT})
    deadline = time.time() + 300
    while _finished_units(out) < 2:
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert time.time() < deadline
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    planned = uninterrupted[1]["units"]["planned"]
    done = _finished_units(out)
    assert 0 < done < planned and not (out / "_manifest.json").exists()
    manifest = run(_job_args(converted, job_input, out, "--resume"))
    assert manifest["resumed"] and manifest["units"]["reused_from_earlier_attempt"] == done
    assert _rows(out) == _rows(uninterrupted[0])
    assert _rows(out, "rejects") == _rows(uninterrupted[0], "rejects")


def test_sampled_rows_do_not_depend_on_threads_or_process(converted, job_input, uninterrupted, tmp_path):
    """CTranslate2 draws per work unit (docs/contract.md): the same units and batches give the same
    rows in another process with two intra-op threads as in this one with one."""
    out = tmp_path / "two-threads"
    done = warm_python.run([sys.executable, "-m", "beam_pipelines.generate", *_job_args(converted, job_input, out),
                            "--torch_threads", "2"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                           env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr[-3000:]
    strip = [{k: v for k, v in r.items() if k != "config_hash"} for r in _rows(out)]
    assert strip == [{k: v for k, v in r.items() if k != "config_hash"} for r in _rows(uninterrupted[0])]


def test_a_dask_cluster_gives_the_same_rows(converted, job_input, uninterrupted, tmp_path, dask_cluster):
    from beam_pipelines.generate import run

    out = tmp_path / "dask"
    manifest = run(_job_args(converted, job_input, out, "--runner", "DaskRunner", "--dask_client_address",
                             dask_cluster))
    assert manifest["counts"] == uninterrupted[1]["counts"]
    assert _rows(out) == _rows(uninterrupted[0])


# ------------------------------------------------------------------ --engine auto, the default
def test_engine_auto_takes_ctranslate2_for_one_model_on_a_cpu_and_fairseq_otherwise(fairseq_layouts, tmp_path,
                                                                                     capsys, caplog):
    """One model on a machine without a CUDA GPU: CTranslate2 int8 (the faster engine on a CPU,
    docs/benchmarks.md); an ensemble: fairseq; a model fairseq runs and CTranslate2's converter
    refuses (an activation it lacks): fairseq, saying why, and refused when CTranslate2 is asked for."""
    import shutil

    import torch

    from common.cli import UsageError
    from models.nmt.importing import run
    from models.nmt.model_files.checkpoint import allow_fairseq_checkpoints

    def auto(info, output, *extra):
        meta = run([info["source"], "--src_lang", "cs", "--tgt_lang", "en", "--tokenizer", "moses", "--output",
                    output, *extra])
        return meta, capsys.readouterr().out

    single, ens = fairseq_layouts["hub_single"], fairseq_layouts["hub_ensemble"]
    meta, printed = auto(single, str(tmp_path / "single"))
    if torch.cuda.is_available():
        assert meta["engine"] == "fairseq" and "a CUDA GPU here" in printed
    else:
        assert (meta["engine"], meta["compute_type"]) == ("ctranslate2", "int8"), meta
        assert "--engine auto: one model on a CPU" in printed
    meta, printed = auto(ens, str(tmp_path / "ensemble"))
    assert meta["engine"] == "fairseq" and len(meta["members"]) == 2 and "an ensemble of 2" in printed

    tanh = tmp_path / "tanh"
    shutil.copytree(single["source"], tanh)
    allow_fairseq_checkpoints()
    state = torch.load(tanh / "model.pt", map_location="cpu", weights_only=True)
    state["args"].activation_fn = "tanh"           # fairseq has it, CTranslate2 4.8 does not
    torch.save(state, tanh / "model.pt")
    info = {**single, "source": str(tanh)}
    with pytest.raises(UsageError, match="CTranslate2 cannot convert this model.*tanh"):
        auto(info, str(tmp_path / "tanh-ct2"), "--engine", "ctranslate2")
    assert not (tmp_path / "tanh-ct2").exists() and not [n for n in os.listdir(tmp_path) if n.startswith(".")]
    if not torch.cuda.is_available():
        meta, printed = auto(info, str(tmp_path / "tanh-auto"))
        assert meta["engine"] == "fairseq" and "CTranslate2 cannot convert it" in printed
        assert any("importing for the fairseq engine instead" in r.getMessage() for r in caplog.records)
        engine = load_engine(str(tmp_path / "tanh-auto"))
        assert engine.beam_search(["ahoj"], beam=2)[0]               # it runs


# ------------------------------------------------------------------ refusals
def test_refusals_are_one_line(fairseq_layouts, converted, tmp_path):
    def refused(module, args, match):
        done = warm_python.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                               timeout=600, env={**os.environ, "PYTHONPATH": ROOT}, stdin=subprocess.DEVNULL)
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert match in errors[0], errors[0]

    ens = fairseq_layouts["hub_ensemble"]
    out = str(tmp_path / "m")
    refused("models.nmt.importing", [ens["source"], "--src_lang", "cs", "--tgt_lang", "en", "--tokenizer", "moses",
                                     "--engine", "ctranslate2", "--output", out], "not an ensemble of 2")
    assert not os.path.exists(out) and os.listdir(tmp_path) == []
    refused("models.nmt.importing", [ens["source"], "--src_lang", "cs", "--tgt_lang", "en", "--tokenizer", "moses",
                                     "--compute_type", "int8", "--output", out], "not an ensemble of 2")
    refused("models.nmt.importing", [ens["source"], "--src_lang", "cs", "--tgt_lang", "en", "--tokenizer", "moses",
                                     "--engine", "fairseq", "--compute_type", "int8", "--output", out],
            "--compute_type is for --engine")
    assert os.listdir(tmp_path) == []
    # a compute type this CPU cannot run is refused before a job writes anything
    f16 = str(tmp_path / "f16")
    _import(fairseq_layouts["train_spm"], f16, "--compute_type", "float16")
    inp = tmp_path / "in.tsv"
    inp.write_text("ahoj\thello\n")
    refused("beam_pipelines.generate", ["--input", str(inp), "--output", str(tmp_path / "out"), "--forward_model",
                                        f16, "--device", "cpu"], "compute type float16 is not supported")
    assert not (tmp_path / "out").exists()


def _odd_sources(info, n: int = 30) -> list[str]:
    """Short Czech sources of a few test-sentence words in no sensible order: hypotheses that run
    to their length limit, where a batch-wide limit used to make the output depend on batch-mates."""
    import random

    words = sorted({w for s in info["test_sentences"] for w in s.split() if w.isalpha()})
    rnd = random.Random(4)
    return list(dict.fromkeys(" ".join(rnd.choice(words) for _ in range(rnd.randint(1, 3))) for _ in range(n)))


def test_beam_search_and_the_beam_job_do_not_depend_on_batch_mates(converted, fairseq_layouts, job_input, tmp_path):
    from tests.test_batch_independence import LAYOUTS, assert_same_rows, job_rows

    info = fairseq_layouts["hub_ensemble"]
    engine = load_engine(converted["hub_ensemble"][1], device="cpu")
    sources = _odd_sources(info)
    long = " ".join(info["test_sentences"][:6])
    alone = [engine.beam_search([s], beam=4)[0][0].text for s in sources]
    assert [h[0].text for h in engine.beam_search(sources + [long], beam=4)[:-1]] == alone
    # the job in beam mode, three unit sizes and two batch sizes: the same rows
    inp = tmp_path / "in.tsv"
    odd = [f"{s}\t{' '.join(info['test_references'][0].split()[:len(s.split())])}\n" for s in sources]
    inp.write_text(job_input.read_text() + "".join(odd))
    models = {"forward": converted["hub_ensemble"][1], "backward": converted["hub_ensemble_en_cs"][1]}
    runs = [job_rows(str(inp), tmp_path / f"r{i}", models, "--preset", "paranmt", "--beam", "4", *layout)
            for i, layout in enumerate(LAYOUTS)]
    assert len(runs[0]) >= 40
    for other in runs[1:]:
        # int8 quantizes activations per batch: its scores move by up to ~5e-4 with batch-mates
        assert_same_rows(other, runs[0], score_tolerance=2e-3)
