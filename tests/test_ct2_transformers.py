"""The CTranslate2 engine on pretrained-style transformers models (tests/transformers_fixtures.py:
tiny Marian both ways and a tiny M2M-100 with language tokens), imported with
paragen-import-model --engine ctranslate2: in float32 its beam outputs equal transformers'
generate() and its scores are within 1e-3 of transformers' teacher-forced log-probabilities; in
int8 within 0.3 nats; banned words never appear in samples; paragen-translate and the generation
job run on them; and a transformers directory that would run code or unpickle objects, or a
language code the model lacks, is refused in one line."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from models.nmt.engine import SampleRequest
from models.nmt.engines.loading import load_engine
from paracorpus.paraphrasing import violates

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow          # models trained here with torch, converted with CTranslate2

# (name, transformers model, direction, compute type)
IMPORTS = [("marian-float32", "marian_cs_en", ("cs", "en"), "float32"),
           ("marian-int8", "marian_cs_en", ("cs", "en"), "int8"),
           ("marian-en-cs", "marian_en_cs", ("en", "cs"), "int8"),
           ("m2m-float32", "m2m100", ("cs", "en"), "float32"),
           ("m2m-en-cs-float32", "m2m100", ("en", "cs"), "float32"),
           ("m2m-int8", "m2m100", ("cs", "en"), "int8")]


@pytest.fixture(scope="module")
def imported(transformers_models, tmp_path_factory):
    from models.nmt.importing import run

    out = tmp_path_factory.mktemp("ct2-transformers")
    dirs = {}
    for name, model, (src, tgt), compute in IMPORTS:
        dirs[name] = str(out / name)
        run([transformers_models[model]["path"], "--src_lang", src, "--tgt_lang", tgt, "--engine", "ctranslate2",
             "--compute_type", compute, "--output", dirs[name]])
    return dirs


def _case(transformers_models, name):
    _, model, (src, tgt), _ = next(i for i in IMPORTS if i[0] == name)
    info = transformers_models[model]
    test = info["tests"][f"{src}-{tgt}"]
    return info, src, tgt, test["sentences"], test["references"]


def test_an_imported_directory_names_family_codes_and_files(imported):
    marian = json.load(open(os.path.join(imported["marian-int8"], "model.json")))
    assert (marian["engine"], marian["family"], marian["compute_type"]) == ("ctranslate2", "marian", "int8")
    assert marian["tokenization"] == {"tokenizer": "none", "bpe": "spm", "codes": "target.spm",
                                      "source_codes": "source.spm"}
    assert {"model.bin", "source.spm", "target.spm"} <= set(marian["sha256"])
    m2m = json.load(open(os.path.join(imported["m2m-en-cs-float32"], "model.json")))
    assert m2m["family"] == "m2m100" and m2m["lang_codes"] == {"src": "__en__", "tgt": "__cs__"}
    assert "model.safetensors" not in os.listdir(imported["m2m-int8"])


@pytest.mark.parametrize("name", ["marian-float32", "m2m-float32", "m2m-en-cs-float32"])
def test_float32_beam_equals_generate_and_scores_equal_teacher_forcing(imported, transformers_models, name):
    from tests.transformers_fixtures import reference_log_probs, reference_translate

    info, src, tgt, sentences, references = _case(transformers_models, name)
    engine = load_engine(imported[name], device="cpu")
    want = reference_translate(info, sentences, 4, src_lang=src, tgt_lang=tgt)
    assert [h[0].text for h in engine.beam_search(sentences, beam=4)] == want
    pairs = list(zip(sentences, references)) + list(zip(sentences, references[1:] + references[:1]))
    ref = [-sum(lp) / len(lp) for lp in reference_log_probs(info, pairs, src_lang=src, tgt_lang=tgt)]
    got = engine.score([s for s, _ in pairs], [t for _, t in pairs])
    assert got == pytest.approx(ref, abs=1e-3)
    assert max(got) - min(got) > 1.0


@pytest.mark.parametrize("name", ["marian-int8", "m2m-int8"])
def test_int8_scores_are_within_0_3_nats(imported, transformers_models, name):
    from tests.transformers_fixtures import reference_log_probs

    info, src, tgt, sentences, references = _case(transformers_models, name)
    pairs = list(zip(sentences, references[::-1]))
    ref = [-sum(lp) / len(lp) for lp in reference_log_probs(info, pairs, src_lang=src, tgt_lang=tgt)]
    got = load_engine(imported[name], device="cpu").score([s for s, _ in pairs], [t for _, t in pairs])
    assert got == pytest.approx(ref, abs=0.3)


@pytest.mark.parametrize("name", ["marian-int8", "m2m-int8"])
def test_samples_never_contain_a_banned_word_and_a_unit_repeats(imported, transformers_models, name):
    from paracorpus.constraints import draw_constraint_sets

    _, _, _, sentences, references = _case(transformers_models, name)
    engine = load_engine(imported[name], device="cpu")
    requests = [SampleRequest(src, f"p{i}:{k}", tuple(words), 10)
                for i, (src, ref) in enumerate(zip(sentences, references))
                for k, words in enumerate(draw_constraint_sets(ref, 3, 1, f"p{i}", 2))]
    engine.start_unit("u3")
    first = engine.sample(requests, topk=10, seed=2)
    assert sum(map(len, first)) == 10 * len(requests) >= 300
    broken = [(r.banned_words, h.text) for r, hs in zip(requests, first) for h in hs if violates(h.text, r.banned_words)]
    assert not broken, broken[:5]
    assert not any(h.text.startswith("__") or "</s>" in h.text for hs in first for h in hs)   # codes stripped
    engine.start_unit("u3")
    assert [[h.text for h in hs] for hs in engine.sample(requests, topk=10, seed=2)] == \
        [[h.text for h in hs] for hs in first]


def test_paragen_translate_on_a_marian_directory(imported, transformers_models):
    from tests.transformers_fixtures import reference_translate

    info, src, tgt, sentences, references = _case(transformers_models, "marian-float32")
    done = subprocess.run([sys.executable, "-m", "models.nmt.translate", "--model", imported["marian-float32"],
                           "--beam", "4"], input="\n".join(sentences) + "\n", capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:-1] == reference_translate(info, sentences, 4, src_lang=src, tgt_lang=tgt)


def test_the_generation_job_runs_with_marian_both_ways(imported, transformers_models, tmp_path):
    from beam_pipelines.generate import run
    from common import storage
    from paracorpus.commit import committed_files

    _, _, _, sentences, references = _case(transformers_models, "marian-float32")
    inp = tmp_path / "in.tsv"
    inp.write_text("".join(f"{s}\t{t}\n" for s, t in zip(sentences, references)))
    manifest = run(["--input", str(inp), "--output", str(tmp_path / "out"), "--forward_model", imported["marian-int8"],
                    "--backward_model", imported["marian-en-cs"], "--num_sets", "2", "--num_samples", "6",
                    "--score_threshold", "20", "--dual_xent_threshold", "20"])
    assert manifest["counts"]["reconciled"] and manifest["counts"]["pairs_with_paraphrases"] >= 10
    assert manifest["models"]["forward"]["family"] == "marian"
    rows = storage.parquet_dataset(committed_files(str(tmp_path / "out"), "paraphrases")).to_table().to_pylist()
    assert rows and all(not violates(r["paraphrase"], tuple(r["constraint_set"])) for r in rows)


def test_refusals_are_one_line_and_write_nothing(transformers_models, tmp_path):
    import torch

    def refused(source, match, *extra):
        out = tmp_path / "out"
        done = subprocess.run([sys.executable, "-m", "models.nmt.importing", str(source), "--src_lang", "cs",
                               "--tgt_lang", "en", "--engine", "ctranslate2", "--output", str(out), *extra],
                              cwd=ROOT, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "PYTHONPATH": ROOT})
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert match in errors[0], errors[0]
        assert not out.exists() and not [n for n in os.listdir(tmp_path) if n.startswith(".")]

    marian = transformers_models["marian_cs_en"]["path"]
    remote = tmp_path / "remote"
    shutil.copytree(marian, remote)
    config = json.load(open(remote / "config.json"))
    json.dump({**config, "auto_map": {"AutoModel": "modeling_evil.Model"}}, open(remote / "config.json", "w"))
    refused(remote, "auto_map")

    pickled = tmp_path / "pickled"
    shutil.copytree(marian, pickled)
    os.remove(pickled / "model.safetensors")
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (eval, (f"__import__('pathlib').Path({str(marker)!r}).touch()",))
    torch.save({"weight": Evil()}, pickled / "pytorch_model.bin")
    refused(pickled, "pickled Python objects")
    assert not marker.exists()

    other = tmp_path / "t5"
    shutil.copytree(marian, other)
    json.dump({**config, "model_type": "t5"}, open(other / "config.json", "w"))
    refused(other, "model_type 't5' is not supported")

    m2m = transformers_models["m2m100"]["path"]
    refused(m2m, "'__xx__' is not in the model's vocabulary", "--src_lang_code", "__xx__")
    refused(marian, "for multilingual models", "--tgt_lang_code", "__en__")
    nospm = tmp_path / "nospm"
    shutil.copytree(marian, nospm)
    os.remove(nospm / "source.spm")
    refused(nospm, "no source.spm")
