"""The generation job: bitext shards -> paraphrase Parquet partitions, rejects and a manifest.

    paragen-generate --input examples/cs-en.example.tsv --output runs/example-out \\
        --forward_model runs/example-models/cs-en --backward_model runs/example-models/en-cs

One pair's path: ReadShard (transforms/io.py, common/shards.py) -> Clean (paracorpus/steps.py
CleanStep through transforms/steps.py) -> Deduplicate -> GroupByKey on the pair's work unit -> RunInference with
UnitTranslatorHandler (transforms/units.py -> paracorpus/units.py -> paracorpus/paraphrasing.py ->
models/nmt/translator.py, paracorpus/clustering.py) -> WriteUnit (paracorpus/units.py; columns in
paracorpus/schema.py) -> the run's manifest, written last (paracorpus/commit.py).

Everything that can be checked is checked before anything is written: options (unknown ones are
an error), the runner, the models (files, safe checkpoint config, languages and direction),
device and precision, every input shard (opens, Parquet columns) and the output location.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass

import apache_beam as beam

from beam_pipelines.options import (check_beam_args, direct_workers, is_local, run_pipeline, runner_name,
                                    torch_threads_for)
from common import storage
from paracorpus.cleaning import CleaningConfig
from common.cli import (EXIT_EMPTY, JobFailed, UsageError, check_output_location, cli_main, command_line,
                        configure_logging, versions)
from paracorpus.commit import (Claim, entry_path, file_location, new_run_id, publish, read_manifest, resumable_run,
                               work_dir)
from paracorpus.incremental import Reuse, plan_reuse
from paracorpus.bins import bin_capacity, pack
from paracorpus.compaction import TABLES as DATA_TABLES
from paracorpus.compaction import DEFAULT_FILE_MB, DEFAULT_FILE_ROWS, FileTarget, carry_item, group_key
from paracorpus.config import PRESETS, GenerationConfig, config_hash
from common.names import check_lang_code, check_run_id
from paracorpus.schema import CONTRACT_VERSION, MANIFEST, check_manifest
from common.shards import DEFAULT_MAX_LINE_CHARS, MIN_LINE_CHARS, check_shard, discover_shards, estimate_records, shard_size
from paracorpus.units import DEFAULT_UNIT_PAIRS, finished_units, plan_units, summarize_run, totals
from paracorpus.steps import CleanStep
from transforms.cleaning import Deduplicate
from transforms.io import COUNTS_TAG, MAIN_TAG, REJECTS_TAG, ReadShard, SplitTagged
from transforms.progress import format_seconds
from transforms.steps import ApplyStep
from transforms.units import (PAIR, REJECT, UNIT, CompactGroup, DecodeUnits, UnitTranslatorHandler, key_by_unit,
                              reuse_unit)

TABLES = ("paraphrases", "rejects", "dedup", "_counts")      # what publish() cleans (_counts: contract v1 runs)
DEFAULT_PROCESSES_PER_GPU = 4
GPU_BATCH_PAIRS = 256        # --batch_pairs on a GPU unless given: larger decoder batches keep it busy

log = logging.getLogger("paragen")
# where a caller (paragen-refresh running this job as a command) wants to learn that the job found
# nothing to do: a small JSON file is written there (in-process callers get run()'s result)
NOOP_MARKER_ENV = "PARAGEN_NOOP_MARKER"

_TUNABLES = (("mode", str, "decoding: 'sample' (ParaBank 2: top-k sampling under negative constraints) or "
                           "'beam' (ParaNMT: beam search)"),
             ("num_sets", int, "S: negative-constraint sets per pair (sample mode)"),
             ("num_samples", int, "N: top-k samples per constraint set (sample mode)"),
             ("topk", int, "k of top-k sampling"),
             ("max_banned_words", int, "words per constraint set, 1 to this"),
             ("beam", int, "beam size (beam mode)"),
             ("nbest", int, "hypotheses kept per source (beam mode)"),
             ("clusters", int, "k free Levenshtein clusters (plus the reference cluster)"),
             ("keep", int, "n paraphrases kept per pair"),
             ("score_threshold", float, "drop candidates whose combined score is above this (<0: off)"),
             ("dual_xent_threshold", float, "drop pairs whose dual cross-entropy is above this before "
                                            "decoding (<0: off; needs --backward_model)"),
             ("seed", int, "random seed (same seed, same output)"),
             ("batch_pairs", int, "pairs per decoding call"),
             ("num_output_shards", int, "output partitions per language pair"),
             ("max_pieces", int, "reject a pair with more sentencepiece pieces on a side (also capped by the "
                                 "models' positions)"))


def _preset_values(name: str) -> str:
    def show(v):
        return "off" if v is None else v
    return ", ".join(f"{preset} {show(getattr(cfg, name))}" for preset, cfg in PRESETS.items())


def add_generate_args(parser: argparse.ArgumentParser) -> None:
    """The job's own options, Beam style (--snake_case). Not a PipelineOptions subclass: those are
    re-parsed from the Beam arguments by every view_as(), where our required options are absent."""
    g = parser.add_argument_group("input and output")
    g.add_argument("--input", action="append", required=True, metavar="PATH",
                   help="input shard: .tsv (src<TAB>tgt) or .parquet file, glob, directory, or Moses prefix "
                        "(PREFIX.<src_lang> + PREFIX.<tgt_lang>); text may be .gz/.bz2/.xz/.zst; repeat or "
                        "comma-separate (required)")
    g.add_argument("--output", required=True, metavar="DIR",
                   help="output directory: paraphrases/, rejects/ (Hive-partitioned Parquet), _manifest.json "
                        "(required)")
    g.add_argument("--overwrite", action="store_true",
                   help="replace the run committed in --output when this one commits; until then it stays "
                        "readable (default: refuse)")
    g.add_argument("--resume", action="store_true",
                   help="continue the unfinished run in --output with the same inputs, models and settings, "
                        "skipping its finished work units (default: start a new run)")
    g.add_argument("--previous", metavar="RUN", default=None,
                   help="a committed run to build on: input shards whose content, models and settings are "
                        "unchanged keep its output (not decoded again), new pairs are deduplicated against its "
                        "pairs, shards it had and this run has not drop out (default: none, decode everything)")
    g.add_argument("--allow_empty", action="store_true",
                   help="publish a run that has no paraphrase row (every record rejected, or none read); by default "
                        "such a run is not published and the job exits with status 3 (the previous run stays)")
    g.add_argument("--dry_run", action="store_true",
                   help="print the plan (input shards, records, bytes, work units, the files the run would publish, "
                        "an estimate of the decoding time) and exit without writing anything")
    g.add_argument("--rate", type=float, default=None, metavar="PAIRS_PER_S",
                   help="with --dry_run: decoding speed of one worker to estimate from (default: measured on a "
                        "sample of the input with the models, on this machine)")
    g.add_argument("--run_id", default=None,
                   help="the new run's id (letters, digits, '.', '_', '-'); a refresh names a run after its "
                        "directory this way (default: UTC time plus a random part)")
    g.add_argument("--unit_pairs", type=int, default=DEFAULT_UNIT_PAIRS,
                   help=f"records per work unit: the piece of decoding work one worker does, retries and resumes "
                        f"(default {DEFAULT_UNIT_PAIRS})")
    g.add_argument("--file_rows", type=int, default=DEFAULT_FILE_ROWS,
                   help=f"published files hold up to this many rows: each input shard's unit files in an output "
                        f"partition are rewritten into files this size (default {DEFAULT_FILE_ROWS:,})")
    g.add_argument("--file_mb", type=float, default=DEFAULT_FILE_MB,
                   help=f"... or this many MB, whichever comes first (default {DEFAULT_FILE_MB})")
    g.add_argument("--src_column", default=None,
                   help="Parquet input: the foreign side's column (default: the --src_lang code)")
    g.add_argument("--tgt_column", default=None,
                   help="Parquet input: the English side's column (default: the --tgt_lang code)")
    g = parser.add_argument_group("models and languages")
    g.add_argument("--forward_model", required=True, metavar="DIR",
                   help="model directory (paragen-train-nmt) translating src_lang -> tgt_lang: the generator "
                        "(required)")
    g.add_argument("--backward_model", default=None, metavar="DIR",
                   help="model directory translating tgt_lang -> src_lang, for dual scoring and the dual "
                        "cross-entropy filter (default: none, forward scores only)")
    g.add_argument("--src_lang", default="cs",
                   help="language code of the foreign side, the input's first column (default cs); the forward "
                        "model must translate src_lang->tgt_lang, the backward one tgt_lang->src_lang")
    g.add_argument("--tgt_lang", default="en",
                   help="language code of the side paraphrased, the input's second column (default en)")
    g.add_argument("--device", default=None, choices=["cpu", "cuda"],
                   help="where to decode (default: cuda when a GPU is visible to the worker, else cpu)")
    g.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"],
                   help="model weights' precision (default auto: on a GPU bf16 where it computes bf16, else fp16; "
                        "fp32 on the CPU); bf16 on a CPU needs AVX512-BF16 or AMX; half precisions give slightly "
                        "different scores")
    g.add_argument("--processes_per_gpu", type=int, default=DEFAULT_PROCESSES_PER_GPU,
                   help=f"decoding processes sharing each GPU, so that one process's host work (tokenization, "
                        f"clustering, writing) overlaps another's decoding; on a GPU machine the DirectRunner starts "
                        f"GPUs x this many worker processes unless --direct_running_mode is given (default "
                        f"{DEFAULT_PROCESSES_PER_GPU})")
    g.add_argument("--torch_threads", type=int, default=0,
                   help="CPU threads of each worker process's model (default 0 = auto: the cores divided by "
                        "the DirectRunner's worker processes; elsewhere torch's default, which follows "
                        "OMP_NUM_THREADS)")
    g = parser.add_argument_group("generation settings (defaults come from --preset)")
    g.add_argument("--preset", default="parabank2-cpu", choices=sorted(PRESETS),
                   help="paper settings to start from (default parabank2-cpu; parabank2 = Hu et al. 2019, "
                        "paranmt = Wieting & Gimpel 2018, wieting2017 = Wieting et al. 2017)")
    for name, typ, doc in _TUNABLES:
        kwargs = {"choices": ["sample", "beam"]} if name == "mode" else {}
        g.add_argument(f"--{name}", type=typ, default=None, **kwargs,
                       help=f"{doc} (default from the preset: {_preset_values(name)})")
    g = parser.add_argument_group("cleaning (ParaBank 2)")
    g.add_argument("--max_line_chars", type=int, default=DEFAULT_MAX_LINE_CHARS,
                   help=f"records longer than this are rejected unparsed (default {DEFAULT_MAX_LINE_CHARS})")
    g.add_argument("--max_tokens", type=int, default=100, help="max whitespace tokens per side (default 100)")
    g.add_argument("--max_length_ratio", type=float, default=3.0,
                   help="max token-length ratio of the two sides (default 3.0)")
    g.add_argument("--encodings", default="",
                   help="per-language charset rule, e.g. 'en=latin-1,cs=iso8859-2'; 'xx=' disables it "
                        "(default: latin-1 for en/de/fr/es, latin-2 for cs/pl/sk/hu, none otherwise)")


def add_bitext_filter_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("bitext filter (before back-translation: drop pairs that are not translations)")
    g.add_argument("--bitext_encoder", metavar="DIR", default=None,
                   help="bilingual sentence encoder (paragen-train-bilingual) for the source-reference cosine "
                        "(default: none, no similarity filter)")
    g.add_argument("--bitext_mlp", metavar="DIR", default=None,
                   help="its MLP pair classifier (paragen-train-pair-classifier): the score becomes the "
                        "probability that the pair is parallel (default: cosine)")
    g.add_argument("--bitext_min_similarity", type=float, default=None,
                   help="reject a pair whose cosine (or MLP probability) is below this, reason "
                        "bitext_similarity (required with --bitext_encoder)")
    g.add_argument("--divergence_model", metavar="DIR", default=None,
                   help="semantic-divergence detector (paragen-train-divergence); a pair it finds divergent is "
                        "rejected, reason divergent (default: none)")
    g.add_argument("--min_equivalence", type=float, default=None,
                   help="reject below this P(equivalent) (default: the threshold the detector was tuned with)")


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


def generation_config(opts) -> GenerationConfig:
    base = PRESETS[opts.preset]
    changes = {name: getattr(opts, name) for name, _, _ in _TUNABLES if getattr(opts, name, None) is not None}
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


@dataclass(frozen=True)
class Plan:
    """What a run will do, fixed before the pipeline starts (and kept for --resume)."""
    run_id: str
    output: str
    layout: dict                 # input shard -> (first unit, number of units): paracorpus.units.plan_units
    lang_pair: str
    config_hash: str
    bins: dict = dataclasses.field(default_factory=dict)     # input shard -> bin (decoded and carried shards)
    carries: list = dataclasses.field(default_factory=list)  # (group key, compaction.carry_item): rows to copy

    @property
    def work(self) -> str:
        return work_dir(self.output, self.run_id)

    @property
    def num_units(self) -> int:
        return sum(n for _first, n in self.layout.values())


def build(p: beam.Pipeline, plan: Plan, shards, cfg: GenerationConfig, cleaning: CleaningConfig,
          handler: UnitTranslatorHandler, max_line_chars: int, src_column: str, tgt_column: str,
          finished: frozenset = frozenset(), use_run_inference: bool = True,
          previous_dedup: list[tuple] | None = None, file_target: FileTarget = FileTarget()) -> None:
    """The pipeline: read -> clean -> dedup -> key every record by work unit -> decode and write each
    unit not in FINISHED -> one summary of the run (WORK/summary.json) for the driver to commit."""
    chash, layout = plan.config_hash, plan.layout
    read = (p | "ShardList" >> beam.Create(shards)
            | "ReadShards" >> beam.ParDo(ReadShard(max_line_chars, src_column, tgt_column, chash, plan.work))
            | "SplitRead" >> SplitTagged((MAIN_TAG, REJECTS_TAG, COUNTS_TAG)))
    cleaned = (read[MAIN_TAG] | "Clean" >> beam.ParDo(ApplyStep(CleanStep(cleaning), chash, "pairs_clean"))
               | "SplitClean" >> SplitTagged())
    dedup = (cleaned[MAIN_TAG] | "Deduplicate" >> Deduplicate(chash, previous_dedup)
             | "SplitDedup" >> SplitTagged())
    pairs = dedup[MAIN_TAG] | "KeyPairsByUnit" >> beam.Map(key_by_unit(PAIR, layout))
    rejects = ((read[REJECTS_TAG], cleaned[REJECTS_TAG], dedup[REJECTS_TAG]) | "EarlyRejects" >> beam.Flatten()
               | "KeyRejectsByUnit" >> beam.Map(key_by_unit(REJECT, layout)))
    # One marker element per unit, from a Create: on the DaskRunner a GroupByKey keeps the partition
    # count of its inputs and only a Create's is set (--dask_npartitions), so the markers are what
    # spreads the units over the workers there.
    markers = p | "UnitMarkers" >> beam.Create([(u, (UNIT, None)) for u in range(plan.num_units) if u not in finished])
    units = ((pairs, rejects, markers) | "AllRecords" >> beam.Flatten()
             | "SkipFinishedUnits" >> beam.Filter(lambda kv: kv[0] not in finished)
             | "GroupByUnit" >> beam.GroupByKey())
    written = units | "Units" >> DecodeUnits(handler, plan.output, plan.work, plan.lang_pair,
                                             cfg.num_output_shards, layout, use_run_inference)
    reused = (p | "FinishedUnits" >> beam.Create(sorted(finished))
              | "ReuseUnits" >> beam.Map(reuse_unit, plan.work))
    # A bin's units, and the rows it carries from the previous run, in one output partition: their
    # files rewritten as files sized for readers (paracorpus/compaction.py), one group record each.
    bins = plan.bins
    units_by_group = ((written, reused) | "UnitRecords" >> beam.Flatten()
                      | "KeyUnitsByGroup" >> beam.Map(lambda r: (group_key(bins[r["input_shard"]], r["shard"]),
                                                                 ("unit", r))))
    carried = p | "CarriedFiles" >> beam.Create([(key, ("carry", item)) for key, item in plan.carries])
    groups = ((units_by_group, carried) | "UnitsAndCarried" >> beam.Flatten()
              | "GroupUnitsByFile" >> beam.GroupByKey()
              | "Compact" >> beam.ParDo(CompactGroup(plan.output, plan.work, plan.lang_pair, file_target)))
    # One sink that depends on everything: the DaskRunner computes only the graph behind the last
    # transform of the pipeline.
    _ = ((groups | "TagGroups" >> beam.Map(lambda r: ("group", r)),
          read[COUNTS_TAG] | "TagReads" >> beam.Map(lambda r: ("read", r)))
         | "AllRecordsOfTheRun" >> beam.Flatten()
         | "KeyRun" >> beam.Map(lambda r: (None, r))
         | "GroupRun" >> beam.GroupByKey()
         | "WriteSummary" >> beam.Map(_write_summary, plan.work))


def _write_summary(keyed, work: str) -> int:
    records = list(keyed[1])
    summary = {"groups": [r for tag, r in records if tag == "group"], "reads": [r for tag, r in records if tag == "read"]}
    storage.write_json(storage.join(work, "summary.json"), summary, indent=None)
    return len(records)


def check_models(forward: str, backward: str | None, src_lang: str, tgt_lang: str):
    """(forward meta, backward meta or None, src_lang, tgt_lang) after checking each model
    directory (files, checkpoint config: models/nmt/checkpoint.py) and that the forward model translates
    src_lang -> tgt_lang and the backward one tgt_lang -> src_lang. The languages are always
    explicit (with defaults) rather than read from the models: read from a swapped forward model,
    they would make the swap look right."""
    from models.nmt.model_dir import check_model_dir

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


def resolve_device(device: str | None, precision: str, runner: str) -> tuple[str | None, str]:
    """(device, precision) as the workers will use them. Checked here when the workers run on this
    machine (DirectRunner): --device cuda without a GPU, bf16 on a CPU that would emulate it.
    Elsewhere the workers resolve 'auto' themselves and the manifest's counters say what they used."""
    import torch

    from models.nmt.translator import cpu_has_native_bf16, resolve_precision

    if not is_local(runner):
        return device, precision
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA GPU is visible on this machine (torch.cuda.is_available() is "
                         "False); leave --device unset to use the CPU")
    effective = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = resolve_precision(precision, effective)
    except ValueError as exc:
        raise UsageError(f"--precision {precision}: {exc}") from None
    if resolved == "bf16" and effective == "cpu" and cpu_has_native_bf16() is False:
        raise UsageError("--precision bf16: this CPU has neither AVX512-BF16 nor AMX, so bf16 would be emulated "
                         "and several times slower than fp32; use --precision fp32 (the default on a CPU)")
    return effective, resolved


