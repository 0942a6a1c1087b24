"""NMT model directories, local or in a bucket: what they hold, how they are checked, and the
local copy a worker loads.

Two layouts, told apart by ``model.json``:

* written by ``paragen-train-nmt`` (format 1): ``model.pt`` (a fairseq checkpoint),
  ``spm.model``, ``dict.<src>.txt``, ``dict.<tgt>.txt`` and ``model.json`` naming the languages;
* written by ``paragen-import-model`` (format 2, models/nmt/importing.py): one or more members
  (an ensemble), each ``memberN.pt`` (named tensors only, nothing else pickled) and
  ``memberN.json`` (its checked model config), the two dictionaries, the tokenization's files
  (``bpecodes`` or ``sentencepiece.bpe.model``) and ``model.json``, which names the direction,
  the members, the tokenization and the sha256 of every file.

:func:`read_model_meta` gives both as one description (members, tokenization, files).

Given as a URL (``gs://``, ``s3://``), a model directory is copied once per machine into a local
cache (``$PARAGEN_CACHE``, default ``~/.cache/paragen``), under a lock so that worker processes
sharing a machine download it once, and every file is checked against the sha256 the driver
recorded in the run's manifest before the safe loader reads it: a model changed in the bucket
while a job runs is refused, not mixed in.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil

from common import storage
from models.nmt.model_files.checkpoint import check_checkpoint, validate_model_config
from models.nmt.model_files.fairseq_import import import_fairseq
from models.safety import UnsafeModelError, sha256_local, weights_only_load

META = "model.json"
FORMAT_TRAINED, FORMAT_IMPORTED = 1, 2
ENGINES = ("fairseq", "ctranslate2")
FAMILIES = ("fairseq", "marian", "m2m100", "nllb")           # what a CTranslate2 model was converted from
COMPUTE_TYPES = ("int8", "int8_float32", "float32", "float16", "int8_float16")
CT2_MODEL_FILES = ("model.bin", "config.json")          # plus its vocabulary files
CT2_VOCABULARIES = ("shared_vocabulary.json", "source_vocabulary.json", "target_vocabulary.json",
                    "shared_vocabulary.txt", "source_vocabulary.txt", "target_vocabulary.txt")
MAX_MEMBERS = 16
# the fields that make two members the same architecture (an ensemble of different ones is refused)
STRUCTURE = ("encoder_embed_dim", "decoder_embed_dim", "encoder_ffn_embed_dim", "decoder_ffn_embed_dim",
             "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
             "encoder_normalize_before", "decoder_normalize_before", "encoder_learned_pos", "decoder_learned_pos",
             "share_all_embeddings", "share_decoder_input_output_embed", "no_token_positional_embeddings",
             "layernorm_embedding", "decoder_output_dim", "decoder_input_dim", "activation_fn")


def model_file_names(meta: dict) -> list[str]:
    """Every file of a model directory described by META (read_model_meta)."""
    return list(meta["files"])


def _read_json(model_dir: str, name: str) -> object:
    try:
        return json.loads(storage.read_bytes(storage.join(model_dir, name)).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UnsafeModelError(f"{model_dir}/{name} is not valid JSON ({exc})") from None
    except RecursionError:
        raise UnsafeModelError(f"{model_dir}/{name} is not valid JSON (nested too deeply)") from None


def _plain_name(model_dir: str, name, what: str) -> str:
    """NAME, a file name model.json gives, if it is one plain file name of the directory."""
    from common.names import check_path_component

    if not isinstance(name, str):
        raise UnsafeModelError(f"{model_dir}/{META}: {what} must be a file name, not {name!r}")
    try:
        return check_path_component(name, f"{model_dir}/{META} {what}")
    except ValueError as exc:
        raise UnsafeModelError(str(exc)) from None


def read_model_meta(model_dir: str) -> dict:
    """MODEL_DIR/model.json as one description of either layout, after checking that the
    directory holds every file it names and that its language codes are plain codes:
    {"format", "engine", "src_lang", "tgt_lang", "members": [{"weights", "config"}], "tokenization":
    {"tokenizer", "bpe", "codes"}, "files": [...]} plus what model.json said besides."""
    from common.names import check_lang_code
    from models.nmt.model_files.tokenization import BPES, TOKENIZERS

    if not storage.isdir(model_dir):
        raise FileNotFoundError(f"{model_dir}: no such model directory (train one with paragen-train-nmt, or "
                                "import one with paragen-import-model)")
    if not storage.isfile(storage.join(model_dir, META)):
        raise FileNotFoundError(f"{model_dir}: not an NMT model directory, missing {META} (train one with "
                                "paragen-train-nmt, or import a fairseq model with paragen-import-model)")
    meta = _read_json(model_dir, META)
    if not isinstance(meta, dict) or not meta.get("src_lang") or not meta.get("tgt_lang"):
        raise UnsafeModelError(f"{model_dir}/{META} must name src_lang and tgt_lang "
                               "(the dict.<lang>.txt files alone do not say the direction)")
    try:
        for key in ("src_lang", "tgt_lang"):
            check_lang_code(meta[key], f"{model_dir}/{META} {key}")
    except ValueError as exc:
        raise UnsafeModelError(str(exc)) from None
    src, tgt = meta["src_lang"], meta["tgt_lang"]
    form = meta.get("format", FORMAT_TRAINED)
    if form == FORMAT_TRAINED:
        members = [{"weights": "model.pt", "config": None}]
        tokenization = {"tokenizer": "none", "bpe": "spm", "codes": "spm.model"}
        engine = "fairseq"
    elif form == FORMAT_IMPORTED:
        engine = meta.get("engine")
        if engine not in ENGINES:
            raise UnsafeModelError(f"{model_dir}/{META}: engine {engine!r} is not one of {', '.join(ENGINES)}")
        if engine == "fairseq":
            raw = meta.get("members")
            if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_MEMBERS:
                raise UnsafeModelError(f"{model_dir}/{META}: members must be a list of 1 to {MAX_MEMBERS}")
            members = [{"weights": _plain_name(model_dir, m.get("weights") if isinstance(m, dict) else m,
                                               "member weights"),
                        "config": _plain_name(model_dir, m.get("config") if isinstance(m, dict) else None,
                                              "member config")} for m in raw]
        else:
            members = []
            _check_ct2_meta(model_dir, meta)
        tok = meta.get("tokenization")
        if not isinstance(tok, dict) or tok.get("tokenizer") not in TOKENIZERS or tok.get("bpe") not in BPES:
            raise UnsafeModelError(f"{model_dir}/{META}: tokenization must give tokenizer ({', '.join(TOKENIZERS)}) "
                                   f"and bpe ({', '.join(BPES)})")
        codes, source_codes = tok.get("codes"), tok.get("source_codes")
        tokenization = {"tokenizer": tok["tokenizer"], "bpe": tok["bpe"],
                        "codes": _plain_name(model_dir, codes, "tokenization codes") if codes is not None else None}
        if source_codes is not None:
            tokenization["source_codes"] = _plain_name(model_dir, source_codes, "tokenization source codes")
        if (tokenization["bpe"] == "none") != (tokenization["codes"] is None):
            raise UnsafeModelError(f"{model_dir}/{META}: bpe {tokenization['bpe']!r} with codes {codes!r}")
    else:
        raise UnsafeModelError(f"{model_dir}/{META}: format {form!r} is not 1 (paragen-train-nmt) or 2 "
                               "(paragen-import-model); made by a newer version?")
    files = [META] + ([f"dict.{src}.txt", f"dict.{tgt}.txt"] if engine == "fairseq" else list(meta["model_files"]))
    for m in members:
        files += [m["weights"]] + ([m["config"]] if m["config"] else [])
    for key in ("codes", "source_codes"):
        if tokenization.get(key):
            files.append(tokenization[key])
    files = sorted(dict.fromkeys(files))
    missing = [f for f in files if not storage.isfile(storage.join(model_dir, f))]
    if missing:
        raise FileNotFoundError(f"{model_dir}: not a whole NMT model directory, missing {', '.join(missing)}")
    return {**meta, "format": form, "engine": engine, "members": members, "tokenization": tokenization,
            "files": files}


def _check_ct2_meta(model_dir: str, meta: dict) -> None:
    """The fields a CTranslate2 model directory's model.json must have, checked (they name files
    and go to CTranslate2 and into decoding)."""
    where = f"{model_dir}/{META}"
    if meta.get("family") not in FAMILIES:
        raise UnsafeModelError(f"{where}: family {meta.get('family')!r} is not one of {', '.join(FAMILIES)}")
    if meta.get("compute_type") not in COMPUTE_TYPES:
        raise UnsafeModelError(f"{where}: compute_type {meta.get('compute_type')!r} is not one of "
                               f"{', '.join(COMPUTE_TYPES)}")
    files = meta.get("model_files")
    if not isinstance(files, list) or not set(CT2_MODEL_FILES) <= set(files) or not any(
            f in CT2_VOCABULARIES for f in files) or any(f not in CT2_MODEL_FILES + CT2_VOCABULARIES for f in files):
        raise UnsafeModelError(f"{where}: model_files must be model.bin, config.json and CTranslate2's vocabulary "
                               "files, nothing else")
    codes = meta.get("lang_codes")
    if codes is not None:
        if not isinstance(codes, dict) or set(codes) != {"src", "tgt"} or not all(
                isinstance(c, str) and 0 < len(c) <= 32 and c.isprintable() and " " not in c for c in codes.values()):
            raise UnsafeModelError(f"{where}: lang_codes must give src and tgt tokens")
    for key in ("max_source_positions", "max_target_positions"):
        value = meta.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 2 <= value <= 1 << 20):
            raise UnsafeModelError(f"{where}: {key} must be a positive integer")


def local_model_dir(model_dir: str, expected: dict | None = None) -> str:
    """A local directory holding MODEL_DIR: MODEL_DIR itself when it is local, else a copy in the
    cache (common.storage.local_copy), downloaded once per machine. EXPECTED ({file name:
    sha256}, from the run's manifest) is checked file by file; a mismatch raises UnsafeModelError."""
    if storage.is_local(model_dir):
        target = storage.resolve(model_dir)[1]
    else:
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
    import_fairseq()
    from fairseq.data import Dictionary

    try:
        with open(path, encoding="utf-8") as f:
            return len(Dictionary.load(f))
    except (ValueError, RuntimeError, UnicodeDecodeError, IndexError) as exc:
        raise UnsafeModelError(f"{path}: not a fairseq dictionary ({str(exc).splitlines()[0][:200]})") from None


def member_config(local: str, member: dict) -> argparse.Namespace:
    """The validated model config of MEMBER of the local model directory LOCAL."""
    if member["config"] is None:
        return check_checkpoint(os.path.join(local, member["weights"]))
    with open(os.path.join(local, member["config"]), encoding="utf-8") as f:
        try:
            raw = json.load(f)
        except (ValueError, RecursionError) as exc:
            raise UnsafeModelError(f"{local}/{member['config']}: not valid JSON ({str(exc)[:100]})") from None
    if not isinstance(raw, dict):
        raise UnsafeModelError(f"{local}/{member['config']}: not a model config (a JSON object)")
    return validate_model_config(raw)


def member_weights(local: str, member: dict, mmap: bool = True) -> dict:
    """MEMBER's tensors by name (memory-mapped by default: cheap on a driver)."""
    import zipfile

    import torch

    path = os.path.join(local, member["weights"])
    if member["config"] is None:
        return check_checkpoint(path, with_weights=True)[1]
    state = weights_only_load(path, mmap=mmap and zipfile.is_zipfile(path))
    if not isinstance(state, dict) or not state or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise UnsafeModelError(f"{path}: not a state dict of named tensors")
    return state


def structure_of(cfg: argparse.Namespace) -> dict:
    """The fields that make a member's architecture (see STRUCTURE)."""
    return {name: getattr(cfg, name, None) for name in STRUCTURE}


def check_members(configs: list, where: str) -> None:
    """Refuse an ensemble whose members are not one architecture (one line naming the first
    difference)."""
    first = structure_of(configs[0])
    for i, cfg in enumerate(configs[1:], start=2):
        other = structure_of(cfg)
        diff = [k for k in STRUCTURE if first[k] != other[k]]
        if diff:
            raise UnsafeModelError(f"{where}: member {i} is another architecture than member 1 "
                                   f"({diff[0]} {other[diff[0]]!r} vs {first[diff[0]]!r}); an ensemble's members "
                                   "must be the same model trained with other seeds")


def check_dictionaries(local: str, meta: dict, weights: dict, where: str) -> None:
    """The dictionaries must be fairseq's and fit every member's embeddings, or the model fails
    on a worker."""
    for lang, table in ((meta["src_lang"], "encoder.embed_tokens.weight"),
                        (meta["tgt_lang"], "decoder.embed_tokens.weight")):
        size = dictionary_size(os.path.join(local, f"dict.{lang}.txt"))
        rows = weights[table].shape[0] if table in weights else None
        if rows is not None and rows != size:
            raise UnsafeModelError(f"{where}/dict.{lang}.txt has {size} symbols with fairseq's 4 special ones, "
                                   f"but the checkpoint's {table} has {rows} rows: not this model's dictionary")


def check_model_dir(model_dir: str) -> dict:
    """Everything about MODEL_DIR that can be checked without building the model: its files, its
    languages, every member's config and tensors, that the members are one architecture, that
    the dictionaries fit them, and that the tokenization's files are what model.json says.
    Returns read_model_meta's description plus max_source_positions, max_target_positions
    (of the most limited member) and sha256 (file name -> digest) of the local copy that was
    checked (the copy in the cache for a bucket URL)."""
    from models.nmt.model_files.tokenization import check_codes

    meta = read_model_meta(model_dir)
    local = local_model_dir(model_dir)
    if meta["engine"] == "ctranslate2":
        return _check_ct2_dir(model_dir, local, meta)
    configs = []
    for member in meta["members"]:
        cfg = member_config(local, member)
        check_dictionaries(local, meta, member_weights(local, member), model_dir)
        configs.append(cfg)
    check_members(configs, model_dir)
    tok = meta["tokenization"]
    if tok["codes"]:
        try:
            check_codes(os.path.join(local, tok["codes"]), tok["bpe"])
        except ValueError as exc:
            raise UnsafeModelError(str(exc)) from None

    def positions(name):
        return min(getattr(c, name, None) or 1024 for c in configs)
    return {**meta, "max_source_positions": positions("max_source_positions"),
            "max_target_positions": positions("max_target_positions"),
            "sha256": {name: sha256_local(os.path.join(local, name)) for name in model_file_names(meta)}}


def _check_ct2_dir(model_dir: str, local: str, meta: dict) -> dict:
    """check_model_dir for a CTranslate2 model: the tokenization's files, the vocabulary the
    language codes must be in, CTranslate2's own config.json parses."""
    from models.nmt.model_files.tokenization import check_codes

    tok = meta["tokenization"]
    for key in ("codes", "source_codes"):
        if tok.get(key):
            try:
                check_codes(os.path.join(local, tok[key]), tok["bpe"])
            except ValueError as exc:
                raise UnsafeModelError(str(exc)) from None
    try:
        with open(os.path.join(local, "config.json"), encoding="utf-8") as f:
            if not isinstance(json.load(f), dict):
                raise ValueError("not an object")
    except (ValueError, RecursionError) as exc:
        raise UnsafeModelError(f"{model_dir}/config.json: not CTranslate2's config ({str(exc)[:100]})") from None
    codes = meta.get("lang_codes")
    if codes:
        vocab = set(ct2_vocabulary(local, "target")) | set(ct2_vocabulary(local, "source"))
        missing = [c for c in codes.values() if c not in vocab]
        if missing:
            raise UnsafeModelError(f"{model_dir}: language code {missing[0]!r} is not in the model's vocabulary")
    return {**meta, "max_source_positions": int(meta.get("max_source_positions") or 1024),
            "max_target_positions": int(meta.get("max_target_positions") or 1024),
            "sha256": {name: sha256_local(os.path.join(local, name)) for name in model_file_names(meta)}}


def ct2_vocabulary(local: str, side: str) -> list[str]:
    """The tokens of a converted model's SIDE ("source" or "target") vocabulary (or its shared one)."""
    for name in (f"{side}_vocabulary.json", "shared_vocabulary.json"):
        path = os.path.join(local, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                vocab = json.load(f)
            if not isinstance(vocab, list) or not all(isinstance(t, str) for t in vocab):
                raise UnsafeModelError(f"{path}: not a list of tokens")
            return vocab
    for name in (f"{side}_vocabulary.txt", "shared_vocabulary.txt"):
        path = os.path.join(local, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                return [line.rstrip("\n") for line in f]
    raise UnsafeModelError(f"{local}: no CTranslate2 {side} or shared vocabulary")


def build_members(local: str, meta: dict) -> tuple[list, object]:
    """([model per member], task) of the local model directory LOCAL described by META: fairseq
    builds each member from its validated config only, for the translation task with our own
    settings and the directory's dictionaries, and loads its tensors with strict=True. CPU; the
    caller moves the models."""
    import_fairseq()
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    from models.nmt.model_files.checkpoint import load_state, model_config_of, weights_of
    from models.safety import load_tensor_file

    task = TranslationTask.setup_task(TranslationConfig(data=local, source_lang=meta["src_lang"],
                                                        target_lang=meta["tgt_lang"]))
    models = []
    for member in meta["members"]:
        path = os.path.join(local, member["weights"])
        if member["config"] is None:                       # a fairseq checkpoint (paragen-train-nmt)
            state = load_state(path)
            args, weights = model_config_of(state), weights_of(state)
            del state
        else:
            args, weights = member_config(local, member), load_tensor_file(path)
        model = task.build_model(args)
        model.load_state_dict(weights, strict=True, model_cfg=args)
        models.append(model)
    return models, task


# ---------------------------------------------------------------- writing (paragen-import-model)
def ct2_files(converted: str, staging: str) -> list[str]:
    """Move CTranslate2's output files from CONVERTED into STAGING; their names."""
    names = sorted(os.listdir(converted))
    unknown = [n for n in names if n not in CT2_MODEL_FILES + CT2_VOCABULARIES]
    if unknown:
        raise UnsafeModelError(f"CTranslate2's converter wrote files this version does not know: {unknown}")
    for name in names:
        os.replace(os.path.join(converted, name), os.path.join(staging, name))
    return names


def write_meta(staging: str, meta: dict) -> dict:
    """Write META as STAGING/model.json, with the sha256 of every other file of STAGING."""
    files = sorted(n for n in os.listdir(staging) if n != META)
    meta = {**meta, "sha256": {name: sha256_local(os.path.join(staging, name)) for name in files}}
    with open(os.path.join(staging, META), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2)
    return meta


def publish_dir(staging: str, output: str) -> None:
    """Put the model directory STAGING in place of OUTPUT (the old one, if any, removed only then)."""
    if os.path.exists(output):
        aside = f"{output}.replaced-{os.getpid()}"
        os.replace(output, aside)
        os.replace(staging, output)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(staging, output)
