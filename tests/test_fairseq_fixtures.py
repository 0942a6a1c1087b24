"""The fairseq layouts of tests/fairseq_fixtures.py are real: fairseq's own hub interface loads
each one as users load them and translates held-out sentences correctly, and each has the
checkpoint format, architecture and codes files its layout promises.

The layouts are built once per session (about 1.5-2 minutes on 2 cores);
PARAGEN_TEST_FAIRSEQ_LAYOUTS=DIR reuses a build in DIR (or builds there for the next session)."""
import argparse
import filecmp
import os
import re

import pytest

from tests import fairseq_fixtures as ff

pytestmark = pytest.mark.slow

# Floors on the held-out test sentences (12, less any near-tie: measured BLEU 100 and all exact for
# every layout): BLEU, and at most this many not word for word the reference.
MIN_BLEU = 80.0
MAX_INEXACT = 3
# Best minus second-best hypothesis score (fairseq's length-normalised log-probability), measured
# 0.25 or more on every sentence: no near-ties that a reimplementation's rounding could flip.
MIN_MARGIN = ff.MIN_MARGIN


def _state(path):
    import torch

    from models.nmt.model_files.checkpoint import allow_fairseq_checkpoints

    allow_fairseq_checkpoints()
    return torch.load(path, map_location="cpu", weights_only=True)


def _member_paths(info):
    folder = info["hub_kwargs"]["model_name_or_path"]
    return [os.path.join(folder, name) for name in info["checkpoints"]]


def _model_args(state):
    """The model's Namespace in either checkpoint format."""
    return state["args"] if state.get("args") is not None else state["cfg"]["model"]


def _words(text):
    """Moses-detokenised and toy-tokenised text alike: punctuation split off, one space."""
    return " ".join(re.sub(r"([.,])", r" \1 ", text).split())


@pytest.mark.parametrize("name", ff.LAYOUTS)
def test_info_dict(fairseq_layouts, name):
    info = fairseq_layouts[name]
    for key in ("source", "checkpoints", "data", "tokenizer", "bpe", "bpe_codes", "src_lang", "tgt_lang",
                "hub_kwargs", "test_sentences", "test_references", "test_acceptable"):
        assert key in info, key
    assert (info["src_lang"], info["tgt_lang"]) == (("en", "cs") if name.endswith("_en_cs") else ("cs", "en"))
    assert info["tokenizer"] in ("moses", "none") and info["bpe"] in ("subword_nmt", "fastbpe", "sentencepiece")
    assert os.path.isfile(info["bpe_codes"])
    kwargs = info["hub_kwargs"]
    assert {"model_name_or_path", "checkpoint_file", "data_name_or_path", "bpe"} <= set(kwargs)
    assert kwargs["checkpoint_file"].split(":") == info["checkpoints"]
    assert all(os.path.isfile(p) for p in _member_paths(info))
    assert kwargs.get("tokenizer") == (None if info["tokenizer"] == "none" else info["tokenizer"])
    assert kwargs["bpe"] == info["bpe"]
    if info["bpe"] == "sentencepiece":
        assert kwargs["sentencepiece_model"] == info["bpe_codes"]
    else:
        assert kwargs["bpe_codes"] == info["bpe_codes"]
    if name == "train_spm":
        assert os.path.isfile(info["source"]) and info["source"].endswith("checkpoint_best.pt")
        assert os.path.isdir(info["data"]) and kwargs["data_name_or_path"] == info["data"]
    else:
        assert os.path.isdir(info["source"]) and info["data"] is None
        assert kwargs["model_name_or_path"] == info["source"] and kwargs["data_name_or_path"] == "."
        assert sorted(os.listdir(info["source"])) == sorted(["bpecodes", "dict.cs.txt", "dict.en.txt",
                                                              *info["checkpoints"]])
    sentences = info["test_sentences"]
    assert ff.MIN_TEST_SENTENCES <= len(sentences) <= ff.TEST_SENTENCES and len(set(sentences)) == len(sentences)
    assert len(info["test_references"]) == len(info["test_acceptable"]) == len(sentences)
    assert all(ref == ok[0] for ref, ok in zip(info["test_references"], info["test_acceptable"]))