def hashed_precision(requested: str, device: str | None, resolved: str) -> str:
    """The precision the config hash records: as requested, except that 'auto' on a GPU records
    what it resolved to where the driver can tell (the DirectRunner), since GPU types differ
    (bf16 or fp16) and a refresh must not mix samples of both. On the CPU 'auto' is always fp32."""
    if requested != "auto" or device != "cuda":
        return requested
    return f"auto:cuda:{resolved}"


def gpu_worker_processes(beam_args: list[str], runner: str, processes_per_gpu: int) -> list[str]:
    """BEAM_ARGS for a DirectRunner run on this machine's GPUs: GPUs x PROCESSES_PER_GPU worker
    processes (each claims its GPU: models/nmt/devices.py), unless the user chose the running mode."""
    import torch

    chosen = any(a.startswith(("--direct_running_mode", "--direct_num_workers")) for a in beam_args)
    if chosen or not is_local(runner):
        return beam_args
    n = max(1, torch.cuda.device_count()) * processes_per_gpu
    log.info("%d GPU(s), %d decoding processes each: --direct_running_mode multi_processing --direct_num_workers %d",
             n // processes_per_gpu, processes_per_gpu, n)
    return [*beam_args, "--direct_running_mode", "multi_processing", "--direct_num_workers", str(n)]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="paragen-generate", description=__doc__.split("\n")[0], allow_abbrev=False,
        epilog="Beam's options pass through: --runner DirectRunner|DaskRunner|FlinkRunner|DataflowRunner, "
               "--direct_running_mode multi_processing, --direct_num_workers N, --dask_client_address HOST:PORT, "
               "--setup_file ./setup.py, ... Any other option is an error. Example: paragen-generate --input "
               "examples/cs-en.example.tsv --output runs/example-out --forward_model runs/example-models/cs-en "
               "--backward_model runs/example-models/en-cs (models from scripts/quickstart.sh).")
    add_generate_args(parser)
    add_bitext_filter_args(parser)
    return parser


