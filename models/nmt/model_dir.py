"""NMT model directories, local or in a bucket: what they hold, how they are checked, and the
local copy a worker loads.

A model directory (written by ``paragen-train-nmt``) holds ``model.pt``, ``model.json``,
``spm.model`` and ``dict.<lang>.txt`` for its two languages. Given as a URL (``gs://``,
``s3://``), it is copied once per machine into a local cache (``$PARAGEN_CACHE``, default
``~/.cache/paragen``), under a lock so that worker processes sharing a machine download it
once, and every file is checked against the sha256 the driver recorded in the run's manifest
before the safe loader (models/nmt/checkpoint.py) reads it: a model changed in the bucket while a job
runs is refused, not mixed in.
"""
from __future__ import annotations

import json
import os

from common import storage
from common.text import load_sentencepiece
from models.nmt.checkpoint import check_checkpoint
from models.safety import UnsafeModelError, sha256_local

MODEL_FILES = ("model.pt", "model.json", "spm.model")


def model_file_names(meta: dict) -> list[str]:
    """Every file of a model directory whose model.json is META."""
    return sorted({*MODEL_FILES, f"dict.{meta['src_lang']}.txt", f"dict.{meta['tgt_lang']}.txt"})


def read_model_meta(model_dir: str) -> dict:
    """MODEL_DIR/model.json (written by models.nmt.train), after checking the directory holds a
    whole model and that its language codes are plain codes (they name dict.<lang>.txt files)."""
    from common.names import check_lang_code

    if not storage.isdir(model_dir):
        raise FileNotFoundError(f"{model_dir}: no such model directory (train one with paragen-train-nmt)")
    missing = [f for f in MODEL_FILES if not storage.isfile(storage.join(model_dir, f))]
    if missing:
        raise FileNotFoundError(f"{model_dir}: not an NMT model directory, missing {', '.join(missing)} "
                                "(train one with paragen-train-nmt)")
    try:
        meta = json.loads(storage.read_bytes(storage.join(model_dir, "model.json")).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UnsafeModelError(f"{model_dir}/model.json is not valid JSON ({exc})") from None
    except RecursionError:
        raise UnsafeModelError(f"{model_dir}/model.json is not valid JSON (nested too deeply)") from None
    if not isinstance(meta, dict) or not meta.get("src_lang") or not meta.get("tgt_lang"):
        raise UnsafeModelError(f"{model_dir}/model.json must name src_lang and tgt_lang "
                               "(the dict.<lang>.txt files alone do not say the direction)")
    try:
        for key in ("src_lang", "tgt_lang"):
            check_lang_code(meta[key], f"{model_dir}/model.json {key}")
    except ValueError as exc:
        raise UnsafeModelError(str(exc)) from None
    for lang in (meta["src_lang"], meta["tgt_lang"]):
        if not storage.isfile(storage.join(model_dir, f"dict.{lang}.txt")):
            raise FileNotFoundError(f"{model_dir}: missing dict.{lang}.txt")
    return meta


def local_model_dir(model_dir: str, expected: dict | None = None) -> str:
    """A local directory holding MODEL_DIR: MODEL_DIR itself when it is local, else a copy in the
    cache (common.storage.local_copy), downloaded once per machine. EXPECTED ({file name:
    sha256}, from the run's manifest) is checked file by file; a mismatch raises UnsafeModelError."""
    if storage.is_local(model_dir):
        return storage.resolve(model_dir)[1]
    target = storage.local_copy(model_dir, model_file_names(read_model_meta(model_dir)))
    for name, sha in sorted((expected or {}).items()):
        got = sha256_local(os.path.join(target, name))
        if got != sha:
            raise UnsafeModelError(f"{model_dir}/{name} changed since the job started (sha256 {got[:12]}..., "
                                   f"the manifest recorded {sha[:12]}...)")
    return target


def dictionary_size(path: str) -> int:
    """Symbols of the fairseq dictionary file PATH, fairseq's own 4 special ones included, read
    with fairseq's parser; UnsafeModelError (one line) when it is not such a file."""
    from fairseq.data import Dictionary

    try:
        with open(path, encoding="utf-8") as f:
            return len(Dictionary.load(f))
    except (ValueError, RuntimeError, UnicodeDecodeError, IndexError) as exc:
        raise UnsafeModelError(f"{path}: not a fairseq dictionary ({str(exc).splitlines()[0][:200]})") from None


def check_model_dir(model_dir: str) -> dict:
    """Everything about MODEL_DIR that can be checked without building the model: its files, its
    languages, its checkpoint (see models.nmt.checkpoint.check_checkpoint). Returns model.json plus
    max_source_positions, max_target_positions and sha256 (file name -> digest) of the local
    copy that was checked (the copy in the cache for a bucket URL)."""
    meta = read_model_meta(model_dir)
    local = local_model_dir(model_dir)
    cfg, weights = check_checkpoint(os.path.join(local, "model.pt"), with_weights=True)
    try:
        load_sentencepiece(os.path.join(local, "spm.model"))
    except ValueError as exc:
        raise UnsafeModelError(str(exc)) from None
    # the dictionaries must be fairseq's and fit the embeddings, or the model fails on a worker
    for lang, table in ((meta["src_lang"], "encoder.embed_tokens.weight"), (meta["tgt_lang"], "decoder.embed_tokens.weight")):
        size = dictionary_size(os.path.join(local, f"dict.{lang}.txt"))
        rows = weights[table].shape[0] if table in weights else None
        if rows is not None and rows != size:
            raise UnsafeModelError(f"{model_dir}/dict.{lang}.txt has {size} symbols with fairseq's 4 special ones, "
                                   f"but the checkpoint's {table} has {rows} rows: not this model's dictionary")
    return {**meta, "max_source_positions": getattr(cfg, "max_source_positions", None) or 1024,
            "max_target_positions": getattr(cfg, "max_target_positions", None) or 1024,
            "sha256": {name: sha256_local(os.path.join(local, name)) for name in model_file_names(meta)}}