def test_test_sentences_held_out(fairseq_layouts):
    train, valid, sources, refs, _ = ff.toy_data()
    kept = fairseq_layouts["hub_single"]["test_sentences"]
    assert set(kept) <= set(sources) and len(kept) >= ff.MIN_TEST_SENTENCES     # less any near-tie
    seen = {cs for cs, _ in train + valid}
    assert not seen & set(sources)
    assert len(seen) > 250               # the rest of toy_bitext's 336 meanings
    # one English rendering per meaning, the canonical one, so the models have one right answer
    assert len({cs for cs, _ in train}) == len(set(train))


@pytest.mark.parametrize("name", ff.LAYOUTS)
def test_fairseq_hub_translates(fairseq_layouts, hub, name):
    """fairseq loads the layout as users load it and translates unseen sentences correctly."""
    import sacrebleu

    info = fairseq_layouts[name]
    model = hub(info)
    hyps = model.translate(info["test_sentences"], beam=5)
    acceptable = info["test_acceptable"]
    refs = [[ok[k] if k < len(ok) else None for ok in acceptable] for k in range(max(map(len, acceptable)))]
    bleu = sacrebleu.corpus_bleu(hyps, refs).score
    exact = sum(_words(h) == _words(ref) for h, ref in zip(hyps, info["test_references"]))
    report = "\n".join(f"  {s} => {h}" for s, h in zip(info["test_sentences"], hyps))
    assert bleu >= MIN_BLEU, f"{name}: BLEU {bleu:.1f}\n{report}"
    assert exact >= len(hyps) - MAX_INEXACT, f"{name}: {exact}/{len(hyps)} exact\n{report}"
    if info["tokenizer"] == "moses":      # fairseq's Moses detokenizer ran
        assert all(not h.endswith(" .") for h in hyps), report
    else:
        assert all("@@" not in h and "\u2581" not in h for h in hyps), report


@pytest.mark.parametrize("name", ff.LAYOUTS)
def test_beam_is_not_a_near_tie(fairseq_layouts, hub, name):
    info = fairseq_layouts[name]
    model = hub(info)
    outputs = model.generate([model.encode(s) for s in info["test_sentences"]], beam=5)   # the whole beam each
    margins = [float(hypos[0]["score"]) - float(hypos[1]["score"]) for hypos in outputs]
    assert min(margins) >= MIN_MARGIN, f"{name}: margins {[round(m, 3) for m in margins]}"
    # the build dropped the sentences some layout decodes with a near-tie, and kept enough
    assert ff.MIN_TEST_SENTENCES <= len(info["test_sentences"]) <= ff.TEST_SENTENCES
    assert len(info["test_references"]) == len(info["test_acceptable"]) == len(info["test_sentences"])


def test_hub_encodes_as_the_training_text_was_encoded(fairseq_layouts, hub):
    """fairseq's tokenizer + bpe at translation time give the segmentation the training used."""
    single, ensemble, spm = (fairseq_layouts[n] for n in ("hub_single", "hub_ensemble", "train_spm"))
    sentences = single["test_sentences"]
    moses = ff.moses_tokenize(sentences, "cs")
    expected = ff.subword_nmt_apply(moses, single["bpe_codes"])
    assert any("@@ " in line for line in expected)       # the codes really split words
    model = hub(single)
    assert [model.apply_bpe(model.tokenize(s)) for s in sentences] == expected
    model = hub(ensemble)
    assert [model.apply_bpe(model.tokenize(s)) for s in sentences] == ff.fastbpe_apply(moses, ensemble["bpe_codes"])
    assert ff.fastbpe_apply(moses, ensemble["bpe_codes"]) == expected     # same merges, same segmentation
    # a quirk of fairseq 0.12's hub worth knowing: its Moses tokenizer takes the source language
    # from an old-format checkpoint's args, but the dataclass default "en" for a new-format one
    assert hub(single).cfg.tokenizer.source_lang == "cs"
    assert hub(ensemble).cfg.tokenizer.source_lang == "en"
    model = hub(spm)
    assert model.tokenizer is None
    assert [model.apply_bpe(s) for s in sentences] == ff.sentencepiece_apply(sentences, spm["bpe_codes"])


