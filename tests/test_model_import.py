"""Bring your own fairseq models: paragen-import-model on every layout users have
(tests/fairseq_fixtures.py: hub archives old and new, an ensemble, fairseq-train output with
sentencepiece, a shrunk transformer_wmt_en_de_big, old tensor names), checked against fairseq
itself: beam outputs equal fairseq's hub translate() string for string, scores equal fairseq's
SequenceScorer (ensemble included) within 1e-4, samples never contain a banned word, through the
Python API and through paragen-translate; the generation job runs with imported ensembles both
ways; and every refusal is one line with nothing written."""
import json
import os
import shutil
import sys

import pytest

from models.nmt.engine import SampleRequest
from models.nmt.engines.loading import load_engine
from paracorpus.paraphrasing import violates
from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow          # every test here uses models trained with fairseq-train
LAYOUTS = ("hub_single", "hub_ensemble", "train_spm", "big_shrunk", "old_args", "old_keys", "hub_ensemble_en_cs")


def _import_args(info, output):
    args = [info["source"], "--src_lang", info["src_lang"], "--tgt_lang", info["tgt_lang"], "--output", output]
    if info["data"]:
        args += ["--data", info["data"], "--bpe_codes", info["bpe_codes"]]
    if info["tokenizer"] == "moses":
        args += ["--tokenizer", "moses"]      # hub archives do not say how their text was tokenized
    return args


@pytest.fixture(scope="module")
def imported(fairseq_layouts, tmp_path_factory):
    """{layout: model directory written by paragen-import-model}; the ensemble through the CLI."""
    from models.nmt.importing import import_model, run

    out = tmp_path_factory.mktemp("imported")
    dirs = {}
    for name in LAYOUTS:
        info, target = fairseq_layouts[name], str(out / name)
        if name == "hub_ensemble":
            run(_import_args(info, target))
        else:
            import_model(info["source"], info["src_lang"], info["tgt_lang"], target, data=info["data"],
                         tokenizer=info["tokenizer"] if info["tokenizer"] == "moses" else None,
                         bpe_codes=info["bpe_codes"] if info["data"] else None)
        dirs[name] = target
    return dirs


def _cli(module, args, stdin=None, env=None):
    return warm_python.run([sys.executable, "-m", module, *args], cwd=ROOT, input=stdin, capture_output=True,
                           text=True, timeout=600, env={**os.environ, "PYTHONPATH": ROOT, **(env or {})})


# ------------------------------------------------------------------ what an imported directory holds
def test_an_imported_directory_holds_tensors_configs_and_checksums(imported, fairseq_layouts):
    import torch

    meta = json.load(open(os.path.join(imported["hub_ensemble"], "model.json")))
    assert meta["format"] == 2 and meta["engine"] == "fairseq" and (meta["src_lang"], meta["tgt_lang"]) == ("cs", "en")
    assert [m["from"] for m in meta["members"]] == ["model1.pt", "model2.pt"]
    assert meta["tokenization"] == {"tokenizer": "moses", "bpe": "fastbpe", "codes": "bpecodes"}
    files = sorted(os.listdir(imported["hub_ensemble"]))
    assert set(meta["sha256"]) == set(files) - {"model.json"}
    for m in meta["members"]:           # named tensors only: loads with weights_only and no allowlist
        state = torch.load(os.path.join(imported["hub_ensemble"], m["weights"]), weights_only=True)
        assert all(isinstance(v, torch.Tensor) for v in state.values())
        config = json.load(open(os.path.join(imported["hub_ensemble"], m["config"])))
        assert config["arch"] == "transformer" and "data" not in config      # training paths dropped
    assert json.load(open(os.path.join(imported["train_spm"], "model.json")))["tokenization"] == {
        "tokenizer": "none", "bpe": "sentencepiece", "codes": "sentencepiece.bpe.model"}
    # old tensor names come out as the model has them now
    old = torch.load(os.path.join(imported["old_keys"], "member1.pt"), weights_only=True)
    assert not any("in_proj_weight" in k or "layer_norms" in k for k in old)


# ------------------------------------------------------------------ beam search: fairseq's outputs
@pytest.mark.parametrize("name", LAYOUTS)
def test_beam_outputs_equal_fairseqs_hub_translate(imported, fairseq_layouts, hub, name):
    info = fairseq_layouts[name]
    model = hub(info)
    sentences = info["test_sentences"]
    want = model.translate(sentences, beam=5)
    engine = load_engine(imported[name], device="cpu")
    got = [h[0].text for h in engine.beam_search(sentences, beam=5)]
    assert got == want
    done = _cli("models.nmt.translate", ["--model", imported[name], "--beam", "5"], "\n".join(sentences) + "\n")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == want


