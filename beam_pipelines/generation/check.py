"""The check phase: everything that can be refused is refused here, before anything is written.

``check(argv)`` parses the command line and checks, in this order (so that of several mistakes the
same one is always reported first): Beam's options, the runner and --torch_threads, the output
location, the settings, the models (files, safe checkpoint config, languages, direction), device
and precision, every input shard (opens, Parquet columns) and the bitext filter's models. It returns two frozen
values: the ``Job`` (what decides the rows, with its config hash) and the ``Request`` (what to do
with the output: a new run, resume, overwrite, build on --previous, a dry run).
"""
from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass

from beam_pipelines.generation.devices import (GPU_BATCH_PAIRS, check_decode_step, gpu_worker_processes, hashed_precision,
                                               resolve_device)
from beam_pipelines.generation.mps import check_mps
from beam_pipelines.generation.model_checks import (bitext_filter_config, bitext_model_entries, check_bitext_languages,
                                                    check_compute_types, check_models, model_entry)
from beam_pipelines.generation.options import TUNABLES, build_parser
from beam_pipelines.options import (check_beam_args, direct_workers, join_dashed_values, runner_name,
                                    torch_threads_for)
from beam_pipelines.slurm import check_slurm
from common.cli import UsageError, check_output_location, command_line
from common.names import check_lang_code, check_run_id
from common.shards import MIN_LINE_CHARS, ShardSpec, check_shard, discover_shards
from paracorpus.cleaning import CleaningConfig
from paracorpus.compaction import FileTarget
from paracorpus.incremental import check_previous
from paracorpus.config import PRESETS, GenerationConfig, config_hash

log = logging.getLogger("paragen")


@dataclass(frozen=True)
class Request:
    """What the user asked the run to do with its output; none of it changes a row."""
    output: str                      # absolute path or URL, checked writable
    previous: str | None = None      # --previous: a committed run to build on
    resume: bool = False
    overwrite: bool = False
    run_id: str | None = None        # --run_id: the new run's id
    continue_only: bool = False      # --continue_only: the run --run_id names continued, or nothing done
    allow_empty: bool = False
    dry_run: bool = False
    rate: float | None = None        # --rate: a dry run's decoding speed
    command: tuple = ()              # the command line, for the manifest and plan.json


@dataclass(frozen=True)
class Job:
    """Everything checked that decides the run's rows, and where and how its workers decode."""
    shards: tuple                    # ShardSpecs, checked
    cfg: GenerationConfig
    cleaning: CleaningConfig
    max_line_chars: int
    src_column: str
    tgt_column: str
    models: dict                     # name -> manifest entry (path, sha256, fingerprint, ...)
    bitext: object                   # paracorpus.steps.BitextFilterConfig
    preset: str
    config_hash: str
    file_target: FileTarget
    unit_pairs: int
    runner: str
    beam_args: tuple
    device: str | None               # None: the workers decide (runners other than the DirectRunner)
    precision: str                   # as resolved ('auto' where the workers decide)
    requested_precision: str
    threads: int | None              # torch threads per worker process
    processes_per_gpu: int
    decode_step: str                 # --decode_step (models/nmt/decoding/fixed_sampler.py), as given
    mps: str                         # --mps: auto, on or off (beam_pipelines/generation/mps.py)

    @property
    def lang_pair(self) -> str:
        return f"{self.cleaning.src_lang}-{self.cleaning.tgt_lang}"

    @property
    def workers(self) -> int | None:
        """Worker processes of a DirectRunner run, None for other runners."""
        return direct_workers(list(self.beam_args))

    @property
    def cleaning_dict(self) -> dict:
        """The cleaning settings as the manifest and the config hash record them."""
        c = self.cleaning
        return {"src_lang": c.src_lang, "tgt_lang": c.tgt_lang, "encodings": c.encodings, "max_tokens": c.max_tokens,
                "max_length_ratio": c.max_length_ratio, "max_line_chars": self.max_line_chars}


