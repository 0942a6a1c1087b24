"""Loading a fairseq translation checkpoint without letting anything in it run code.

``torch.load(weights_only=True)`` only unpickles tensors, plain containers and the allowlisted
``argparse.Namespace`` (allow_fairseq_checkpoints, below), but that is not enough: while fairseq builds a
model it calls ``eval()`` on string fields of the checkpoint's config (``adaptive_softmax_cutoff``
through ``utils.eval_str_list``, the xFormers attention config through ``eval_str_dict``; other
architectures ``eval`` their layer specs), imports ``user_dir`` modules, reads embedding files
from paths and picks task and model classes by name. So a checkpoint is loaded here in three steps:

1. unpickle with ``weights_only=True`` (a file holding other objects is refused);
2. :func:`validate_model_config`: the model's config is checked against an allowlist of
   architecture fields (:data:`FIELDS`), each with its value type: numbers and booleans of the
   right type and range, strings only where a choice (``activation_fn``, ``arch``) or a literal
   (``adaptive_softmax_cutoff``, parsed with ``ast.literal_eval`` and rewritten canonically) is
   expected, ``None`` where a field would make fairseq read a file or eval a string. Every other
   field (training options, paths of the training run) is dropped, so fairseq never sees it;
3. fairseq builds the model from the clean config only, for the ``translation`` task with our
   own task settings, and loads the tensors with ``strict=True``.

The same validation is applied on the driver before a job writes anything
(:func:`check_checkpoint`) and to checkpoints handed to fairseq's own command-line tools
(:func:`sanitized_copy`).
"""
from __future__ import annotations

import argparse
import ast
import math
import os
import zipfile
from dataclasses import dataclass

from models.nmt.model_files.fairseq_import import import_fairseq
from models.safety import UnsafeModelError, save_torch_file, weights_only_load

ARCHS = frozenset({"transformer", "transformer_tiny", "transformer_iwslt_de_en", "transformer_wmt_en_de",
                   "transformer_vaswani_wmt_en_de_big", "transformer_vaswani_wmt_en_fr_big",
                   "transformer_wmt_en_de_big", "transformer_wmt_en_de_big_t2t"})
ACTIVATIONS = frozenset({"relu", "gelu", "gelu_fast", "gelu_accurate", "tanh", "linear", "swish"})
_MAX_INT = 1 << 31


_DONE = False


def allow_fairseq_checkpoints() -> None:
    """Register the globals fairseq checkpoints need with torch's safe unpickler (idempotent)."""
    global _DONE
    if _DONE:
        return
    import torch

    torch.serialization.add_safe_globals([argparse.Namespace])
    _DONE = True


@dataclass(frozen=True)
class _Field:
    kind: str                 # int | float | bool | choice | int_list | none | false | zero
    choices: frozenset = frozenset()


_INT, _FLOAT, _BOOL = _Field("int"), _Field("float"), _Field("bool")
# The fields TransformerConfig and fairseq's legacy transformer architectures read. Anything else
# in a checkpoint's model config is dropped before fairseq builds the model.
FIELDS: dict[str, _Field] = {
    "arch": _Field("choice", ARCHS), "_name": _Field("choice", ARCHS),
    "activation_fn": _Field("choice", ACTIVATIONS),
    **{f"{side}_{name}": _INT for side in ("encoder", "decoder")
       for name in ("embed_dim", "ffn_embed_dim", "layers", "attention_heads")},
    "decoder_input_dim": _INT, "decoder_output_dim": _INT,
    "max_source_positions": _INT, "max_target_positions": _INT,
    "quant_noise_pq_block_size": _INT, "min_params_to_wrap": _INT, "base_sublayers": _INT, "base_shuffle": _INT,
    **{name: _FLOAT for name in ("dropout", "attention_dropout", "activation_dropout", "relu_dropout",
                                 "encoder_layerdrop", "decoder_layerdrop", "adaptive_softmax_dropout",
                                 "adaptive_softmax_factor", "quant_noise_pq", "quant_noise_scalar")},
    **{name: _BOOL for name in ("encoder_normalize_before", "encoder_learned_pos", "decoder_normalize_before",
                                "decoder_learned_pos", "share_decoder_input_output_embed",
                                "share_all_embeddings", "merge_src_tgt_embed", "no_token_positional_embeddings",
                                "layernorm_embedding", "tie_adaptive_weights", "tie_adaptive_proj",
                                "no_scale_embedding", "checkpoint_activations", "offload_activations",
                                "cross_self_attention", "no_cross_attention", "export", "no_decoder_final_norm")},
    # fairseq evals this string (utils.eval_str_list): only a literal list of ints passes, rewritten
    "adaptive_softmax_cutoff": _Field("int_list"),
    # these would make fairseq read a file, eval a string or build unsupported layers: must be unset
    **{name: _Field("none") for name in ("encoder_embed_path", "decoder_embed_path", "encoder_layers_to_keep",
                                         "decoder_layers_to_keep", "encoder_xformers_att_config",
                                         "decoder_xformers_att_config", "encoder__name", "decoder__name",
                                         "quant_noise__name")},
    "adaptive_input": _Field("false"), "char_inputs": _Field("false"), "base_layers": _Field("zero"),
}
# Nested (hydra-style) model configs name these groups; they are flattened to <group>_<field>.
_GROUPS = ("encoder", "decoder", "quant_noise")