# ------------------------------------------------------------------ scores: fairseq's SequenceScorer
def _fairseq_scores(model, info, sources, targets):
    """Per-token NLL of each target by fairseq's own pieces: its encoders (the target tokenized
    with the target language's Moses rules), its dictionary and SequenceScorer over all members."""
    import torch
    from fairseq.data.encoders.moses_tokenizer import MosesTokenizer, MosesTokenizerConfig
    from fairseq.sequence_scorer import SequenceScorer

    target_moses = MosesTokenizer(MosesTokenizerConfig(source_lang=info["tgt_lang"], target_lang=info["tgt_lang"])) \
        if info["tokenizer"] == "moses" else None
    scorer = SequenceScorer(model.tgt_dict)
    out = []
    for source, target in zip(sources, targets):
        src = model.encode(source)
        text = target_moses.encode(target) if target_moses else target
        tgt = model.tgt_dict.encode_line(model.bpe.encode(text), add_if_not_exist=False, append_eos=True).long()
        prev = torch.cat([tgt.new_tensor([model.tgt_dict.eos()]), tgt[:-1]])
        sample = {"net_input": {"src_tokens": src[None], "src_lengths": torch.tensor([len(src)]),
                                "prev_output_tokens": prev[None]}, "target": tgt[None]}
        with torch.inference_mode():
            hypo = scorer.generate(model.models, sample)[0][0]
        out.append(-float(hypo["positional_scores"].mean()))
    return out


@pytest.mark.parametrize("name", ["hub_ensemble", "train_spm", "old_keys", "hub_ensemble_en_cs"])
def test_scores_equal_fairseqs_sequence_scorer(imported, fairseq_layouts, hub, name):
    info = fairseq_layouts[name]
    sources = info["test_sentences"]
    targets = info["test_references"][1:] + info["test_references"][:1]       # wrong targets score too
    targets = [t for pair in zip(info["test_references"], targets) for t in pair]
    sources = [s for s in sources for _ in range(2)]
    want = _fairseq_scores(hub(info), info, sources, targets)
    got = load_engine(imported[name], device="cpu").score(sources, targets)
    assert got == pytest.approx(want, abs=1e-4)
    assert max(got) - min(got) > 1.0                       # right and wrong targets told apart
    lines = "".join(f"{s}\t{t}\n" for s, t in zip(sources, targets))
    done = _cli("models.nmt.translate", ["--model", imported[name], "--score"], lines)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [float(x) for x in done.stdout.split()] == pytest.approx(want, abs=1e-4)


def test_an_ensemble_scores_the_mean_probability_not_the_mean_log_probability(imported, fairseq_layouts, hub):
    """log of the mean of the members' probabilities: not the mean of the members' scores."""
    info = fairseq_layouts["hub_ensemble"]
    model = hub(info)
    sources, targets = info["test_sentences"][:4], info["test_references"][1:5]
    ensemble = _fairseq_scores(model, info, sources, targets)
    members = []
    for m in model.models:
        single = type(model)(model.cfg, model.task, [m])
        members.append(_fairseq_scores(single, info, sources, targets))
    mean_of_scores = [sum(x) / len(x) for x in zip(*members)]
    got = load_engine(imported["hub_ensemble"], device="cpu").score(sources, targets)
    assert got == pytest.approx(ensemble, abs=1e-4)
    assert max(abs(a - b) for a, b in zip(got, mean_of_scores)) > 1e-3