def check(argv: list[str]) -> tuple[Request, Job]:
    """The checked (Request, Job) of the command line ARGV; UsageError for any mistake."""
    parser = build_parser()
    opts, beam_args = parser.parse_known_args(join_dashed_values(argv))
    beam_args = check_beam_args(beam_args, parser)
    runner = runner_name(beam_args)
    torch_threads_for(opts.torch_threads, beam_args)        # refuses a negative count now; set below
    request = _request(opts, argv)
    cfg, file_target, cleaning = _settings(opts)
    fwd_meta, bwd_meta, src_lang, tgt_lang = check_models(opts.forward_model, opts.backward_model,
                                                          opts.src_lang, opts.tgt_lang)
    if cfg.dual_xent_threshold is not None and not opts.backward_model:
        log.warning("no --backward_model: the dual cross-entropy filter and dual scoring are off")
    src_column, tgt_column = opts.src_column or src_lang, opts.tgt_column or tgt_lang
    shards = _shards(opts.input, src_lang, tgt_lang, src_column, tgt_column)
    models = {"forward": model_entry(opts.forward_model, fwd_meta)}
    if opts.backward_model:
        models["backward"] = model_entry(opts.backward_model, bwd_meta)
    bitext = bitext_filter_config(opts)
    check_bitext_languages(bitext, src_lang, tgt_lang)
    models.update(bitext_model_entries(bitext))
    # the device last: resolving it imports torch and fairseq (seconds), which a mistake in the
    # inputs or options above need not wait for
    device, precision = resolve_device(opts.device, opts.precision, runner, beam_args)
    if opts.processes_per_gpu < 1:
        raise UsageError(f"--processes_per_gpu must be >= 1, not {opts.processes_per_gpu}")
    if device == "cuda":
        if opts.batch_pairs is None:
            cfg = dataclasses.replace(cfg, batch_pairs=GPU_BATCH_PAIRS)
        beam_args = gpu_worker_processes(beam_args, runner, opts.processes_per_gpu)
    check_compute_types({"--forward_model": fwd_meta, "--backward_model": bwd_meta}, device, runner)
    check_decode_step(opts.decode_step, fwd_meta, device, runner)
    check_mps(opts.mps, device, runner, opts.processes_per_gpu)
    beam_args = check_slurm(beam_args, runner, device, opts.processes_per_gpu, output=opts.output)
    job = Job(shards=tuple(shards), cfg=cfg, cleaning=cleaning, max_line_chars=opts.max_line_chars,
              src_column=src_column, tgt_column=tgt_column, models=models, bitext=bitext, preset=opts.preset,
              config_hash="", file_target=file_target, unit_pairs=opts.unit_pairs, runner=runner,
              beam_args=tuple(beam_args), device=device, precision=precision, requested_precision=opts.precision,
              threads=torch_threads_for(opts.torch_threads, beam_args), processes_per_gpu=opts.processes_per_gpu,
              decode_step=opts.decode_step, mps=opts.mps)
    return request, dataclasses.replace(job, config_hash=job_config_hash(job, fwd_meta["tokenization"]))


def _request(opts, argv: list[str]) -> Request:
    """The checked Request of the parsed options OPTS (the output location first)."""
    output = check_output_location(opts.output)
    if opts.rate is not None and not (opts.dry_run and math.isfinite(opts.rate) and opts.rate > 0):
        raise UsageError(f"--rate is a dry run's decoding speed (--dry_run --rate PAIRS_PER_S, > 0), "
                         f"not {opts.rate}{'' if opts.dry_run else ' without --dry_run'}")
    if opts.continue_only and opts.run_id is None:
        raise UsageError("--continue_only continues the run --run_id names: give --run_id")
    if opts.run_id is not None:
        check_run_id(opts.run_id)
        if opts.resume:
            raise UsageError("--run_id names a new run; --resume continues the unfinished one (give one of them)")
    if opts.previous:
        check_previous(opts.previous)     # refused before anything is written; read again under the claim
    return Request(output=output, previous=opts.previous, resume=opts.resume, overwrite=opts.overwrite,
                   run_id=opts.run_id, continue_only=opts.continue_only, allow_empty=opts.allow_empty, dry_run=opts.dry_run, rate=opts.rate,
                   command=tuple(command_line(argv)))