def _plan_key(chash: str, shards, unit_pairs: int, previous_run: str | None = None, capacity: int = 0) -> str:
    """What must be the same for --resume to continue a run: config, inputs to decode (names and
    sizes), how records are cut into units, the run it builds on and how shards are binned."""
    inputs = [(s.name, shard_size(s)) for s in shards]
    return hashlib.sha256(json.dumps([chash, inputs, unit_pairs, previous_run, capacity]).encode()).hexdigest()[:16]


def start_run(output: str, plan_key: str, expected: dict, unit_pairs: int, resume: bool,
              overwrite: bool, run_id: str | None = None) -> tuple[str, dict, bool]:
    """(run id, unit layout, resumed?) for a run into OUTPUT. An unfinished run with the same plan
    is continued with --resume; a committed run in OUTPUT is only replaced with --overwrite."""
    committed = read_manifest(output, MANIFEST)
    if committed is not None and not (overwrite or resume):
        raise UsageError(f"{output} already holds a committed run ({committed.get('run_id')}); pass --overwrite "
                         "to replace it (it stays readable until the new run commits)")
    if resume:
        run_id = resumable_run(output, plan_key)
        if run_id is not None:
            plan = storage.read_json(storage.join(work_dir(output, run_id), "plan.json"))
            return run_id, {k: tuple(v) for k, v in plan["layout"].items()}, True
        log.info("--resume: no unfinished run with this plan in %s; starting a new one", output)
    return run_id or new_run_id(), plan_units(expected, unit_pairs), False


