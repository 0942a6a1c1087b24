"""The check phase's model checks: translation models (files, safe config, languages, direction),
CTranslate2 compute types, the bitext filter's models, and what the manifest records of each."""
from __future__ import annotations

import hashlib
import json

from beam_pipelines.options import is_local
from common import storage
from common.cli import UsageError
from common.names import check_lang_code


def check_models(forward: str, backward: str | None, src_lang: str, tgt_lang: str):
    """(forward meta, backward meta or None, src_lang, tgt_lang) after checking each model
    directory (files, checkpoint config: models/nmt/model_files/checkpoint.py) and that the forward model translates
    src_lang -> tgt_lang and the backward one tgt_lang -> src_lang. The languages are always
    explicit (with defaults) rather than read from the models: read from a swapped forward model,
    they would make the swap look right."""
    from models.nmt.model_files.model_dir import check_model_dir

    metas = {}
    for option, path in (("--forward_model", forward), ("--backward_model", backward)):
        if path:
            try:
                metas[option] = check_model_dir(path)
            except (FileNotFoundError, UsageError) as exc:
                raise UsageError(f"{option}: {exc}") from None
    fwd = metas["--forward_model"]
    src_lang = check_lang_code(src_lang, "--src_lang")
    tgt_lang = check_lang_code(tgt_lang, "--tgt_lang")
    if src_lang == tgt_lang:
        raise UsageError(f"--src_lang and --tgt_lang are both {src_lang!r}")
    for option, want in (("--forward_model", (src_lang, tgt_lang)), ("--backward_model", (tgt_lang, src_lang))):
        meta = metas.get(option)
        if meta is None:
            continue
        has = (meta["src_lang"], meta["tgt_lang"])
        if has == want:
            continue
        path = forward if option == "--forward_model" else backward
        if has == want[::-1]:
            raise UsageError(f"{option} {path} translates {has[0]}->{has[1]}, but the {option[2:-6]} model must "
                             f"translate {want[0]}->{want[1]}: are --forward_model and --backward_model swapped?")
        raise UsageError(f"{option} {path} translates {has[0]}->{has[1]}, but this run needs {want[0]}->{want[1]} "
                         f"(--src_lang {src_lang} --tgt_lang {tgt_lang})")
    return fwd, metas.get("--backward_model"), src_lang, tgt_lang


def check_compute_types(metas: dict, device: str | None, runner: str) -> None:
    """Refuse a CTranslate2 model whose compute type this machine's device cannot run, where the
    workers are this machine (elsewhere the workers' devices are not known here)."""
    if not is_local(runner):
        return
    for option, meta in metas.items():
        if meta is None or meta["engine"] != "ctranslate2":
            continue
        import ctranslate2

        where = device or ("cuda" if ctranslate2.get_cuda_device_count() else "cpu")
        supported = ctranslate2.get_supported_compute_types(where)
        if meta["compute_type"] not in supported:
            raise UsageError(f"{option}: compute type {meta['compute_type']} is not supported on this {where} "
                             f"(supported: {', '.join(sorted(supported))}); import the model again with another "
                             "--compute_type")


def bitext_filter_config(opts):
    """The bitext filter's settings, checked (UsageError), its model directories absolute."""
    from paracorpus.steps import BitextFilterConfig

    cfg = BitextFilterConfig(
        encoder=storage.absolute(opts.bitext_encoder) if opts.bitext_encoder else None,
        mlp=storage.absolute(opts.bitext_mlp) if opts.bitext_mlp else None,
        min_similarity=opts.bitext_min_similarity,
        divergence=storage.absolute(opts.divergence_model) if opts.divergence_model else None,
        min_equivalence=opts.min_equivalence)
    try:
        cfg.check()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for option, path in (("--bitext_encoder", cfg.encoder), ("--bitext_mlp", cfg.mlp),
                         ("--divergence_model", cfg.divergence)):
        if path and not storage.isfile(storage.join(path, "config.json")):
            raise UsageError(f"{option} {path}: not a model directory (no config.json)")
    return cfg


def check_bitext_languages(cfg, src_lang: str, tgt_lang: str) -> None:
    """Refuse bitext models trained on other languages than the job's, before anything runs."""
    def langs_of(cfg_json, nested: bool):
        block = cfg_json.get("model") if nested and isinstance(cfg_json, dict) else cfg_json
        return (block.get("src_lang"), block.get("tgt_lang")) if isinstance(block, dict) else (None, None)

    for option, path, nested in (("--bitext_encoder", cfg.encoder, False), ("--divergence_model", cfg.divergence, True)):
        if not path:
            continue
        try:
            langs = langs_of(storage.read_json(storage.join(path, "config.json")), nested)
        except ValueError as exc:           # not JSON (json.JSONDecodeError is a ValueError)
            raise UsageError(f"{option} {path}: config.json is not valid JSON ({exc})") from None
        if set(langs) != {src_lang, tgt_lang}:
            raise UsageError(f"{option} {path} is a {langs[0]}-{langs[1]} model; this job is {src_lang}-{tgt_lang}")


def directory_sha256(path: str) -> dict:
    """{file name: sha256} of the files of a model directory (its fingerprint in the manifest)."""
    return {storage.basename(f): storage.sha256(f) for f in sorted(storage.list_files(path, recursive=False))}


def fingerprint(sha256: dict) -> str:
    """A short id of a model's files (what the config hash records)."""
    return hashlib.sha256(json.dumps(sha256, sort_keys=True).encode()).hexdigest()[:16]


def model_entry(path: str, meta: dict) -> dict:
    """What the manifest records of a translation model: where it is, what runs it (engine,
    members, tokenization) and the sha256 of every file, whose digest (the fingerprint) the
    config hash covers."""
    entry = {"path": storage.absolute(path), "engine": meta["engine"], "members": max(1, len(meta["members"])),
             "tokenization": meta["tokenization"], "sha256": meta["sha256"], "fingerprint": fingerprint(meta["sha256"])}
    if meta["engine"] == "ctranslate2":
        entry.update(family=meta["family"], compute_type=meta["compute_type"])
    return entry


def bitext_model_entries(bitext) -> dict:
    """{name: manifest entry} of the bitext filter's model directories that BITEXT names."""
    entries = {}
    for name, path in (("bitext_encoder", bitext.encoder), ("bitext_mlp", bitext.mlp),
                       ("divergence", bitext.divergence)):
        if path:
            sha = directory_sha256(path)
            entries[name] = {"path": path, "sha256": sha, "fingerprint": fingerprint(sha)}
    return entries