def _settings(opts) -> tuple[GenerationConfig, FileTarget, CleaningConfig]:
    """The generation settings (preset plus options), the file target and the cleaning settings,
    checked: cheap, so before any model is loaded."""
    cfg = generation_config(opts)
    if opts.unit_pairs < 1:
        raise UsageError(f"--unit_pairs must be >= 1, not {opts.unit_pairs}")
    try:
        file_target = FileTarget(opts.file_rows, opts.file_mb)
    except ValueError as exc:
        raise UsageError(f"--file_rows/--file_mb: {exc}") from None
    if opts.max_line_chars < MIN_LINE_CHARS:
        raise UsageError(f"--max_line_chars must be >= {MIN_LINE_CHARS} (the shortest record, 'a<TAB>b'), "
                         f"not {opts.max_line_chars}: a smaller bound rejects every record")
    try:
        cleaning = CleaningConfig(src_lang=check_lang_code(opts.src_lang, "--src_lang"),
                                  tgt_lang=check_lang_code(opts.tgt_lang, "--tgt_lang"),
                                  encodings=_parse_encodings(opts.encodings),
                                  max_tokens=opts.max_tokens, max_length_ratio=opts.max_length_ratio)
    except ValueError as exc:
        raise UsageError(str(exc) if isinstance(exc, UsageError) else f"--{exc}") from None
    return cfg, file_target, cleaning


def generation_config(opts) -> GenerationConfig:
    """The preset's settings with the options given on the command line (a negative threshold: off)."""
    base = PRESETS[opts.preset]
    changes = {name: getattr(opts, name) for name, _, _ in TUNABLES if getattr(opts, name, None) is not None}
    for name in ("score_threshold", "dual_xent_threshold"):
        if name in changes and changes[name] < 0:
            changes[name] = None
    try:
        return dataclasses.replace(base, **changes)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _parse_encodings(spec: str) -> dict:
    out = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        if "=" not in item:
            raise UsageError(f"--encodings item {item!r} is not LANG=CHARSET")
        lang, enc = (x.strip() for x in item.split("=", 1))
        check_lang_code(lang, "--encodings language")
        if enc:
            try:
                "".encode(enc)
            except LookupError:
                raise UsageError(f"--encodings {lang}={enc}: unknown charset") from None
        out[lang] = enc
    return out


def _shards(inputs: list[str], src_lang: str, tgt_lang: str, src_column: str, tgt_column: str) -> list[ShardSpec]:
    """The input shards the --input options name (repeated or comma-separated), each opened and checked."""
    paths = [x for item in inputs for x in item.split(",") if x]
    try:
        shards = discover_shards(paths, src_lang, tgt_lang)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not shards:
        raise UsageError(f"no input shards found in {paths}")
    for shard in shards:
        check_shard(shard, src_column, tgt_column)
    return shards


def job_config_hash(job: Job, forward_tokenization: dict) -> str:
    """The hash of everything that decides JOB's rows: settings, model fingerprints, cleaning,
    precision, the bitext filter's thresholds and the versions of behaviours that changed rows."""
    cfg, bitext = job.cfg, job.bitext
    if all(m.get("engine") == "fairseq" for m in job.models.values() if "engine" in m):
        # The project's engine gives a pair the same rows whatever its batch (docs/contract.md,
        # "What a pair's rows depend on"): --batch_pairs is hashed as its default, so a run
        # continues, and a refresh reuses, what a CPU (64) or a GPU (256) decoded.
        cfg = dataclasses.replace(cfg, batch_pairs=GenerationConfig().batch_pairs)
    return config_hash(cfg, {"models": {k: v["fingerprint"] for k, v in job.models.items()},
                             "cleaning": job.cleaning_dict, "preset": job.preset,
                             "precision": hashed_precision(job.requested_precision, job.device, job.precision),
                             # which Parquet columns are read, where not the languages' codes (the default)
                             **({"columns": [job.src_column, job.tgt_column]}
                                if (job.src_column, job.tgt_column) != (job.cleaning.src_lang, job.cleaning.tgt_lang)
                                else {}),
                             # the bitext models' files are in "models"; their paths do not change output
                             **({"bitext_filter": {"min_similarity": bitext.min_similarity,
                                                   "min_equivalence": bitext.min_equivalence}}
                                if bitext.enabled else {}),
                             # Moses models' samples changed when "word." became banned (CHANGELOG)
                             **({"banned_forms": 2} if cfg.mode == "sample"
                                and forward_tokenization.get("tokenizer") == "moses" else {}),
                             # beam rows changed when each source got its own length limit (CHANGELOG)
                             **({"length_limit": "per_source"} if cfg.mode == "beam" else {})})