def run(argv=None) -> dict:
    """Check everything, then run the job; returns the manifest. UsageError for a mistake."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    opts, beam_args = parser.parse_known_args(argv)
    beam_args = check_beam_args(beam_args, parser)
    runner = runner_name(beam_args)
    threads = torch_threads_for(opts.torch_threads, beam_args)
    output = check_output_location(opts.output)
    inputs = [x for item in opts.input for x in item.split(",") if x]
    cfg = generation_config(opts)
    if opts.unit_pairs < 1:
        raise UsageError(f"--unit_pairs must be >= 1, not {opts.unit_pairs}")
    try:
        file_target = FileTarget(opts.file_rows, opts.file_mb)
    except ValueError as exc:
        raise UsageError(f"--file_rows/--file_mb: {exc}") from None
    if opts.rate is not None and not (opts.dry_run and math.isfinite(opts.rate) and opts.rate > 0):
        raise UsageError(f"--rate is a dry run's decoding speed (--dry_run --rate PAIRS_PER_S, > 0), "
                         f"not {opts.rate}{'' if opts.dry_run else ' without --dry_run'}")
    if opts.max_line_chars < MIN_LINE_CHARS:
        raise UsageError(f"--max_line_chars must be >= {MIN_LINE_CHARS} (the shortest record, 'a<TAB>b'), "
                         f"not {opts.max_line_chars}: a smaller bound rejects every record")
    if opts.run_id is not None:
        check_run_id(opts.run_id)
        if opts.resume:
            raise UsageError("--run_id names a new run; --resume continues the unfinished one (give one of them)")
    try:        # settings first: cheap to check, and a model load is not
        cleaning = CleaningConfig(src_lang=check_lang_code(opts.src_lang, "--src_lang"),
                                  tgt_lang=check_lang_code(opts.tgt_lang, "--tgt_lang"),
                                  encodings=_parse_encodings(opts.encodings),
                                  max_tokens=opts.max_tokens, max_length_ratio=opts.max_length_ratio)
    except ValueError as exc:
        raise UsageError(str(exc) if isinstance(exc, UsageError) else f"--{exc}") from None
    fwd_meta, bwd_meta, src_lang, tgt_lang = check_models(opts.forward_model, opts.backward_model,
                                                          opts.src_lang, opts.tgt_lang)
    if cfg.dual_xent_threshold is not None and not opts.backward_model:
        log.warning("no --backward_model: the dual cross-entropy filter and dual scoring are off")
    device, precision = resolve_device(opts.device, opts.precision, runner)
    if opts.processes_per_gpu < 1:
        raise UsageError(f"--processes_per_gpu must be >= 1, not {opts.processes_per_gpu}")
    if device == "cuda":
        if opts.batch_pairs is None:
            cfg = dataclasses.replace(cfg, batch_pairs=GPU_BATCH_PAIRS)
        beam_args = gpu_worker_processes(beam_args, runner, opts.processes_per_gpu)
        threads = torch_threads_for(opts.torch_threads, beam_args)
    check_compute_types({"--forward_model": fwd_meta, "--backward_model": bwd_meta}, device, runner)
    src_column, tgt_column = opts.src_column or src_lang, opts.tgt_column or tgt_lang
    try:
        shards = discover_shards(inputs, src_lang, tgt_lang)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not shards:
        raise UsageError(f"no input shards found in {inputs}")
    for shard in shards:
        check_shard(shard, src_column, tgt_column)

    models = {"forward": _model_entry(opts.forward_model, fwd_meta)}
    if opts.backward_model:
        models["backward"] = _model_entry(opts.backward_model, bwd_meta)
    bitext = bitext_filter_config(opts)
    check_bitext_languages(bitext, src_lang, tgt_lang)
    for name, path in (("bitext_encoder", bitext.encoder), ("bitext_mlp", bitext.mlp),
                       ("divergence", bitext.divergence)):
        if path:
            sha = directory_sha256(path)
            models[name] = {"path": path, "sha256": sha, "fingerprint": _fingerprint(sha)}
    cleaning_dict = {"src_lang": cleaning.src_lang, "tgt_lang": cleaning.tgt_lang,
                     "encodings": cleaning.encodings, "max_tokens": cleaning.max_tokens,
                     "max_length_ratio": cleaning.max_length_ratio, "max_line_chars": opts.max_line_chars}
    chash = config_hash(cfg, {"models": {k: v["fingerprint"] for k, v in models.items()},
                              "cleaning": cleaning_dict, "preset": opts.preset,
                              "precision": hashed_precision(opts.precision, device, precision),
                              # the bitext models' files are in "models"; their paths do not change output
                              **({"bitext_filter": {"min_similarity": bitext.min_similarity,
                                                    "min_equivalence": bitext.min_equivalence}}
                                 if bitext.enabled else {}),
                              # Moses models' samples changed when "word." became banned (CHANGELOG)
                              **({"banned_forms": 2} if cfg.mode == "sample"
                                 and fwd_meta["tokenization"].get("tokenizer") == "moses" else {}),
                              # beam rows changed when each source got its own length limit (CHANGELOG)
                              **({"length_limit": "per_source"} if cfg.mode == "beam" else {})})
    capacity = bin_capacity(file_target.rows, cfg.num_output_shards)
    reuse = plan_reuse(opts.previous, shards, chash, capacity) if opts.previous else Reuse(decode=list(shards))
    if reuse.why_not:
        log.warning("--previous %s: nothing reused: %s", opts.previous, reuse.why_not)
    if reuse.nothing_to_do:
        print(f"nothing changed since run {reuse.previous_run_id} ({reuse.previous}): same input shards, same "
              "models and settings; nothing decoded, nothing published", flush=True)
        if os.environ.get(NOOP_MARKER_ENV):
            storage.write_json(os.environ[NOOP_MARKER_ENV], {"noop": True, "previous_run_id": reuse.previous_run_id})
        return {"noop": True, "run_id": reuse.previous_run_id, "previous": reuse.previous}
    decode = reuse.decode
    per_shard, exact = estimate_records(decode)
    expected = sum(per_shard.values())
    bins = pack({**per_shard, **{n: reuse.reused[n]["records_read"] for n in reuse.carried}}, capacity)
    if opts.dry_run:
        return dry_run(opts, decode, per_shard, exact, reuse, bins, cfg, models, device, precision, threads,
                       direct_workers(beam_args), file_target, src_column, tgt_column, cleaning)
    plan_key = _plan_key(chash, decode, opts.unit_pairs, reuse.previous_run_id, capacity)
    run_id, layout, resumed = start_run(output, plan_key, per_shard, opts.unit_pairs, opts.resume, opts.overwrite,
                                        opts.run_id)
    plan = Plan(run_id, output, layout, f"{src_lang}-{tgt_lang}", chash, bins, carries(reuse, bins))
    num_units = plan.num_units
    workers = direct_workers(beam_args)
    handler = UnitTranslatorHandler(
        storage.absolute(opts.forward_model), storage.absolute(opts.backward_model) if opts.backward_model else None,
        device, precision, threads, {k: v["sha256"] for k, v in models.items()}, cfg, chash,
        expected // workers if workers and expected else None, bitext=bitext if bitext.enabled else None,
        langs=(src_lang, tgt_lang), processes_per_gpu=opts.processes_per_gpu)
    previous_dedup = [(file_location(reuse.previous, f), shards) for f, shards in reuse.dedup_sources()]
    start = time.time()
    with Claim(output, run_id):
        finished = frozenset(finished_units(plan.work)) if resumed else frozenset()
        storage.write_json(storage.join(plan.work, "plan.json"),
                           {"run_id": run_id, "plan_key": plan_key, "layout": layout, "bins": bins,
                            "unit_pairs": opts.unit_pairs, "config_hash": chash, "command": command_line(argv)})
        log.info("generation run %s%s: %d shard(s) to decode (%s%s records, %d work units%s)%s, preset %s, mode %s, "
                 "%s->%s, runner %s, config %s", run_id, " (resumed)" if resumed else "", len(decode),
                 "" if exact else "~", f"{expected:,}", num_units,
                 f", {len(finished)} finished earlier" if finished else "",
                 f", {len(reuse.reused)} reused from run {reuse.previous_run_id} ({len(reuse.carried)} of them copied "
                 f"into new files), {len(reuse.removed)} removed" if reuse.previous else "", opts.preset, cfg.mode, src_lang, tgt_lang, runner.rsplit(".", 1)[-1], chash)
        if "dask" in runner.lower() and not any(a.startswith(("--dask_npartitions", "--dask_partition_size"))
                                                for a in beam_args):
            beam_args = [*beam_args, "--dask_npartitions", str(min(max(plan.num_units, 2), 512))]
        counters = run_pipeline(lambda p: build(
            p, plan, decode, cfg, cleaning, handler, opts.max_line_chars, src_column, tgt_column, finished,
            use_run_inference="dask" not in runner.lower(), previous_dedup=previous_dedup, file_target=file_target),
            beam_args)
        elapsed = time.time() - start
        summary_path = storage.join(plan.work, "summary.json")
        summary = storage.read_json(summary_path) if storage.isfile(summary_path) else {"groups": [], "reads": []}
        _counts, new_files, units, decoded = summarize_run(summary["groups"], summary["reads"])
        inputs = _inputs(run_id, summary["reads"], decoded, reuse, bins)
        counts = totals(inputs)
        files = {t: sorted([_reused_entry(output, reuse.previous, f) for f in reuse.kept_files[t]] + new_files[t],
                           key=lambda e: (e["bin"], e["shard"], e["path"])) for t in DATA_TABLES}
        units.update(planned=num_units, published_files=sum(len(v) for v in files.values()))
        manifest = check_manifest({
            "contract_version": CONTRACT_VERSION, "run_id": run_id, "config_hash": chash, "preset": opts.preset,
            "config": cfg.to_dict(), "cleaning": cleaning_dict, "models": models,
            "runner": runner.rsplit(".", 1)[-1],
            "precision": {"requested": opts.precision, "resolved": precision if precision != "auto" else None,
                          "workers": {k[len("workers_"):]: v for k, v in counters.items() if k.startswith("workers_")}},
            "device": device, "torch_threads_per_worker": threads,
            "inputs": [inputs[name] for name in sorted(inputs)],
            "previous": {"run_id": reuse.previous_run_id, "path": reuse.previous, "why_nothing_reused": reuse.why_not,
                         "reused_shards": sorted(reuse.reused), "copied_shards": sorted(reuse.carried),
                         "removed_shards": reuse.removed}
            if opts.previous else None,
            "counts": counts, "files": files, "units": units, "counters": counters,
            "file_target": {"rows": file_target.rows, "mb": file_target.megabytes},
            "versions": versions(), "command": command_line(argv), "resumed": resumed,
            "seconds": round(elapsed, 2), "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        _warn_empty_shards(inputs, run_id)
        if not counts["reconciled"]:
            storage.write_json(storage.join(plan.work, "manifest.json"), manifest)
            _print_summary(counts, counters, elapsed, output)
            raise JobFailed(f"counts do not reconcile (records read != pairs with output + rejects); "
                            f"not published, the previous run (if any) stays; see {plan.work}/manifest.json")
        if counts["paraphrase_rows"] == 0 and not opts.allow_empty:
            storage.write_json(storage.join(plan.work, "manifest.json"), manifest)
            _print_summary(counts, counters, elapsed, output)
            raise JobFailed(f"{_nothing_to_publish(counts)}; not published, the previous run (if any) stays; its "
                            f"rejects are listed in {plan.work}/manifest.json (--allow_empty publishes such a run)",
                            EXIT_EMPTY)
        removed = publish(output, MANIFEST, manifest, TABLES)
        log.info("published run %s: %d files; removed %d files of earlier runs and attempts",
                 run_id, sum(len(v) for v in files.values()), len(removed))
    _print_summary(counts, counters, elapsed, output)
    return manifest


DRY_RUN_SAMPLE = 16          # pairs decoded on the driver to measure a rate for --dry_run


def measure_rate(shard, cfg, models: dict, device, precision, threads, src_column, tgt_column, cleaning,
                 max_line_chars: int) -> tuple[float, int]:
    """(pairs per second, pairs timed) of one worker on this machine: the first DRY_RUN_SAMPLE clean
    pairs of SHARD through the decoding steps, after one pair of warm-up."""
    from common.shards import read_shard
    from models.nmt.loading import load_engine
    from paracorpus.cleaning import Rejection, clean_pair, pair_id
    from paracorpus.paraphrasing import piece_limits
    from paracorpus.steps import decoding_steps
    from paracorpus.units import PAIR, generate_unit

    forward = load_engine(models["forward"]["path"], device=device, precision=precision, threads=threads)
    backward = load_engine(models["backward"]["path"], device=device, precision=precision, threads=threads) \
        if "backward" in models else None
    steps = decoding_steps(forward, backward, cfg, "dry-run", piece_limits(forward, backward, cfg.max_pieces))
    pairs = []
    for rec in read_shard(shard, max_line_chars, src_column, tgt_column):
        if rec.error is None:
            cleaned = clean_pair(rec.source, rec.reference, cleaning)
            if not isinstance(cleaned, Rejection):
                pairs.append((PAIR, {"pair_id": pair_id(rec.shard, rec.index, rec.source, rec.reference),
                                     "input_shard": rec.shard, "input_index": rec.index,
                                     "source": cleaned[0], "reference": cleaned[1]}))
        if len(pairs) > DRY_RUN_SAMPLE:
            break
    if len(pairs) < 2:
        return 0.0, 0
    generate_unit(pairs[:1], steps, cfg.batch_pairs, "dry-run")              # warm-up: first calls are slow
    start = time.perf_counter()
    generate_unit(pairs[1:], steps, cfg.batch_pairs, "dry-run")
    return (len(pairs) - 1) / max(time.perf_counter() - start, 1e-9), len(pairs) - 1


def dry_run(opts, decode, per_shard: dict, exact: bool, reuse: Reuse, bins: dict, cfg, models: dict, device,
            precision, threads, workers: int | None, file_target, src_column, tgt_column, cleaning) -> dict:
    """Print what the run would do and cost, write nothing; its plan as a dict."""
    from common.shards import shard_size

    layout = plan_units(per_shard, opts.unit_pairs) if per_shard else {}
    units = sum(n for _first, n in layout.values())
    records = sum(per_shard.values())
    size = sum(shard_size(s) for s in decode)
    per_record = cfg.keep if cfg.mode == "sample" or cfg.nbest > 1 else 1
    # per bin: the units that write into it (a carried shard's rows are in every partition) and a
    # bound on its paraphrase rows, so files = at least one per partition written, one per target
    bin_units: dict = {}
    bin_rows: dict = {}
    for name, bin_ in bins.items():
        carried = reuse.reused.get(name)
        bin_units[bin_] = bin_units.get(bin_, 0) + (layout[name][1] if name in layout else cfg.num_output_shards)
        bin_rows[bin_] = bin_rows.get(bin_, 0) + (carried["counts"]["paraphrase_rows"] if carried
                                                  else per_shard[name] * per_record)
    groups = sum(min(n, cfg.num_output_shards) for n in bin_units.values())
    files = sum(max(min(bin_units[b], cfg.num_output_shards), -(-bin_rows[b] // file_target.rows))
                for b in bin_units if bin_rows[b])
    kept = len(reuse.kept_files["paraphrases"])
    copied = sum(reuse.reused[n]["records_read"] for n in reuse.carried)
    if opts.rate is not None:
        rate, timed = opts.rate, 0
    elif decode:
        rate, timed = measure_rate(decode[0], cfg, models, device, precision, threads, src_column, tgt_column,
                                   cleaning, opts.max_line_chars)
    else:
        rate, timed = 0.0, 0
    processes = workers or 1
    seconds = records / (rate * processes) if rate else None
    lines = [f"dry run: nothing written to {opts.output}",
             f"  input shards to decode: {len(decode)} ({'' if exact else '~'}{records:,} records, {size:,} bytes)"
             + (f"; {len(reuse.reused)} reused from run {reuse.previous_run_id} ({len(reuse.carried)} of them copied "
                f"into new files, {copied:,} records), {len(reuse.removed)} removed" if reuse.previous else ""),
             f"  work units: {units:,} of about {opts.unit_pairs} records; {len(set(bins.values())):,} bin(s) of input "
             f"shards (at least {bin_capacity(file_target.rows, cfg.num_output_shards):,} records each but the last) x "
             f"{cfg.num_output_shards} output partitions: {groups:,} groups",
             f"  files the run would write: about {files:,} per table (paraphrases, rejects, dedup), each at most "
             f"{file_target.rows:,} rows or {file_target.megabytes:g} MB"
             + (f", and keep {kept:,} of run {reuse.previous_run_id}" if reuse.previous else "")
             + f"; up to {3 * units:,} unit files before compaction",
             f"  decoding rate: {rate:.2f} pairs/s per worker" + (f" (measured on {timed} pairs of "
                                                                   f"{decode[0].name} on this machine)" if timed else
                                                                   " (--rate)" if opts.rate is not None else ""),
             "  estimated decoding time: " + (f"{format_seconds(seconds)} with {processes} worker process(es)"
                                              if seconds is not None else "unknown")]
    print("\n".join(lines), flush=True)
    return {"dry_run": True, "shards": len(decode), "records": records, "exact": exact, "bytes": size, "units": units,
            "bins": len(set(bins.values())), "groups": groups, "files_per_table": files,
            "rows_per_file": sum(bin_rows.values()) // files if files else 0, "unit_files": 3 * units,
            "kept_files_per_table": kept, "copied_records": copied, "rate": rate, "estimated_seconds": seconds,
            "reused_shards": sorted(reuse.reused), "copied_shards": sorted(reuse.carried),
            "removed_shards": reuse.removed}


def _inputs(run_id: str, reads: list[dict], decoded: dict, reuse: Reuse, bins: dict) -> dict:
    """{shard: its manifest entry} of a run: the shards it decoded (read records and their counts)
    and those it reuses from REUSE.previous (their entries taken over); BINS: the bin of each
    decoded or carried shard."""
    inputs = {}
    for read in reads:
        name = read["input_shard"]
        inputs[name] = {**{k: read[k] for k in ("input_shard", "kind", "paths", "sha256", "bytes")},
                        "versions": reuse.fingerprints.get(name, {}).get("versions"),
                        "records_read": decoded[name]["records_read"], "counts": decoded[name]["counts"],
                        "decoded_in": run_id, "bin": bins[name]}
    for name, entry in reuse.reused.items():
        inputs[name] = {**entry, "versions": reuse.fingerprints[name]["versions"], "bin": bins.get(name, entry["bin"])}
    return inputs


def carries(reuse: Reuse, bins: dict) -> list[tuple[str, dict]]:
    """(group key, compaction.carry_item) for every previous file holding rows of a carried shard:
    what each new group copies from the previous run."""
    out = []
    for old_bin, files in sorted(reuse.copy_from.items()):
        carried = reuse.carried_from(old_bin)
        for new_bin in sorted({bins[n] for n in carried}):
            members = [n for n in carried if bins[n] == new_bin]
            for table in DATA_TABLES:
                out += [(group_key(new_bin, f["shard"]),
                         carry_item(table, file_location(reuse.previous, f), members, f)) for f in files[table]]
    return out


def _reused_entry(output: str, previous: str, entry: dict) -> dict:
    """The previous run's manifest ENTRY as OUTPUT's manifest names it: its path rewritten to be
    relative to OUTPUT (or a full URL), so every entry opens as <OUTPUT>/<path>."""
    moved = {k: v for k, v in entry.items() if k != "root"}
    moved["path"] = entry_path(output, file_location(previous, entry))
    return moved


def _top_reasons(by_reason: dict, n: int = 3) -> str:
    top = sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return ", ".join(f"{reason} {count:,}" for reason, count in top)


def _nothing_to_publish(counts: dict) -> str:
    """Why a run has no paraphrase row, in words."""
    if counts["records_read"] == 0:
        return "the input shards hold no records"
    return (f"every record was rejected ({counts['rejected']:,} of {counts['records_read']:,}; top reasons: "
            f"{_top_reasons(counts['rejected_by_reason'])})")


def _warn_empty_shards(inputs: dict, run_id: str) -> None:
    """A warning for each input shard this run decoded that gave no paraphrase: a wrong column
    order or language is easier to find per shard than in the run's totals."""
    for name, entry in sorted(inputs.items()):
        counts = entry["counts"]
        if entry.get("decoded_in") == run_id and counts["paraphrase_rows"] == 0:
            log.warning("input shard %s gave no paraphrase: %s", name,
                        "no records" if not entry["records_read"] else
                        f"all {entry['records_read']:,} records rejected ({_top_reasons(counts['rejected_by_reason'])})")


