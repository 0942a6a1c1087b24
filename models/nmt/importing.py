"""paragen-import-model: a model directory the jobs load, from the fairseq models users have.

    paragen-import-model wmt19.de-en/ --src_lang de --tgt_lang en --output runs/models/de-en
    paragen-import-model checkpoints/checkpoint_best.pt --data data-bin --src_lang cs --tgt_lang en \\
        --bpe sentencepiece --bpe_codes spm/sentencepiece.bpe.model --output runs/models/cs-en

SOURCE is either a fairseq hub archive directory (``model.pt`` or ``model1.pt`` ... ``modelN.pt``,
``dict.<lang>.txt``, and ``bpecodes``/``code`` or ``sentencepiece.bpe.model``; members default to
every ``model*.pt``) or a checkpoint file whose dictionaries are in ``--data`` (a fairseq-train
``data-bin``). ``--checkpoints`` lists the members (an ensemble) by name.

Everything is checked before anything is written, and a refusal is one line (exit status 2):

* each checkpoint is unpickled weights-only (a file holding other Python objects is refused) and
  its model config validated against the allowlist of models/nmt/model_files/checkpoint.py (code in a
  config field is refused); only fairseq ``translation`` transformers are taken, and each member
  is built and its tensors loaded strictly, as the jobs will;
* members must be one architecture with one pair of dictionaries, and translate SRC -> TGT where
  the checkpoint says which languages it was trained on; the dictionaries must be
  ``dict.<src>.txt`` and ``dict.<tgt>.txt`` and fit the embeddings;
* the tokenization is read from the archive where it is unambiguous (a subword-nmt codes file
  starts with ``#version``, fastBPE codes have three columns, a sentencepiece model loads), or
  from the checkpoint's own settings, and must be stated (``--tokenizer``, ``--bpe``) otherwise;
  given codes must be codes of the kind stated.

The directory written (models/nmt/model_files/model_dir.py, format 2) holds per member ``memberN.pt`` (named
tensors only: the Namespace and training state fairseq pickles are not carried over) and
``memberN.json`` (the checked config), the dictionaries, the codes (``bpecodes`` or
``sentencepiece.bpe.model``) and, last, ``model.json``: direction, members, tokenization, where it
came from and the sha256 of every file. Nothing is downloaded: fetch an archive once, elsewhere,
and import it offline.

``--engine auto`` (the default) writes a CTranslate2 int8 directory instead for one model on a
machine without a CUDA GPU, and for transformers directories (models/nmt/model_files/transformers_import.py);
the fairseq engine's directory for an ensemble, on a GPU, or when CTranslate2's converter refuses.
"""
from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time

from common.cli import UsageError, cli_main, configure_logging
from models.nmt.model_files.checkpoint import load_state, model_config_of, weights_of
from models.nmt.model_files.model_dir import (COMPUTE_TYPES, FORMAT_IMPORTED, META, MAX_MEMBERS, check_members,
                                              ct2_files, publish_dir, write_meta)
from models.nmt.model_files.tokenization import BPES, TOKENIZERS, check_codes, detect_bpe
from models.safety import UnsafeModelError, save_torch_file

log = logging.getLogger("paragen.import")
CODES_NAMES = ("bpecodes", "code", "sentencepiece.bpe.model")      # what fairseq's hub picks up
CODES_TARGET = {"subword_nmt": "bpecodes", "fastbpe": "bpecodes", "sentencepiece": "sentencepiece.bpe.model",
                "spm": "spm.model"}