def test_ensemble_loads_both_members(fairseq_layouts, hub):
    info = fairseq_layouts["hub_ensemble"]
    assert info["checkpoints"] == ["model1.pt", "model2.pt"] and info["seeds"] == [1, 2]
    model = hub(info)
    assert len(model.models) == 2
    one, two = (dict(m.named_parameters()) for m in model.models)
    assert one.keys() == two.keys()
    assert all(not (one[k] == two[k]).all() for k in one if k.endswith(("fc1.weight", "embed_tokens.weight")))
    states = [_state(p) for p in _member_paths(info)]
    for state in states:
        assert state.get("args") is None and isinstance(state["cfg"]["model"], argparse.Namespace)
        assert "last_optimizer_state" not in state
        args = state["cfg"]["model"]
        assert args.share_all_embeddings and args.encoder_learned_pos and args.decoder_learned_pos
        assert "encoder.embed_positions.weight" in state["model"]
    embeddings = [state["model"]["encoder.embed_tokens.weight"] for state in states]
    assert not (embeddings[0] == embeddings[1]).all()
    assert [s["cfg"]["common"]["seed"] for s in states] == [1, 2]
    folder = info["source"]
    assert filecmp.cmp(os.path.join(folder, "dict.cs.txt"), os.path.join(folder, "dict.en.txt"), shallow=False)


@pytest.mark.parametrize("name", ["hub_single", "old_args", "old_keys"])
def test_old_format_checkpoints(fairseq_layouts, name):
    info = fairseq_layouts[name]
    assert info["format"] == "args"
    state = _state(_member_paths(info)[0])
    args = state["args"]
    assert isinstance(args, argparse.Namespace)
    if name == "hub_single":
        assert "cfg" not in state                     # as transformer.wmt16.en-de: no cfg at all
    else:
        assert "cfg" in state and state["cfg"] is None
    assert (args.task, args.source_lang, args.target_lang) == ("translation", "cs", "en")
    assert args.arch == info["arch"] and not hasattr(args, "_name")
    assert "last_optimizer_state" not in state
    if name == "hub_single":
        assert args.arch == "transformer" and args.share_decoder_input_output_embed
        assert not args.share_all_embeddings and not args.encoder_normalize_before
        assert not args.encoder_learned_pos and not args.decoder_learned_pos
        assert not filecmp.cmp(os.path.join(info["source"], "dict.cs.txt"),
                               os.path.join(info["source"], "dict.en.txt"), shallow=False)


def test_big_shrunk_dimensions_come_from_the_config(fairseq_layouts, hub):
    for name in ("big_shrunk", "old_args", "old_keys"):
        info = fairseq_layouts[name]
        state = _state(_member_paths(info)[0])
        args = _model_args(state)
        assert args.arch == "transformer_wmt_en_de_big"
        assert (args.encoder_embed_dim, args.decoder_embed_dim) == (64, 64)
        assert (args.encoder_ffn_embed_dim, args.decoder_ffn_embed_dim) == (128, 128)
        assert (args.encoder_attention_heads, args.decoder_attention_heads) == (2, 2)
        assert (args.encoder_layers, args.decoder_layers) == (1, 1)
        model = hub(info).models[0]
        assert len(model.encoder.layers) == len(model.decoder.layers) == 1
        assert model.encoder.embed_tokens.embedding_dim == 64
        assert model.encoder.layers[0].fc1.out_features == 128
        assert model.encoder.layers[0].self_attn.num_heads == 2
    new = _state(_member_paths(fairseq_layouts["big_shrunk"])[0])
    assert new.get("args") is None and new["cfg"]["model"].arch == "transformer_wmt_en_de_big"
    old = _state(_member_paths(fairseq_layouts["old_args"])[0])
    assert new["model"].keys() == old["model"].keys()
    assert all((new["model"][k] == old["model"][k]).all() for k in new["model"])


