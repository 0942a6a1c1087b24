"""Hostile model directories: a checkpoint whose config carries code, a pickled model, unknown
architectures or tasks are refused before fairseq builds anything, and nothing they carry runs.

Every test plants code that would create a marker file if it ever ran, then checks the marker.
"""
import argparse
import os
import shutil
import subprocess
import sys

import pytest
import torch

from models.nmt.model_files.checkpoint import (UnsafeModelError, build_translation_model, check_checkpoint, load_state,
                                               validate_model_config)
from models.nmt.model_files.model_dir import check_model_dir
from models.nmt.model_files.checkpoint import allow_fairseq_checkpoints

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _payload(marker) -> str:
    return f"__import__('pathlib').Path({str(marker)!r}).touch() or [1]"


def hostile_model(src_dir: str, dst_dir, edit) -> str:
    """A copy of the model directory SRC_DIR whose checkpoint state was changed by EDIT(state)."""
    shutil.copytree(src_dir, dst_dir)
    allow_fairseq_checkpoints()
    state = torch.load(os.path.join(src_dir, "model.pt"), map_location="cpu", weights_only=True)
    edit(state)
    torch.save(state, os.path.join(dst_dir, "model.pt"))
    return str(dst_dir)


def set_model_field(name, value):
    def edit(state):
        setattr(state["cfg"]["model"], name, value)
    return edit


# Every kind of field whose value could be a string, with a value carrying code:
# choices (arch, activation_fn), the evaluated literal (adaptive_softmax_cutoff), fields that must
# stay unset (paths, xFormers config, layers to keep), and a number field given a string.
KEPT_FIELDS = ["arch", "_name", "activation_fn", "adaptive_softmax_cutoff", "encoder_embed_path",
               "decoder_xformers_att_config", "encoder_layers_to_keep", "encoder_layers", "dropout",
               "share_all_embeddings"]


@pytest.mark.slow
@pytest.mark.parametrize("field", KEPT_FIELDS)
def test_code_in_a_kept_config_field_is_refused_and_never_runs(tiny_nmt_models, tmp_path, field):
    marker = tmp_path / "ran"
    model = hostile_model(os.path.join(tiny_nmt_models, "cs-en"), tmp_path / "m",
                          set_model_field(field, _payload(marker)))
    with pytest.raises(UnsafeModelError, match=repr(field)):
        check_model_dir(model)
    with pytest.raises(UnsafeModelError, match=repr(field)):
        build_translation_model(model, "cs", "en")
    assert not marker.exists()


@pytest.mark.slow
@pytest.mark.parametrize("field", ["user_dir", "eval_bleu_args", "adam_betas", "optimizer_overrides", "data"])
def test_code_in_other_config_fields_is_dropped_before_fairseq(tiny_nmt_models, tmp_path, field):
    """Fields outside the allowlist never reach fairseq: the model builds, nothing runs."""
    marker = tmp_path / "ran"
    model = hostile_model(os.path.join(tiny_nmt_models, "cs-en"), tmp_path / "m",
                          set_model_field(field, _payload(marker)))
    built, _task = build_translation_model(model, "cs", "en")
    assert not hasattr(built.args, field) and not hasattr(built.cfg, field)
    assert not marker.exists()


@pytest.mark.slow
def test_fairseqs_own_loader_would_run_the_payload(tiny_nmt_models, tmp_path):
    """The control: the hole is real, so the tests above could fail."""
    from fairseq import checkpoint_utils

    marker = tmp_path / "ran"
    model = hostile_model(os.path.join(tiny_nmt_models, "cs-en"), tmp_path / "m",
                          set_model_field("adaptive_softmax_cutoff", _payload(marker)))
    allow_fairseq_checkpoints()
    try:
        checkpoint_utils.load_model_ensemble_and_task(
            [os.path.join(model, "model.pt")], arg_overrides={"data": model, "source_lang": "cs", "target_lang": "en"})
    except Exception:       # the payload's return value is not a usable cutoff list
        pass
    assert marker.exists()


def test_literal_cutoff_is_parsed_not_evaluated():
    cfg = validate_model_config(argparse.Namespace(arch="transformer", adaptive_softmax_cutoff="(50, 90)"))
    assert cfg.adaptive_softmax_cutoff == "[50, 90]"              # canonical: all fairseq will eval
    for bad in ("[1, 2] + [3]", "[True]", "[]", "[-1]", "'x'", "[1" * 200):
        with pytest.raises(UnsafeModelError, match="adaptive_softmax_cutoff"):
            validate_model_config(argparse.Namespace(arch="transformer", adaptive_softmax_cutoff=bad))


@pytest.mark.parametrize("field,value", [("encoder_layers", True), ("encoder_layers", -1), ("dropout", float("nan")),
                                         ("share_all_embeddings", 1), ("activation_fn", "${oc.env:HOME}"),
                                         ("adaptive_input", True), ("base_layers", 2)])
def test_wrong_value_types_are_refused(field, value):
    with pytest.raises(UnsafeModelError, match=field):
        validate_model_config(argparse.Namespace(arch="transformer", **{field: value}))