# ------------------------------------------------------------------ sampling under bans
@pytest.mark.parametrize("name", ["hub_ensemble", "train_spm", "hub_single"])
def test_samples_never_contain_a_banned_word(imported, fairseq_layouts, hub, name):
    from paracorpus.constraints import draw_constraint_sets

    info = fairseq_layouts[name]
    engine = load_engine(imported[name], device="cpu")
    requests = []
    for i, (source, reference) in enumerate(zip(info["test_sentences"], info["test_references"])):
        for s, words in enumerate(draw_constraint_sets(reference, 3, 1, f"p{i}", 2)):
            requests.append(SampleRequest(source, f"p{i}:{s}", tuple(words), 10))
    samples = engine.sample(requests, topk=10, seed=1)
    total = sum(len(h) for h in samples)
    assert total == 10 * len(requests) >= 240                 # 3 sets x 10 of 8 to 12 sentences
    broken = [(r.banned_words, h.text) for r, hs in zip(requests, samples) for h in hs if violates(h.text, r.banned_words)]
    assert not broken, broken[:5]
    assert all("@@" not in h.text and "\u2581" not in h.text and "&apos;" not in h.text for hs in samples for h in hs)
    # the sampler combines an ensemble's members as fairseq does: a sample's NLL is fairseq's score of it
    if name == "hub_ensemble":
        picked = [(r.source, hs[0].text) for r, hs in zip(requests[:6], samples[:6])
                  if engine.target_pieces(hs[0].text) == list(hs[0].pieces)]
        want = _fairseq_scores(hub(info), info, [s for s, _ in picked], [t for _, t in picked])
        nll = [hs[0].nll for r, hs in zip(requests[:6], samples[:6])
               if engine.target_pieces(hs[0].text) == list(hs[0].pieces)]
        assert len(picked) >= 3 and nll == pytest.approx(want, abs=1e-4)


def test_paragen_translate_samples_with_per_line_bans(imported, fairseq_layouts):
    info = fairseq_layouts["hub_ensemble"]
    lines, bans = [], []
    for source, reference in zip(info["test_sentences"], info["test_references"]):
        words = [w for w in reference.split() if w.isalpha()][:2]
        bans.append(words)
        lines.append(f"{source}\t{' '.join(words)}")
    lines.append(info["test_sentences"][0])                  # no ban column
    done = _cli("models.nmt.translate", ["--model", imported["hub_ensemble"], "--sample", "--num_samples", "20"],
                "\n".join(lines) + "\n")
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout.split("\n")[:-1]
    assert len(out) == len(lines)
    for samples, words in zip(out, bans + [[]]):
        texts = samples.split("\t")
        assert len(texts) == 20 and not any(violates(t, tuple(words)) for t in texts)


# ------------------------------------------------------------------ the generation job
def test_the_generation_job_runs_with_imported_ensembles_both_ways(imported, fairseq_layouts, tmp_path):
    import pyarrow as pa

    from beam_pipelines.generate import run
    from common import storage
    from paracorpus.commit import committed_files
    from paracorpus.schema import PARAPHRASE_SCHEMA

    info = fairseq_layouts["hub_ensemble"]
    inp = tmp_path / "in.tsv"
    inp.write_text("".join(f"{s}\t{t}\n" for s, t in zip(info["test_sentences"], info["test_references"])))
    out = tmp_path / "out"
    manifest = run(["--input", str(inp), "--output", str(out), "--forward_model", imported["hub_ensemble"],
                    "--backward_model", imported["hub_ensemble_en_cs"], "--num_sets", "2", "--num_samples", "5",
                    "--score_threshold", "20", "--dual_xent_threshold", "20", "--device", "cpu"])
    counts = manifest["counts"]
    assert counts["reconciled"] and counts["pairs_with_paraphrases"] >= len(info["test_sentences"]) - 2
    for side in ("forward", "backward"):
        entry = manifest["models"][side]
        assert entry["members"] == 2 and entry["engine"] == "fairseq"
        assert entry["tokenization"] == {"tokenizer": "moses", "bpe": "fastbpe", "codes": "bpecodes"}
        assert {"member1.pt", "member2.pt", "bpecodes", "model.json"} <= set(entry["sha256"])
    table = storage.parquet_dataset(committed_files(str(out), "paraphrases")).to_table()
    assert table.schema.names == PARAPHRASE_SCHEMA.names
    assert all(table.schema.field(f.name).type == f.type for f in PARAPHRASE_SCHEMA)
    rows = table.to_pylist()
    assert all("@@" not in r["paraphrase"] and "&apos;" not in r["paraphrase"] for r in rows)
    assert all(not violates(r["paraphrase"], tuple(r["constraint_set"])) for r in rows)
    assert all(r["backward_nll"] is not None and r["backward_nll"] == r["backward_nll"] for r in rows)
    assert pa.compute.min(table.column("rank")).as_py() == 1