def test_old_keys_have_legacy_tensor_names(fairseq_layouts, hub):
    import torch

    keys = set(_state(_member_paths(fairseq_layouts["old_keys"])[0])["model"])
    current = _state(_member_paths(fairseq_layouts["old_args"])[0])["model"]
    assert not any(k.endswith(("q_proj.weight", "k_proj.bias", "self_attn_layer_norm.weight")) for k in keys)
    assert {"encoder.layers.0.self_attn.in_proj_weight", "decoder.layers.0.encoder_attn.in_proj_bias",
            "encoder.layers.0.layer_norms.1.weight", "decoder.layers.0.layer_norms.2.bias",
            "decoder.embed_out", "encoder.embed_positions._float_tensor"} <= keys
    assert "decoder.output_projection.weight" not in keys
    # fairseq's upgrade gives back the very tensors of old_args
    loaded = hub(fairseq_layouts["old_keys"]).models[0].state_dict()
    assert all(torch.equal(loaded[k], current[k]) for k in current)


def test_train_spm_is_a_training_run(fairseq_layouts, hub):
    info = fairseq_layouts["train_spm"]
    run = os.path.dirname(info["data"])
    assert info["tokenizer"] == "none" and info["bpe"] == "sentencepiece" and "tokenizer" not in info["hub_kwargs"]
    assert os.path.dirname(info["source"]) == os.path.join(run, "checkpoints")
    assert os.path.isfile(os.path.join(run, "checkpoints", "checkpoint_last.pt"))
    assert info["bpe_codes"] == os.path.join(run, "sentencepiece.bpe.model")
    data = os.listdir(info["data"])
    assert {"dict.cs.txt", "dict.en.txt", "train.cs-en.cs.bin", "valid.cs-en.en.idx"} <= set(data)
    assert not filecmp.cmp(os.path.join(info["data"], "dict.cs.txt"), os.path.join(info["data"], "dict.en.txt"),
                           shallow=False)
    state = _state(info["source"])
    assert state.get("args") is None and "last_optimizer_state" in state     # as fairseq-train left it
    args = state["cfg"]["model"]
    assert args.encoder_normalize_before and args.decoder_normalize_before
    assert (args.encoder_layers, args.decoder_layers) == (2, 1)
    assert not args.share_all_embeddings and not args.share_decoder_input_output_embed
    model = hub(info).models[0]
    assert (len(model.encoder.layers), len(model.decoder.layers)) == (2, 1)
    assert model.encoder.layer_norm is not None and model.decoder.layer_norm is not None    # pre-norm's final norms
    # fairseq's sentencepiece convention: pieces joined by spaces, the dictionary holds pieces
    with open(os.path.join(info["data"], "dict.en.txt"), encoding="utf-8") as f:
        assert any(line.startswith("\u2581") for line in f)


def test_codes_files_formats(fairseq_layouts):
    with open(fairseq_layouts["hub_single"]["bpe_codes"], encoding="utf-8") as f:
        subword_nmt = f.read().splitlines()
    assert subword_nmt[0] == "#version: 0.2"
    merges = [line.split() for line in subword_nmt[1:]]
    assert merges and all(len(m) == 2 for m in merges)
    with open(fairseq_layouts["hub_ensemble"]["bpe_codes"], encoding="utf-8") as f:
        fast = [line.split(" ") for line in f.read().splitlines()]
    assert all(len(m) == 3 and m[2].isdigit() for m in fast)
    assert [m[:2] for m in fast] == merges                               # the same merges, in order
    counts = [int(m[2]) for m in fast]
    assert counts[0] > 0 and all(a >= b for a, b in zip(counts, counts[1:]))     # BPE merges the most frequent first
    for name in ("big_shrunk", "old_args", "old_keys"):
        assert filecmp.cmp(fairseq_layouts[name]["bpe_codes"], fairseq_layouts["hub_single"]["bpe_codes"],
                           shallow=False)
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=fairseq_layouts["train_spm"]["bpe_codes"])
    assert len(sp) > 50


def test_a_complete_build_is_reused(fairseq_layouts, tmp_path):
    root = os.path.dirname(fairseq_layouts["hub_single"]["source"])
    assert ff.load_built(root) == fairseq_layouts
    seconds = ff.build_seconds(root)
    assert seconds["total"] > 0
    assert ff.load_built(str(tmp_path)) is None                  # nothing built there
    (tmp_path / ff.MARKER).write_text("{")
    assert ff.load_built(str(tmp_path)) is None                  # an interrupted or foreign marker