def test_hydra_style_nested_config_is_flattened_and_checked():
    cfg = validate_model_config({"_name": "transformer", "encoder": {"layers": 2, "embed_dim": 64},
                                 "decoder": {"layers": 1}, "checkpoint": {"save_dir": "/x"}})
    assert (cfg.arch, cfg.encoder_layers, cfg.encoder_embed_dim, cfg.decoder_layers) == ("transformer", 2, 64, 1)
    assert not hasattr(cfg, "checkpoint") and not hasattr(cfg, "checkpoint_save_dir")
    with pytest.raises(UnsafeModelError, match="encoder_embed_path"):
        validate_model_config({"_name": "transformer", "encoder": {"embed_path": "/etc/passwd"}})


@pytest.mark.slow
def test_other_architectures_and_tasks_are_refused(tiny_nmt_models, tmp_path):
    fconv = hostile_model(os.path.join(tiny_nmt_models, "cs-en"), tmp_path / "fconv",
                          set_model_field("arch", "fconv"))
    with pytest.raises(UnsafeModelError, match="architecture 'fconv' is not supported"):
        check_checkpoint(os.path.join(fconv, "model.pt"))

    def lm_task(state):
        state["cfg"]["task"]["_name"] = "language_modeling"
    lm = hostile_model(os.path.join(tiny_nmt_models, "cs-en"), tmp_path / "lm", lm_task)
    with pytest.raises(UnsafeModelError, match="task 'language_modeling'"):
        check_checkpoint(os.path.join(lm, "model.pt"))


@pytest.mark.slow
def test_a_pickled_model_is_refused_with_a_message(tiny_nmt_models, tmp_path):
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (eval, (_payload(marker),))

    model = tmp_path / "m"
    shutil.copytree(os.path.join(tiny_nmt_models, "cs-en"), model)
    torch.save({"model": Evil()}, model / "model.pt")
    with pytest.raises(UnsafeModelError, match="pickled Python objects"):
        load_state(str(model / "model.pt"))
    with pytest.raises(UnsafeModelError):
        check_model_dir(str(model))
    (model / "model.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(UnsafeModelError, match="not a readable PyTorch checkpoint|pickled"):
        load_state(str(model / "model.pt"))
    assert not marker.exists()


@pytest.mark.slow
def test_model_json_languages_cannot_name_other_files(tiny_nmt_models, tmp_path):
    import json

    model = tmp_path / "m"
    shutil.copytree(os.path.join(tiny_nmt_models, "cs-en"), model)
    meta = json.loads((model / "model.json").read_text())
    (model / "model.json").write_text(json.dumps({**meta, "src_lang": "../../etc/x"}))
    with pytest.raises(UnsafeModelError, match="not a language code"):
        check_model_dir(str(model))


@pytest.mark.slow
def test_fairseq_cli_wrapper_hands_fairseq_a_sanitized_checkpoint(tiny_nmt_models, tmp_path):
    """fairseq-generate through models.nmt.model_files.fairseq_compat (the benchmark's baseline): a hostile
    checkpoint is refused with one line; a good one is sanitized and decodes."""
    marker = tmp_path / "ran"
    model = hostile_model(os.path.join(tiny_nmt_models, "cs-en"), tmp_path / "m",
                          set_model_field("adaptive_softmax_cutoff", _payload(marker)))
    data = os.path.join(tiny_nmt_models, "data-bin")
    cmd = [sys.executable, "-m", "models.nmt.model_files.fairseq_compat", "generate", data, "--gen-subset", "valid",
           "--source-lang", "cs", "--target-lang", "en", "--cpu", "--beam", "2", "--max-sentences", "4",
           "--max-len-b", "5"]
    bad = subprocess.run(cmd + ["--path", os.path.join(model, "model.pt")], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode != 0 and "adaptive_softmax_cutoff" in bad.stderr and "Traceback" not in bad.stderr
    assert not marker.exists()
    good = subprocess.run(cmd + ["--path", os.path.join(tiny_nmt_models, "cs-en", "model.pt")], cwd=ROOT,
                          capture_output=True, text=True)
    assert good.returncode == 0, good.stderr[-2000:]
    assert sum(line.startswith("H-") for line in good.stdout.splitlines()) > 0


def test_a_saved_model_file_has_the_same_bytes_for_the_same_tensors(tmp_path):
    """Model files are written whole (a temporary name, then a rename) and their bytes depend on
    the tensors only: a manifest's sha256 of a retrained model is the same when its weights are.
    torch.save given the temporary file's name would name the archive's folder after it."""
    import hashlib

    from models.safety import load_tensor_file, save_torch_file

    state = {"w": torch.arange(12.0).reshape(3, 4), "b": torch.zeros(4)}
    first, second = tmp_path / "a" / "weights.pt", tmp_path / "b" / "weights.pt"
    save_torch_file(state, str(first))
    save_torch_file({k: v.clone() for k, v in state.items()}, str(second))
    assert hashlib.sha256(first.read_bytes()).digest() == hashlib.sha256(second.read_bytes()).digest()
    assert all(torch.equal(load_tensor_file(str(first))[k], v) for k, v in state.items())
    assert sorted(p.name for p in first.parent.iterdir()) == ["weights.pt"]      # no temporary file left