def _check_value(name: str, spec: _Field, value):
    """The value fairseq may see for field NAME, or UnsafeModelError."""
    def bad(expected: str):
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise UnsafeModelError(f"model config field {name!r} must be {expected}, not {shown}")

    if spec.kind == "int":
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MAX_INT):
            return value
        bad("a non-negative integer")
    if spec.kind == "float":
        if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)):
            return value
        bad("a finite number")
    if spec.kind == "bool":
        if value is None or isinstance(value, bool):
            return value
        bad("true or false")
    if spec.kind == "false":
        if value is None or value is False:
            return value
        bad("false (not supported)")
    if spec.kind == "zero":
        if value is None or (type(value) is int and value == 0):
            return value
        bad("0 (not supported)")
    if spec.kind == "none":
        if value is None:
            return None
        bad("unset (None): it would make fairseq read a file or evaluate a string")
    if spec.kind == "choice":
        if isinstance(value, str) and value in spec.choices:
            return value
        bad(f"one of {sorted(spec.choices)}")
    if spec.kind == "int_list":
        if value is None:
            return None
        parsed = value
        if isinstance(value, str):
            try:
                parsed = ast.literal_eval(value)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                bad("a literal list of integers such as '[8000, 20000]'")
        if isinstance(parsed, (list, tuple)) and parsed and all(
                isinstance(x, int) and not isinstance(x, bool) and 0 < x < _MAX_INT for x in parsed):
            return repr([int(x) for x in parsed])       # canonical: all fairseq's eval can see
        bad("a literal list of positive integers such as '[8000, 20000]'")
    raise AssertionError(spec.kind)


def _flatten(model_cfg) -> dict:
    if isinstance(model_cfg, argparse.Namespace):
        items = vars(model_cfg)
    elif isinstance(model_cfg, dict):
        items = model_cfg
    else:
        raise UnsafeModelError(f"model config is a {type(model_cfg).__name__}, not a Namespace or a mapping")
    flat = {}
    for key, value in items.items():
        if not isinstance(key, str):
            raise UnsafeModelError(f"model config has a non-string key {key!r}")
        if key in _GROUPS and isinstance(value, dict):
            for sub, v in value.items():
                if not isinstance(sub, str):
                    raise UnsafeModelError(f"model config group {key!r} has a non-string key {sub!r}")
                flat[f"{key}_{sub}"] = v
        else:
            flat[key] = value
    return flat


def validate_model_config(model_cfg) -> argparse.Namespace:
    """The allowlisted, checked fields of a checkpoint's model config (an argparse.Namespace or a
    hydra-style mapping) as a new Namespace; every other field is dropped. UnsafeModelError when
    a kept field has a value of the wrong type, or the architecture is not a fairseq transformer."""
    flat = _flatten(model_cfg)
    for name in ("arch", "_name"):
        if flat.get(name) is not None and flat[name] not in ARCHS:
            raise UnsafeModelError(f"model config field {name!r}: architecture {flat[name]!r} is not supported; "
                                   f"expected one of {sorted(ARCHS)}")
    clean = {name: _check_value(name, FIELDS[name], value) for name, value in flat.items() if name in FIELDS}
    arch = clean.get("arch") or clean.get("_name")
    if arch is None:
        raise UnsafeModelError("model config names no architecture ('arch' or '_name')")
    clean["arch"] = clean["_name"] = arch
    return argparse.Namespace(**clean)


