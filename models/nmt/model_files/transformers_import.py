"""paragen-import-model --engine ctranslate2 for a transformers directory: Marian (OPUS-MT),
M2M-100 and NLLB-200 models, converted with CTranslate2's own converter.

A transformers directory is hostile input like a checkpoint, so before anything runs:

* ``config.json`` must be a known family (``marian``, or ``m2m_100`` for M2M-100 and NLLB) and
  name no code to run (``auto_map``: the converter never runs with ``trust_remote_code``);
* the weights must load without unpickling: ``model.safetensors`` (or safetensors shards), or a
  ``pytorch_model.bin`` that torch's weights-only loader accepts;
* the tokenizer files the engine uses (Marian: ``source.spm`` and ``target.spm``; M2M-100 and NLLB:
  ``sentencepiece.bpe.model``) must be sentencepiece models, and a multilingual model's language
  codes (``--src_lang_code``, ``--tgt_lang_code``; M2M-100 defaults to ``__cs__``-style codes)
  must be in its vocabulary.

Nothing is fetched from a model hub (``HF_HUB_OFFLINE=1`` while converting): download a model
once, elsewhere (``huggingface-cli download Helsinki-NLP/opus-mt-cs-en --local-dir ...``), then
import the directory offline.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time

from common.cli import UsageError
from models.nmt.model_files.model_dir import FORMAT_IMPORTED, META
from models.safety import UnsafeModelError

log = logging.getLogger("paragen.import")
MAX_CONFIG_BYTES = 1 << 20
TOKENIZER_FILES = {"marian": ("source.spm", "target.spm"), "m2m100": ("sentencepiece.bpe.model",),
                   "nllb": ("sentencepiece.bpe.model",)}


def _config(source: str) -> dict:
    path = os.path.join(source, "config.json")
    if os.path.getsize(path) > MAX_CONFIG_BYTES:
        raise UsageError(f"{path}: {os.path.getsize(path):,} bytes is not a model config")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise UnsafeModelError(f"{path}: not valid JSON ({str(exc)[:100]})") from None
    if not isinstance(config, dict):
        raise UnsafeModelError(f"{path}: not a model config (a JSON object)")
    if config.get("auto_map") or config.get("trust_remote_code"):
        raise UnsafeModelError(f"{path} asks for code of its own (auto_map): refused, models are read without "
                               "remote code")
    return config


def family_of(source: str, config: dict) -> str:
    """marian, m2m100 or nllb; UsageError naming what is supported otherwise."""
    kind = config.get("model_type")
    if kind == "marian":
        return "marian"
    if kind == "m2m_100":
        tokenizer_config = os.path.join(source, "tokenizer_config.json")
        if os.path.isfile(tokenizer_config) and os.path.getsize(tokenizer_config) < MAX_CONFIG_BYTES:
            with open(tokenizer_config, encoding="utf-8", errors="replace") as f:
                if "Nllb" in f.read():
                    return "nllb"
        return "m2m100"
    raise UsageError(f"{source}: model_type {kind!r} is not supported by this import; supported: marian "
                     "(OPUS-MT), m2m_100 (M2M-100, NLLB-200); fairseq checkpoints import as fairseq models")


def check_weights(source: str) -> str:
    """The weights file(s) SOURCE holds, refused unless they load without unpickling."""
    names = os.listdir(source)
    safetensors = [n for n in names if n.endswith(".safetensors")]
    if safetensors:
        return ",".join(sorted(safetensors))
    bins = [n for n in names if n.startswith("pytorch_model") and n.endswith(".bin")]
    if not bins:
        raise UsageError(f"{source}: no model.safetensors or pytorch_model.bin")
    from models.safety import weights_only_load

    for name in bins:                       # refused by torch's weights-only unpickler if it holds code
        weights_only_load(os.path.join(source, name))
    return ",".join(sorted(bins))


def _lang_codes(family: str, src_lang: str, tgt_lang: str, src_code: str | None, tgt_code: str | None) -> dict | None:
    if family == "marian":
        if src_code or tgt_code:
            raise UsageError("--src_lang_code/--tgt_lang_code are for multilingual models (M2M-100, NLLB), "
                             "not Marian")
        return None
    if family == "m2m100":
        src_code, tgt_code = src_code or f"__{src_lang}__", tgt_code or f"__{tgt_lang}__"
    if not (src_code and tgt_code):
        raise UsageError("an NLLB model needs --src_lang_code and --tgt_lang_code (e.g. ces_Latn, eng_Latn)")
    return {"src": src_code, "tgt": tgt_code}


def import_transformers(source: str, src_lang: str, tgt_lang: str, output: str, compute_type: str,
                        src_code: str | None = None, tgt_code: str | None = None, overwrite: bool = False) -> dict:
    """Check the transformers directory SOURCE, convert it for CTranslate2 and write the model
    directory OUTPUT (models/nmt/model_files/model_dir.py); returns its model.json. Nothing is written when a
    check fails."""
    from common.cli import check_output_location
    from common.names import check_lang_code
    from models.nmt.model_files.model_dir import check_model_dir, ct2_files, ct2_vocabulary, publish_dir, write_meta
    from models.nmt.model_files.tokenization import check_codes

    src_lang, tgt_lang = check_lang_code(src_lang, "--src_lang"), check_lang_code(tgt_lang, "--tgt_lang")
    if src_lang == tgt_lang:
        raise UsageError(f"--src_lang and --tgt_lang are both {src_lang!r}")
    output = check_output_location(output)
    if os.path.exists(output) and os.listdir(output) and not overwrite:
        raise UsageError(f"{output} already exists and is not empty; pass --overwrite to replace it")
    config = _config(source)
    family = family_of(source, config)
    weights = check_weights(source)
    files = TOKENIZER_FILES[family]
    for name in files:
        path = os.path.join(source, name)
        if not os.path.isfile(path):
            raise UsageError(f"{source}: no {name}: a {family} directory brings its sentencepiece model(s)")
        try:
            check_codes(path, "spm")
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    codes = _lang_codes(family, src_lang, tgt_lang, src_code, tgt_code)
    parent = os.path.dirname(output)
    os.makedirs(parent, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{os.path.basename(output)}.ct2-", dir=parent) as work:
        converted, staging = os.path.join(work, "converted"), os.path.join(work, "staging")
        before = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
        os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        try:
            from ctranslate2.converters import TransformersConverter

            TransformersConverter(source, trust_remote_code=False).convert(converted, quantization=compute_type,
                                                                          force=True)
        except (ValueError, RuntimeError, OSError, KeyError, NotImplementedError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UsageError(f"{source}: CTranslate2 cannot convert this model ({first[:300]})") from None
        finally:
            for k, v in before.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        os.makedirs(staging)
        model_files = ct2_files(converted, staging)
        vocab = set(ct2_vocabulary(staging, "target")) | set(ct2_vocabulary(staging, "source"))
        size = len(ct2_vocabulary(staging, "target"))
        # the converter drops Marian's <pad>, the last entry (CTranslate2 never generates it)
        expected = {config.get("vocab_size")} | ({config["vocab_size"] - 1} if family == "marian" and
                                                  config.get("vocab_size") else set())
        if config.get("vocab_size") and size not in expected:
            raise UsageError(f"{source}: the tokenizer's vocabulary ({size} tokens) does not match the model's "
                             f"({config['vocab_size']}); are its language codes listed in tokenizer_config.json?")
        if codes:
            missing = [c for c in codes.values() if c not in vocab]
            if missing:
                raise UsageError(f"language code {missing[0]!r} is not in the model's vocabulary (M2M-100 codes look "
                                 "like __en__, NLLB's like eng_Latn)")
        for name in files:
            shutil.copyfile(os.path.join(source, name), os.path.join(staging, name))
        tokenization = {"tokenizer": "none", "bpe": "spm", "codes": files[-1]}
        if family == "marian":
            tokenization["source_codes"] = "source.spm"
        positions = int(config.get("max_position_embeddings") or 1024)
        meta = write_meta(staging, {
            "format": FORMAT_IMPORTED, "engine": "ctranslate2", "family": family, "compute_type": compute_type,
            "src_lang": src_lang, "tgt_lang": tgt_lang, "model_files": model_files, "tokenization": tokenization,
            **({"lang_codes": codes} if codes else {}), "arch": (config.get("architectures") or [family])[0],
            "max_source_positions": positions, "max_target_positions": positions,
            "imported_from": {"source": os.path.abspath(source), "weights": weights,
                              "converter": "ctranslate2.converters.TransformersConverter",
                              "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}})
        check_model_dir(staging)
        publish_dir(staging, output)
    log.info("imported %s (%s) %s -> %s for CTranslate2 (%s) into %s", family, source, src_lang, tgt_lang,
             compute_type, output)
    return meta


__all__ = ["import_transformers", "family_of", "check_weights", "META"]