def _natural(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def find_members(source: str, checkpoints: str | None) -> tuple[str, list[str]]:
    """(directory of the checkpoints, their file names) for SOURCE and --checkpoints."""
    if os.path.isdir(source):
        directory = source
        names = ([c.strip() for c in checkpoints.split(",") if c.strip()] if checkpoints else
                 sorted((os.path.basename(p) for p in glob.glob(os.path.join(source, "model*.pt"))), key=_natural))
        if not names:
            raise UsageError(f"{source}: no model*.pt in this directory; name the checkpoints with --checkpoints")
    elif os.path.isfile(source):
        directory = os.path.dirname(os.path.abspath(source))
        names = [os.path.basename(source)] + ([c.strip() for c in checkpoints.split(",") if c.strip()]
                                              if checkpoints else [])
    else:
        raise FileNotFoundError(f"{source}: no such archive directory or checkpoint file")
    names = list(dict.fromkeys(names))
    if len(names) > MAX_MEMBERS:
        raise UsageError(f"{len(names)} checkpoints: an ensemble of at most {MAX_MEMBERS} is supported")
    for name in names:
        if os.path.basename(name) != name or not os.path.isfile(os.path.join(directory, name)):
            raise FileNotFoundError(f"{os.path.join(directory, name)}: no such checkpoint (--checkpoints takes file "
                                    f"names in {directory})")
    return directory, names


def _checkpoint_languages(state: dict) -> tuple[str | None, str | None]:
    args, cfg = state.get("args"), state.get("cfg")
    if isinstance(args, argparse.Namespace):
        return getattr(args, "source_lang", None), getattr(args, "target_lang", None)
    if isinstance(cfg, dict) and isinstance(cfg.get("task"), dict):
        return cfg["task"].get("source_lang"), cfg["task"].get("target_lang")
    return None, None


def _checkpoint_text_settings(state: dict) -> tuple[str | None, str | None]:
    """(tokenizer, bpe) the checkpoint's training settings name, where they do."""
    args, cfg = state.get("args"), state.get("cfg")

    def name(value):
        if isinstance(value, dict):
            value = value.get("_name")
        return value if isinstance(value, str) else None
    if isinstance(args, argparse.Namespace):
        return name(getattr(args, "tokenizer", None)), name(getattr(args, "bpe", None))
    if isinstance(cfg, dict):
        return name(cfg.get("tokenizer")), name(cfg.get("bpe"))
    return None, None


def load_member(path: str, src_lang: str, tgt_lang: str) -> dict:
    """One checkpoint, loaded safely and checked: {"config", "weights", "format", "tokenizer",
    "bpe"}. UnsafeModelError (one line) names PATH."""
    try:
        state = load_state(path)
        config = model_config_of(state)
        weights = weights_of(state)
    except UnsafeModelError as exc:
        raise UnsafeModelError(f"{path}: {exc}" if path not in str(exc) else str(exc)) from None
    langs = _checkpoint_languages(state)
    if all(langs) and tuple(langs) != (src_lang, tgt_lang):
        raise UnsafeModelError(f"{path} was trained to translate {langs[0]}->{langs[1]}, not {src_lang}->{tgt_lang}")
    tokenizer, bpe = _checkpoint_text_settings(state)
    return {"config": config, "weights": weights, "tokenizer": tokenizer, "bpe": bpe,
            "format": "args" if isinstance(state.get("args"), argparse.Namespace) else "cfg"}


def _dictionaries(data: str, src_lang: str, tgt_lang: str) -> dict:
    paths = {lang: os.path.join(data, f"dict.{lang}.txt") for lang in (src_lang, tgt_lang)}
    missing = [lang for lang, p in paths.items() if not os.path.isfile(p)]
    if missing:
        have = sorted(n[5:-4] for n in os.listdir(data) if n.startswith("dict.") and n.endswith(".txt")) \
            if os.path.isdir(data) else []
        raise UsageError(f"{data} has no dict.{missing[0]}.txt: the languages do not match the dictionaries "
                         f"({'it has ' + ', '.join(have) if have else 'it has none'}; --src_lang/--tgt_lang name them)")
    return paths


def _looks_segmented(dict_path: str) -> str | None:
    """'@@' or '▁' when the dictionary holds BPE or sentencepiece pieces, else None."""
    with open(dict_path, encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f):
            token = line.split(" ", 1)[0]
            if token.endswith("@@"):
                return "@@"
            if token.startswith("\u2581"):
                return "\u2581"
            if i > 5000:
                break
    return None


def resolve_tokenization(tokenizer: str | None, bpe: str | None, codes: str | None, search: list[str],
                         from_checkpoint: tuple, tgt_dict: str) -> dict:
    """{"tokenizer", "bpe", "codes"} from what was stated, the archive's files and the checkpoint's
    settings; UsageError where it is ambiguous or contradictory."""
    ck_tokenizer, ck_bpe = from_checkpoint
    if codes is None and bpe != "none":
        codes = next((os.path.join(d, n) for d in search for n in CODES_NAMES if os.path.isfile(os.path.join(d, n))),
                     None)
    if codes is not None and not os.path.isfile(codes):
        raise FileNotFoundError(f"--bpe_codes {codes}: no such file")
    if bpe is None:
        if codes is not None:
            try:
                bpe = detect_bpe(codes)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
        elif ck_bpe in BPES and ck_bpe != "none":
            raise UsageError(f"the checkpoint was trained with bpe {ck_bpe!r}, but no codes file was found; "
                             "give it with --bpe_codes")
        else:
            mark = _looks_segmented(tgt_dict)
            if mark:
                raise UsageError(f"{tgt_dict} holds {'BPE' if mark == '@@' else 'sentencepiece'} pieces but no codes "
                                 "file was found: give --bpe_codes (or state --bpe none)")
            bpe = "none"
    if bpe != "none":
        if codes is None:
            raise UsageError(f"--bpe {bpe} needs its codes: give --bpe_codes")
        try:
            check_codes(codes, bpe)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    else:
        codes = None
    if ck_bpe in ("subword_nmt", "fastbpe", "sentencepiece") and bpe != ck_bpe:
        raise UsageError(f"the checkpoint was trained with bpe {ck_bpe!r}, but the codes say {bpe!r}")
    if tokenizer is None:
        if ck_tokenizer == "moses":
            tokenizer = "moses"
        elif ck_tokenizer == "space" or (ck_tokenizer is None and bpe in ("sentencepiece", "spm", "none")):
            tokenizer = "none"
        elif ck_tokenizer is None:
            raise UsageError("how was the text tokenized before BPE? The archive does not say: state --tokenizer "
                             "moses (fairseq's released BPE models) or --tokenizer none")
        else:
            raise UsageError(f"the checkpoint was trained with the tokenizer {ck_tokenizer!r}; supported: "
                             f"{', '.join(TOKENIZERS)} (state --tokenizer to override)")
    return {"tokenizer": tokenizer, "bpe": bpe, "codes": codes}


def _build_and_load(config, weights, data: str, src_lang: str, tgt_lang: str, where: str) -> dict:
    """Build the member as the jobs will and load its tensors strictly (a wrong tensor shape or
    name is found now, not on a worker); its state dict as the model has it (tensor names of
    older fairseq releases upgraded by fairseq on load)."""
    from models.nmt.model_files.fairseq_import import import_fairseq

    import_fairseq()
    from fairseq.tasks.translation import TranslationConfig, TranslationTask

    try:
        task = TranslationTask.setup_task(TranslationConfig(data=data, source_lang=src_lang, target_lang=tgt_lang))
        model = task.build_model(config)
        model.load_state_dict(weights, strict=True, model_cfg=config)
    except (RuntimeError, ValueError, KeyError, AttributeError, TypeError, AssertionError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnsafeModelError(f"{where}: does not load as a fairseq transformer with these dictionaries "
                               f"({first[:300]})") from None
    return model.state_dict()


def _save_tensors(weights: dict, path: str) -> None:
    save_torch_file({name: t.detach() for name, t in weights.items()}, path)   # tied embeddings: one storage


def import_model(source: str, src_lang: str, tgt_lang: str, output: str, checkpoints: str | None = None,
                 data: str | None = None, tokenizer: str | None = None, bpe: str | None = None,
                 bpe_codes: str | None = None, overwrite: bool = False) -> dict:
    """Check SOURCE and write the model directory OUTPUT (see the module doc); returns its
    model.json. Nothing is written when a check fails."""
    from common.cli import check_output_location
    from common.names import check_lang_code
    from models.nmt.model_files.model_dir import check_model_dir

    src_lang, tgt_lang = check_lang_code(src_lang, "--src_lang"), check_lang_code(tgt_lang, "--tgt_lang")
    if src_lang == tgt_lang:
        raise UsageError(f"--src_lang and --tgt_lang are both {src_lang!r}")
    if tokenizer is not None and tokenizer not in TOKENIZERS:
        raise UsageError(f"--tokenizer {tokenizer!r}: one of {', '.join(TOKENIZERS)}")
    if bpe is not None and bpe not in BPES:
        raise UsageError(f"--bpe {bpe!r}: one of {', '.join(BPES)}")
    output = check_output_location(output)
    if os.path.exists(output) and os.listdir(output) and not overwrite:
        raise UsageError(f"{output} already exists and is not empty; pass --overwrite to replace it")
    directory, names = find_members(source, checkpoints)
    data = data or (source if os.path.isdir(source) else directory)
    if not os.path.isdir(data):
        raise FileNotFoundError(f"--data {data}: no such directory (a fairseq-train data-bin with the dictionaries)")
    dicts = _dictionaries(data, src_lang, tgt_lang)
    parent = os.path.dirname(output)
    os.makedirs(parent, exist_ok=True)
    # members are written one at a time into a hidden staging directory beside OUTPUT (one
    # member in memory at a time: a WMT19 member is 1 GB), which replaces OUTPUT at the end or
    # is removed when a check fails
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(output)}.import-", dir=parent)
    try:
        entries, configs, tok = [], [], None
        for i, name in enumerate(names, start=1):
            path = os.path.join(directory, name)
            log.info("checking %s", path)
            member = load_member(path, src_lang, tgt_lang)
            weights = _build_and_load(member["config"], member["weights"], data, src_lang, tgt_lang, path)
            configs.append(member["config"])
            check_members(configs, source)
            if tok is None:             # the first member's training settings say how text was cut
                search = list(dict.fromkeys(d for d in (source if os.path.isdir(source) else None, data, directory)
                                            if d))
                tok = resolve_tokenization(tokenizer, bpe, bpe_codes, search, (member["tokenizer"], member["bpe"]),
                                           dicts[tgt_lang])
            _save_tensors(weights, os.path.join(staging, f"member{i}.pt"))
            with open(os.path.join(staging, f"member{i}.json"), "w", encoding="utf-8") as f:
                json.dump(vars(member["config"]), f, indent=2, sort_keys=True)
            entries.append({"weights": f"member{i}.pt", "config": f"member{i}.json", "from": name,
                            "checkpoint_format": member["format"]})
            del member, weights
        for lang in (src_lang, tgt_lang):
            shutil.copyfile(dicts[lang], os.path.join(staging, f"dict.{lang}.txt"))
        codes_name = CODES_TARGET.get(tok["bpe"])
        if tok["codes"]:
            shutil.copyfile(tok["codes"], os.path.join(staging, codes_name))
        meta = write_meta(staging, {
            "format": FORMAT_IMPORTED, "engine": "fairseq", "src_lang": src_lang, "tgt_lang": tgt_lang,
            "members": entries,
            "tokenization": {"tokenizer": tok["tokenizer"], "bpe": tok["bpe"],
                             "codes": codes_name if tok["codes"] else None},
            "arch": configs[0].arch,
            "imported_from": {"source": os.path.abspath(source), "checkpoints": names, "data": os.path.abspath(data),
                              "codes": os.path.abspath(tok["codes"]) if tok["codes"] else None,
                              "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}})
        checked = check_model_dir(staging)               # what the jobs will check, on what was written
        publish_dir(staging, output)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("imported %d member(s), %s -> %s, tokenization %s + %s, positions %d/%d, into %s", len(entries),
             src_lang, tgt_lang, tok["tokenizer"], tok["bpe"], checked["max_source_positions"],
             checked["max_target_positions"], output)
    return meta


class ConversionRefused(UsageError):
    """CTranslate2's converter refused a model fairseq's checks accepted (--engine auto falls back)."""


def choose_engine(source: str, checkpoints: str | None) -> tuple[str, str]:
    """(engine, why) for --engine auto, from the figures of docs/benchmarks.md (the CTranslate2
    engine): CTranslate2 int8 runs the whole job 1.4-1.6x the fairseq engine's speed on a CPU, for
    one model; ensembles are the fairseq engine's, and on a GPU only the fairseq engine is measured."""
    if _is_transformers_dir(source):
        return "ctranslate2", "a transformers directory"
    try:
        import ctranslate2  # noqa: F401  (what is installed decides)
    except ImportError:
        return "fairseq", "CTranslate2 is not installed"
    _, names = find_members(source, checkpoints)
    if len(names) > 1:
        return "fairseq", f"an ensemble of {len(names)}: CTranslate2 runs one model"
    import torch

    if torch.cuda.is_available():
        return "fairseq", "a CUDA GPU here: the fairseq engine is the one measured on GPUs"
    return "ctranslate2", "one model on a CPU: CTranslate2 int8 runs the job 1.4-1.6x faster"


def _is_transformers_dir(source: str) -> bool:
    return os.path.isfile(os.path.join(source, "config.json")) and not os.path.isfile(os.path.join(source, META))


def _clean_checkpoint(model_dir: str, member: dict, path: str) -> None:
    """A fairseq checkpoint at PATH holding only MEMBER's validated config and tensors (what
    CTranslate2's converter loads, with torch's weights-only unpickler)."""
    import torch

    from models.nmt.model_files.model_dir import member_config
    from models.safety import load_tensor_file

    config = member_config(model_dir, member)
    config.task = "translation"
    torch.save({"args": None, "cfg": {"model": config, "task": {"_name": "translation"}},
                "model": load_tensor_file(os.path.join(model_dir, member["weights"]))}, path)


def import_fairseq_to_ct2(source: str, src_lang: str, tgt_lang: str, output: str, compute_type: str,
                          overwrite: bool = False, **fairseq_options) -> dict:
    """A fairseq model (anything import_model takes, one member) converted to CTranslate2 with its
    own converter, from the checked tensors and config only (never the original pickle)."""
    from common.cli import check_output_location
    from models.nmt.model_files.checkpoint import allow_fairseq_checkpoints
    from models.nmt.model_files.model_dir import check_model_dir, member_config

    output = check_output_location(output)
    if os.path.exists(output) and os.listdir(output) and not overwrite:
        raise UsageError(f"{output} already exists and is not empty; pass --overwrite to replace it")
    parent = os.path.dirname(output)
    os.makedirs(parent, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{os.path.basename(output)}.ct2-", dir=parent) as work:
        checked = os.path.join(work, "fairseq")
        fairseq_meta = import_model(source, src_lang, tgt_lang, checked, **fairseq_options)
        if len(fairseq_meta["members"]) != 1:
            raise UsageError(f"CTranslate2 runs one model, not an ensemble of {len(fairseq_meta['members'])}: name one "
                             "member with --checkpoints, or import the ensemble for the fairseq engine")
        member = fairseq_meta["members"][0]
        clean = os.path.join(work, "clean.pt")
        _clean_checkpoint(checked, member, clean)
        allow_fairseq_checkpoints()
        from ctranslate2.converters import FairseqConverter

        staging = os.path.join(work, "staging")
        try:
            FairseqConverter(clean, checked, source_lang=src_lang, target_lang=tgt_lang).convert(
                os.path.join(work, "converted"), quantization=compute_type, force=True)
        except (ValueError, RuntimeError, NotImplementedError) as exc:
            # its converter lists the reasons on lines of their own: one line, all of them
            reasons = " ".join(line.strip(" -") for line in str(exc).strip().splitlines() if line.strip(" -"))
            raise ConversionRefused(f"{source}: CTranslate2 cannot convert this model "
                                    f"({reasons[:300] or type(exc).__name__})") from None
        os.makedirs(staging)
        model_files = ct2_files(os.path.join(work, "converted"), staging)
        tok = fairseq_meta["tokenization"]
        if tok["codes"]:
            shutil.copyfile(os.path.join(checked, tok["codes"]), os.path.join(staging, tok["codes"]))
        config = member_config(checked, member)
        meta = write_meta(staging, {
            "format": FORMAT_IMPORTED, "engine": "ctranslate2", "family": "fairseq", "compute_type": compute_type,
            "src_lang": src_lang, "tgt_lang": tgt_lang, "model_files": model_files, "tokenization": tok,
            "arch": fairseq_meta["arch"],
            "max_source_positions": int(getattr(config, "max_source_positions", None) or 1024),
            "max_target_positions": int(getattr(config, "max_target_positions", None) or 1024),
            "imported_from": {**fairseq_meta["imported_from"], "converter": "ctranslate2.converters.FairseqConverter"}})
        check_model_dir(staging)
        publish_dir(staging, output)
    log.info("imported %s -> %s for CTranslate2 (%s) into %s", src_lang, tgt_lang, compute_type, output)
    return meta


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="paragen-import-model", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    ap.add_argument("source", metavar="SOURCE",
                    help="a fairseq hub archive directory, or a checkpoint file (with --data)")
    ap.add_argument("--src_lang", required=True, help="the language the model translates from (required)")
    ap.add_argument("--tgt_lang", required=True, help="the language it translates into (required)")
    ap.add_argument("--output", required=True, metavar="DIR", help="the model directory to write (required)")
    ap.add_argument("--checkpoints", metavar="A.pt,B.pt",
                    help="the members, by file name (default: every model*.pt of an archive; a checkpoint SOURCE "
                         "alone)")
    ap.add_argument("--data", metavar="DIR",
                    help="where dict.<src>.txt and dict.<tgt>.txt are (default: the archive, or the checkpoint's "
                         "directory): a fairseq-train data-bin")
    ap.add_argument("--tokenizer", choices=TOKENIZERS,
                    help="how text was tokenized before BPE: moses (sacremoses, as fairseq's moses tokenizer) or "
                         "none (default: from the checkpoint's settings; required where they do not say and BPE "
                         "codes are used)")
    ap.add_argument("--bpe", choices=[b for b in BPES if b != "spm"],
                    help="subword_nmt, fastbpe, sentencepiece or none (default: read from the codes file)")
    ap.add_argument("--bpe_codes", metavar="FILE",
                    help="the BPE codes or sentencepiece model (default: bpecodes, code or sentencepiece.bpe.model "
                         "in the archive or --data)")
    ap.add_argument("--engine", choices=("auto", "fairseq", "ctranslate2"), default="auto",
                    help="what runs the model: fairseq (ensembles; the reference), ctranslate2 (one model, int8 or "
                         "float kernels; also transformers Marian, M2M-100 and NLLB directories), or auto (default): "
                         "ctranslate2 for one model on a machine without a CUDA GPU (the whole job 1.4-1.6x faster "
                         "on a CPU) and for transformers directories, fairseq otherwise; import where the jobs run")
    ap.add_argument("--compute_type", choices=COMPUTE_TYPES, default=None,
                    help="CTranslate2's weights: int8 (default: fastest on a CPU), int8_float32, float32, and on a "
                         "GPU float16, int8_float16")
    ap.add_argument("--src_lang_code", metavar="TOKEN",
                    help="a multilingual model's source language token, e.g. ces_Latn (NLLB) or __cs__ (M2M-100)")
    ap.add_argument("--tgt_lang_code", metavar="TOKEN", help="its target language token, e.g. eng_Latn or __en__")
    ap.add_argument("--overwrite", action="store_true", help="replace --output if it exists (default: refuse)")
    return ap


def run(argv=None) -> dict:
    a = build_parser().parse_args(argv)
    engine, why = a.engine, ""
    if engine == "auto":
        ct2_options = [f"--{o}" for o in ("compute_type", "src_lang_code", "tgt_lang_code") if getattr(a, o)]
        engine, why = (("ctranslate2", f"{ct2_options[0]} given") if ct2_options
                       else choose_engine(a.source, a.checkpoints))
        log.info("--engine auto: %s (%s)", engine, why)
    if engine == "fairseq":
        return _run_fairseq(a, why)
    compute_type = a.compute_type or "int8"
    if _is_transformers_dir(a.source):
        from models.nmt.model_files.transformers_import import import_transformers

        for option in ("checkpoints", "data", "tokenizer", "bpe", "bpe_codes"):
            if getattr(a, option) is not None:
                raise UsageError(f"--{option} is for fairseq models; a transformers directory brings its tokenizer")
        meta = import_transformers(a.source, a.src_lang, a.tgt_lang, a.output, compute_type, a.src_lang_code,
                                   a.tgt_lang_code, a.overwrite)
    else:
        if a.src_lang_code or a.tgt_lang_code:
            raise UsageError("--src_lang_code/--tgt_lang_code are for multilingual transformers models")
        try:
            meta = import_fairseq_to_ct2(a.source, a.src_lang, a.tgt_lang, a.output, compute_type, a.overwrite,
                                         checkpoints=a.checkpoints, data=a.data, tokenizer=a.tokenizer, bpe=a.bpe,
                                         bpe_codes=a.bpe_codes)
        except ConversionRefused as exc:
            if a.engine != "auto" or a.compute_type:
                raise
            # fairseq's checks passed, so the fairseq engine runs it: the user asked for a working directory
            log.warning("%s; importing for the fairseq engine instead", exc)
            return _run_fairseq(a, "CTranslate2 cannot convert it")
    print(f"{a.output}: CTranslate2 {meta['family']} model ({meta['compute_type']}), {meta['src_lang']}->"
          f"{meta['tgt_lang']}{f' (--engine auto: {why})' if why else ''}", flush=True)
    return meta


def _run_fairseq(a, why: str) -> dict:
    for option in ("compute_type", "src_lang_code", "tgt_lang_code"):
        if getattr(a, option) is not None:
            raise UsageError(f"--{option} is for --engine ctranslate2")
    meta = import_model(a.source, a.src_lang, a.tgt_lang, a.output, a.checkpoints, a.data, a.tokenizer, a.bpe,
                        a.bpe_codes, a.overwrite)
    print(f"{a.output}: {len(meta['members'])} member(s) ({meta['arch']}), {meta['src_lang']}->{meta['tgt_lang']}, "
          f"tokenizer {meta['tokenization']['tokenizer']}, bpe {meta['tokenization']['bpe']}, fairseq engine"
          f"{f' (--engine auto: {why})' if why else ''}", flush=True)
    return meta


def main(argv=None) -> int:
    configure_logging()
    return cli_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