def _model_entry(path: str, meta: dict) -> dict:
    """What the manifest records of a translation model: where it is, what runs it (engine,
    members, tokenization) and the sha256 of every file, whose digest (the fingerprint) the
    config hash covers."""
    entry = {"path": storage.absolute(path), "engine": meta["engine"], "members": max(1, len(meta["members"])),
             "tokenization": meta["tokenization"], "sha256": meta["sha256"], "fingerprint": _fingerprint(meta["sha256"])}
    if meta["engine"] == "ctranslate2":
        entry.update(family=meta["family"], compute_type=meta["compute_type"])
    return entry


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


def _fingerprint(sha256: dict) -> str:
    """A short id of a model's files (what the config hash records)."""
    return hashlib.sha256(json.dumps(sha256, sort_keys=True).encode()).hexdigest()[:16]


def _print_summary(counts: dict, counters: dict, elapsed: float, output: str) -> None:
    lines = [f"read {counts['records_read']} records in {elapsed:.1f}s "
             f"({counts['records_read'] / max(elapsed, 1e-9):.1f} records/s)",
             f"  pairs with paraphrases: {counts['pairs_with_paraphrases']} "
             f"({counts['paraphrase_rows']} paraphrase rows)",
             f"  rejected: {counts['rejected']}"]
    lines += [f"    {reason}: {n}" for reason, n in counts["rejected_by_reason"].items()]
    lines.append(f"  reconciled (read = with paraphrases + rejected): {counts['reconciled']}")
    stages = {k[3:]: v for k, v in counters.items() if k.startswith("ms_")}
    if counters:
        lines.append("  counters: " + ", ".join(f"{k}={v}" for k, v in counters.items() if not k.startswith("ms_")))
    if stages and counts["records_read"]:
        lines.append("  worker time per record read, by stage (ms, all workers): " + ", ".join(
            f"{name} {ms / counts['records_read']:.1f}" for name, ms in sorted(stages.items(), key=lambda kv: -kv[1])))
    lines.append(f"  output: {output}")
    print("\n".join(lines), flush=True)


def main(argv=None) -> int:
    configure_logging()
    return cli_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