# ------------------------------------------------------------------ refusals
def _refused(args, output, match, env=None):
    done = _cli("models.nmt.importing", args, env=env)
    lines = [line for line in done.stderr.strip().splitlines() if " INFO " not in line and " WARNING " not in line]
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-2000:]
    assert match in lines[0], lines[0]
    assert "Traceback" not in done.stderr
    parent = os.path.dirname(output)
    assert not os.path.exists(output) and not [n for n in os.listdir(parent) if n.startswith(".")]
    return lines[0]


def _archive_copy(info, dst, models: dict):
    os.makedirs(dst)
    for name in os.listdir(info["source"]):
        if not name.endswith(".pt"):
            shutil.copyfile(os.path.join(info["source"], name), os.path.join(dst, name))
    for name, src in models.items():
        shutil.copyfile(src, os.path.join(dst, name))
    return str(dst)


def _state(path):
    import torch

    from models.nmt.model_files.checkpoint import allow_fairseq_checkpoints

    allow_fairseq_checkpoints()
    return torch.load(path, map_location="cpu", weights_only=True)


class _Pickled:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (eval, (f"__import__('pathlib').Path({self.marker!r}).touch()",))


def test_refusals_are_one_line_and_write_nothing(fairseq_layouts, tmp_path):
    import torch

    single, ens, big = (fairseq_layouts[n] for n in ("hub_single", "hub_ensemble", "big_shrunk"))
    out = str(tmp_path / "out" / "model")
    os.makedirs(os.path.dirname(out))
    marker = tmp_path / "pwned"

    pickled = tmp_path / "pickled"
    state = _state(os.path.join(single["source"], "model.pt"))
    _archive_copy(single, pickled, {})
    torch.save({**state, "extra": _Pickled(str(marker))}, pickled / "model.pt")
    _refused([str(pickled), "--src_lang", "cs", "--tgt_lang", "en", "--tokenizer", "moses", "--output", out],
             out, "pickled Python objects")

    code = tmp_path / "code"
    _archive_copy(single, code, {})
    hostile = _state(os.path.join(single["source"], "model.pt"))
    hostile["args"].adaptive_softmax_cutoff = f"__import__('os').system('touch {marker}') or [1]"
    torch.save(hostile, code / "model.pt")
    _refused([str(code), "--src_lang", "cs", "--tgt_lang", "en", "--tokenizer", "moses", "--output", out],
             out, "adaptive_softmax_cutoff")

    lstm = tmp_path / "lstm"
    _archive_copy(single, lstm, {})
    other = _state(os.path.join(single["source"], "model.pt"))
    other["args"].arch = "lstm"
    torch.save(other, lstm / "model.pt")
    line = _refused([str(lstm), "--src_lang", "cs", "--tgt_lang", "en", "--tokenizer", "moses", "--output", out],
                    out, "'lstm' is not supported")
    assert "transformer_wmt_en_de_big" in line                     # it says what is

    lm = tmp_path / "lm"
    _archive_copy(single, lm, {})
    task = _state(os.path.join(single["source"], "model.pt"))
    task["args"].task = "language_modeling"
    torch.save(task, lm / "model.pt")
    _refused([str(lm), "--src_lang", "cs", "--tgt_lang", "en", "--tokenizer", "moses", "--output", out],
             out, "task 'language_modeling'")

    mixed = _archive_copy(single, tmp_path / "mixed", {"model1.pt": os.path.join(single["source"], "model.pt"),
                                                       "model2.pt": os.path.join(big["source"], "model.pt")})
    _refused([mixed, "--src_lang", "cs", "--tgt_lang", "en", "--tokenizer", "moses", "--output", out],
             out, "another architecture")

    _refused([ens["source"], "--src_lang", "en", "--tgt_lang", "cs", "--tokenizer", "moses", "--output", out],
             out, "trained to translate cs->en, not en->cs")
    _refused([ens["source"], "--src_lang", "de", "--tgt_lang", "en", "--tokenizer", "moses", "--output", out],
             out, "no dict.de.txt")
    garbage = tmp_path / "garbage.codes"
    garbage.write_text("this is not\na codes file at all\n")
    _refused([ens["source"], "--src_lang", "cs", "--tgt_lang", "en", "--tokenizer", "moses", "--bpe_codes",
              str(garbage), "--output", out], out, "not BPE codes")
    _refused([ens["source"], "--src_lang", "cs", "--tgt_lang", "en", "--tokenizer", "moses", "--bpe", "subword_nmt",
              "--output", out], out, "subword")
    _refused([single["source"], "--src_lang", "cs", "--tgt_lang", "en", "--output", out], out, "--tokenizer")
    assert not marker.exists()