def _task_name(state: dict) -> str | None:
    cfg, args = state.get("cfg"), state.get("args")
    if isinstance(args, argparse.Namespace):
        return getattr(args, "task", None)
    if isinstance(cfg, dict):
        task = cfg.get("task")
        if isinstance(task, dict):
            return task.get("_name")
        if isinstance(task, argparse.Namespace):
            return getattr(task, "_name", None) or getattr(task, "task", None)
        model = cfg.get("model")
        if isinstance(model, argparse.Namespace):
            return getattr(model, "task", None)
    return None


def model_config_of(state) -> argparse.Namespace:
    """The validated model config of an unpickled checkpoint STATE (fairseq's layout: 'args' for
    old checkpoints, 'cfg'['model'] for new ones), after checking it is a translation model."""
    if not isinstance(state, dict):
        raise UnsafeModelError(f"checkpoint holds a {type(state).__name__}, not fairseq's dict")
    task = _task_name(state)
    if task not in (None, "translation"):
        raise UnsafeModelError(f"checkpoint was trained for the fairseq task {task!r}; only 'translation' "
                               "models are supported")
    if isinstance(state.get("args"), argparse.Namespace):
        return validate_model_config(state["args"])
    cfg = state.get("cfg")
    if isinstance(cfg, dict) and cfg.get("model") is not None:
        return validate_model_config(cfg["model"])
    raise UnsafeModelError("checkpoint has neither 'args' nor 'cfg.model': not a fairseq checkpoint")


def weights_of(state) -> dict:
    import torch

    weights = state.get("model")
    if not isinstance(weights, dict) or not weights:
        raise UnsafeModelError("checkpoint has no 'model' state dict")
    for key, value in weights.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise UnsafeModelError(f"checkpoint's 'model' entry {key!r} is not a named tensor")
    return weights


def load_state(path: str, mmap: bool = False) -> dict:
    """Unpickle PATH with torch's weights-only loader; a file holding any other Python object
    (a pickled model, code) is refused with UnsafeModelError, never unpickled."""
    allow_fairseq_checkpoints()
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file")
    # mmap needs torch's zip format; a legacy (plain pickle) file is read whole
    return weights_only_load(path, mmap=mmap and zipfile.is_zipfile(path))


def check_checkpoint(path: str, with_weights: bool = False):
    """Validate the checkpoint at PATH without building a model (memory-mapped: cheap on a
    driver): its validated model config (and, WITH_WEIGHTS, its memory-mapped tensors by name),
    or UnsafeModelError / FileNotFoundError."""
    state = load_state(path, mmap=True)
    cfg = model_config_of(state)
    weights = weights_of(state)
    return (cfg, weights) if with_weights else cfg


def build_translation_model(model_dir: str, src_lang: str, tgt_lang: str):
    """(model, task) for the checkpoint MODEL_DIR/model.pt and the dictionaries beside it, built
    by fairseq from the validated config only (see the module doc). Runs on CPU; the caller moves
    the model."""
    import_fairseq()
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    state = load_state(os.path.join(model_dir, "model.pt"))
    args = model_config_of(state)
    weights = weights_of(state)
    del state
    task = TranslationTask.setup_task(TranslationConfig(data=model_dir, source_lang=src_lang, target_lang=tgt_lang))
    model = task.build_model(args)
    model.load_state_dict(weights, strict=True, model_cfg=args)
    return model, task


def sanitized_copy(src: str, dst: str) -> None:
    """Write to DST a checkpoint holding only SRC's validated model config and its tensors, in
    fairseq's layout, for fairseq's own tools (fairseq-generate, converters) to load."""
    state = load_state(src)
    args = model_config_of(state)
    args.task = "translation"
    clean = {"args": None, "cfg": {"model": args, "task": {"_name": "translation"}},
             "model": weights_of(state),
             "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "FairseqAdam",
                                    "lr_scheduler_state": {}, "num_updates": 0}],
             "extra_state": {"train_iterator": None}}
    save_torch_file(clean, dst)
