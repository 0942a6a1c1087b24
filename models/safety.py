"""Loading model files of any kind without running what is in them.

A model file is hostile input: ``torch.load`` unpickles with ``weights_only=True`` only (tensors,
plain containers, allowlisted classes), a file holding any other Python object is refused with
one line (:class:`UnsafeModelError`), and a model directory is checked file by file against the
sha256 the driver recorded before a worker reads it. Every kind of model of the project (the NMT
engines in models/nmt/, the bitext models in models/bitext/, the sentence encoders in
models/sentence/) loads through here.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import zipfile

from common import storage
from common.atomic import replacing
from common.cli import UsageError


class UnsafeModelError(UsageError):
    """A model file or config that is refused before any of it reaches fairseq."""


def weights_only_load(path: str, mmap: bool = False):
    """torch.load(weights_only=True), its refusals turned into one-line UnsafeModelErrors."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        # torch's message suggests weights_only=False; only its diagnosis is worth repeating
        found = re.search(r"Unsupported (global: GLOBAL \S+|operand \S+)", str(exc))
        raise UnsafeModelError(f"{path}: refused: it holds pickled Python objects other than tensors"
                               + (f" (unpickling stopped at: {found.group(1)})" if found else "")) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as exc:
        raise UnsafeModelError(f"{path}: not a readable PyTorch file ({str(exc).splitlines()[0]})") from None


def load_tensor_file(path: str) -> dict:
    """A state dict file written by torch.save({name: tensor}) (encoder and classifier weights):
    loaded weights-only, refused with UnsafeModelError if it holds anything but named tensors."""
    import torch

    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file")
    state = weights_only_load(path)
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise UnsafeModelError(f"{path}: not a state dict of named tensors")
    return state


def save_torch_file(obj, path: str) -> str:
    """torch.save(OBJ) at PATH, whole or not at all (a temporary file renamed), and the same bytes
    for the same tensors: given a file name, torch names the archive's folder after it, so the
    temporary name would make every save's bytes, and the sha256 a manifest records, differ."""
    import torch

    with replacing(path) as tmp:
        with open(tmp, "wb") as f:
            torch.save(obj, f)             # a file object: the archive is always named "archive"
    return path


def sha256_local(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def open_model_dir(path: str, files, what: str) -> tuple[str, dict]:
    """(local directory, parsed config.json) of a model directory of any kind that must hold
    FILES: PATH itself, or for a bucket URL a copy of FILES in the cache. A missing file is
    FileNotFoundError naming WHAT the directory should be; a config.json that is not JSON is
    UnsafeModelError. The caller validates the config's fields."""
    if storage.is_url(path):
        path = storage.local_copy(path, names=list(files))
    missing = [f for f in files if not os.path.isfile(os.path.join(path, f))]
    if missing:
        raise FileNotFoundError(f"{path} is not a {what} directory: missing {', '.join(missing)}")
    config_path = os.path.join(path, "config.json")
    try:
        with open(config_path, encoding="utf-8") as f:
            return path, json.load(f)
    except (ValueError, UnicodeDecodeError) as exc:     # json.JSONDecodeError is a ValueError
        raise UnsafeModelError(f"{config_path}: not valid JSON ({exc})") from None
    except RecursionError:
        raise UnsafeModelError(f"{config_path}: not valid JSON (nested too deeply)") from None


def verified_model_dir(model_dir: str, expected: dict) -> str:
    """A local directory holding the files EXPECTED names ({file name: sha256}, recorded by the
    driver) of MODEL_DIR, local or a URL (copied to the cache), each checked: a model changed
    since the job started is refused with UnsafeModelError, never mixed into a run. For model
    directories of any kind (the bitext models); NMT directories use local_model_dir."""
    target = storage.local_copy(model_dir, sorted(expected))
    for name, sha in sorted(expected.items()):
        got = sha256_local(os.path.join(target, name))
        if got != sha:
            raise UnsafeModelError(f"{model_dir}/{name} changed since the job started (sha256 {got[:12]}..., "
                                   f"the manifest recorded {sha[:12]}...)")
    return target
