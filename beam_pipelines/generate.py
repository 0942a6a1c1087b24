"""The generation job: bitext shards -> paraphrase Parquet partitions, rejects and a manifest.

    paragen-generate --input examples/cs-en.example.tsv --output runs/example-out \\
        --forward_model runs/example-models/cs-en --backward_model runs/example-models/en-cs

One pair's path: ReadShard (transforms/io.py, paracorpus/shards.py) -> CleanPairs
(paracorpus/cleaning.py) -> Deduplicate -> GroupByKey on the output shard -> GenerateForShard
(transforms/generation.py -> paracorpus/paraphrasing.py -> models/nmt.py, paracorpus/clustering.py)
-> WritePartition (columns in paracorpus/schema.py).

Everything that can be checked is checked before anything is written: options (unknown ones are
an error), the runner, the models (files, safe checkpoint config, languages and direction),
device and precision, every input shard (opens, Parquet columns) and the output location.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import sys
import time

import apache_beam as beam

from beam_pipelines.options import (check_beam_args, direct_workers, is_local, run_pipeline, runner_name,
                                    torch_threads_for)
from paracorpus.atomic import write_json
from paracorpus.cleaning import CleaningConfig
from paracorpus.cli import UsageError, check_output_location, cli_main, command_line, configure_logging, versions
from paracorpus.config import PRESETS, GenerationConfig, config_hash
from paracorpus.names import check_lang_code
from paracorpus.schema import CONTRACT_VERSION, MANIFEST, PARAPHRASE_SCHEMA, REJECT_SCHEMA
from paracorpus.shards import (DEFAULT_MAX_LINE_CHARS, check_shard, discover_shards, estimate_records,
                               shard_fingerprint)
from transforms.cleaning import CleanPairs, Deduplicate
from transforms.generation import GenerateForShard
from transforms.io import (COUNTS_TAG, MAIN_TAG, REJECTS_TAG, ReadShard, SplitTagged, WriteCounts,
                           WritePartition, output_shard)

log = logging.getLogger("paragen")

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
                   help="replace a run already in --output (default: refuse)")
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
                   help="model weights' precision (default auto: fp16 on a GPU, fp32 on the CPU); bf16 needs a "
                        "CPU with AVX512-BF16 or AMX and gives slightly different scores")
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


def build(p: beam.Pipeline, shards, output: str, cfg: GenerationConfig, cleaning: CleaningConfig,
          chash: str, forward_model: str, backward_model: str | None, device: str | None,
          precision: str, max_line_chars: int, src_column: str, tgt_column: str,
          torch_threads: int | None = None, expected_pairs_per_worker: int | None = None) -> None:
    lang_pair = f"{cleaning.src_lang}-{cleaning.tgt_lang}"
    n_shards = cfg.num_output_shards
    read = (p | "ShardList" >> beam.Create(shards)
            | "ReadShards" >> beam.ParDo(ReadShard(max_line_chars, src_column, tgt_column, chash))
            | "SplitRead" >> SplitTagged((MAIN_TAG, REJECTS_TAG, COUNTS_TAG)))
    counts_written = read[COUNTS_TAG] | "WriteReadCounts" >> beam.ParDo(WriteCounts(output))
    cleaned = (read[MAIN_TAG] | "Clean" >> beam.ParDo(CleanPairs(cleaning, chash))
               | "SplitClean" >> SplitTagged())
    dedup = cleaned[MAIN_TAG] | "Deduplicate" >> Deduplicate(chash) | "SplitDedup" >> SplitTagged()
    generated = (dedup[MAIN_TAG]
                 | "KeyByOutputShard" >> beam.Map(lambda r: (output_shard(r["pair_id"], n_shards), r))
                 | "GroupByOutputShard" >> beam.GroupByKey()
                 | "Generate" >> beam.ParDo(GenerateForShard(forward_model, backward_model, device, chash, cfg,
                                                                  precision, torch_threads, expected_pairs_per_worker))
                 | "SplitGenerated" >> SplitTagged())
    rows_written = (generated[MAIN_TAG]
         | "KeyRows" >> beam.Map(lambda r: ((lang_pair, output_shard(r["pair_id"], n_shards)), r))
         | "GroupRows" >> beam.GroupByKey()
         | "WriteParaphrases" >> beam.ParDo(WritePartition(output, "paraphrases", PARAPHRASE_SCHEMA,
                                                           ("pair_id", "rank"))))
    rejects_written = ((read[REJECTS_TAG], cleaned[REJECTS_TAG], dedup[REJECTS_TAG], generated[REJECTS_TAG])
         | "AllRejects" >> beam.Flatten()
         | "KeyRejects" >> beam.Map(lambda r: ((lang_pair, output_shard(r["pair_id"], n_shards)), r))
         | "GroupRejects" >> beam.GroupByKey()
         | "WriteRejects" >> beam.ParDo(WritePartition(output, "rejects", REJECT_SCHEMA,
                                                       ("input_shard", "input_index"))))
    # One sink that depends on every write: the DaskRunner computes only the graph behind the
    # last transform of the pipeline, so the writes must all lead into it.
    _ = ((counts_written, rows_written, rejects_written)
         | "AllWritten" >> beam.Flatten()
         | "KeyDone" >> beam.Map(lambda _: (None, 1))
         | "GroupDone" >> beam.GroupByKey()
         | "JobDone" >> beam.Map(lambda kv: sum(kv[1])))


def summarize(output: str) -> dict:
    """Counts read back from what was written, and the reconciliation input = kept + rejected."""
    import pyarrow.dataset as ds

    counts_dir = os.path.join(output, "_counts")
    read = {}
    for name in sorted(os.listdir(counts_dir)) if os.path.isdir(counts_dir) else []:
        with open(os.path.join(counts_dir, name)) as f:
            rec = json.load(f)
        read[rec["input_shard"]] = rec["records_read"]

    def table(name, columns):
        path = os.path.join(output, name)
        if not os.path.isdir(path):
            return None
        return ds.dataset(path, format="parquet", partitioning="hive").to_table(columns=columns)

    para = table("paraphrases", ["pair_id"])
    rej = table("rejects", ["pair_id", "reason"])
    pairs_out = len(set(para.column("pair_id").to_pylist())) if para is not None else 0
    reasons: dict[str, int] = {}
    for r in rej.column("reason").to_pylist() if rej is not None else []:
        reasons[r] = reasons.get(r, 0) + 1
    total_read = sum(read.values())
    rejected = sum(reasons.values())
    return {"records_read": total_read, "records_read_per_shard": read,
            "pairs_with_paraphrases": pairs_out, "paraphrase_rows": para.num_rows if para is not None else 0,
            "rejected": rejected, "rejected_by_reason": dict(sorted(reasons.items())),
            "reconciled": total_read == pairs_out + rejected}


def _existing_run(output: str, overwrite: bool) -> list[str]:
    """What of an earlier run is in OUTPUT (to be replaced); UsageError without --overwrite."""
    existing = [n for n in ("paraphrases", "rejects", "_counts", MANIFEST)
                if os.path.exists(os.path.join(output, n))]
    if existing and not overwrite:
        raise UsageError(f"{output} already holds a run ({', '.join(existing)}); pass --overwrite to replace it")
    return existing


def _prepare_output(output: str, existing: list[str]) -> None:
    for n in existing:
        path = os.path.join(output, n)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    os.makedirs(output, exist_ok=True)


def check_models(forward: str, backward: str | None, src_lang: str, tgt_lang: str):
    """(forward meta, backward meta or None, src_lang, tgt_lang) after checking each model
    directory (files, checkpoint config: models/checkpoint.py) and that the forward model translates
    src_lang -> tgt_lang and the backward one tgt_lang -> src_lang. The languages are always
    explicit (with defaults) rather than read from the models: read from a swapped forward model,
    they would make the swap look right."""
    from models.checkpoint import check_model_dir

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

    from models.nmt import cpu_has_native_bf16, resolve_precision

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="paragen-generate", description=__doc__.split("\n")[0], allow_abbrev=False,
        epilog="Beam's options pass through: --runner DirectRunner|DaskRunner|FlinkRunner|DataflowRunner, "
               "--direct_running_mode multi_processing, --direct_num_workers N, --dask_client_address HOST:PORT, "
               "--setup_file ./setup.py, ... Any other option is an error. Example: paragen-generate --input "
               "examples/cs-en.example.tsv --output runs/example-out --forward_model runs/example-models/cs-en "
               "--backward_model runs/example-models/en-cs (models from scripts/quickstart.sh).")
    add_generate_args(parser)
    return parser


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
    fwd_meta, bwd_meta, src_lang, tgt_lang = check_models(opts.forward_model, opts.backward_model,
                                                          opts.src_lang, opts.tgt_lang)
    if cfg.dual_xent_threshold is not None and not opts.backward_model:
        log.warning("no --backward_model: the dual cross-entropy filter and dual scoring are off")
    device, precision = resolve_device(opts.device, opts.precision, runner)
    cleaning = CleaningConfig(src_lang=src_lang, tgt_lang=tgt_lang, encodings=_parse_encodings(opts.encodings),
                              max_tokens=opts.max_tokens, max_length_ratio=opts.max_length_ratio)
    src_column, tgt_column = opts.src_column or src_lang, opts.tgt_column or tgt_lang
    try:
        shards = discover_shards(inputs, src_lang, tgt_lang)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not shards:
        raise UsageError(f"no input shards found in {inputs}")
    for shard in shards:
        check_shard(shard, src_column, tgt_column)
    existing = _existing_run(output, opts.overwrite)

    from models.nmt import model_fingerprint

    models = {"forward": {"path": os.path.abspath(opts.forward_model),
                          "fingerprint": model_fingerprint(opts.forward_model)}}
    if opts.backward_model:
        models["backward"] = {"path": os.path.abspath(opts.backward_model),
                              "fingerprint": model_fingerprint(opts.backward_model)}
    cleaning_dict = {"src_lang": cleaning.src_lang, "tgt_lang": cleaning.tgt_lang,
                     "encodings": cleaning.encodings, "max_tokens": cleaning.max_tokens,
                     "max_length_ratio": cleaning.max_length_ratio, "max_line_chars": opts.max_line_chars}
    chash = config_hash(cfg, {"models": {k: v["fingerprint"] for k, v in models.items()},
                              "cleaning": cleaning_dict, "preset": opts.preset,
                              "precision": opts.precision})
    expected, exact = estimate_records(shards)
    workers = direct_workers(beam_args)
    log.info("generation: %d shard(s), %s%s records, preset %s, mode %s, %s->%s, runner %s, config %s",
             len(shards), "" if exact else "~", f"{expected:,}", opts.preset, cfg.mode, src_lang, tgt_lang,
             runner.rsplit(".", 1)[-1], chash)

    _prepare_output(output, existing)
    start = time.time()
    counters = run_pipeline(lambda p: build(
        p, shards, output, cfg, cleaning, chash, os.path.abspath(opts.forward_model),
        os.path.abspath(opts.backward_model) if opts.backward_model else None, device, precision,
        opts.max_line_chars, src_column, tgt_column, threads,
        expected // workers if workers and expected else None), beam_args)
    elapsed = time.time() - start
    counts = summarize(output)
    manifest = {
        "contract_version": CONTRACT_VERSION, "config_hash": chash, "preset": opts.preset,
        "config": cfg.to_dict(), "cleaning": cleaning_dict, "models": models, "runner": runner.rsplit(".", 1)[-1],
        "precision": {"requested": opts.precision, "resolved": precision if precision != "auto" else None,
                      "workers": {k[len("workers_"):]: v for k, v in counters.items() if k.startswith("workers_")}},
        "device": device, "torch_threads_per_worker": threads,
        "inputs": [shard_fingerprint(s) for s in shards], "counts": counts, "counters": counters,
        "versions": versions(), "command": command_line(argv),
        "seconds": round(elapsed, 2), "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_json(os.path.join(output, MANIFEST), manifest)
    _print_summary(counts, counters, elapsed, output)
    if not counts["reconciled"]:
        raise SystemExit("error: counts do not reconcile (records read != pairs with output + rejects); "
                         f"see {output}/_manifest.json")
    return manifest


def _print_summary(counts: dict, counters: dict, elapsed: float, output: str) -> None:
    lines = [f"read {counts['records_read']} records in {elapsed:.1f}s "
             f"({counts['records_read'] / max(elapsed, 1e-9):.1f} records/s)",
             f"  pairs with paraphrases: {counts['pairs_with_paraphrases']} "
             f"({counts['paraphrase_rows']} paraphrase rows)",
             f"  rejected: {counts['rejected']}"]
    lines += [f"    {reason}: {n}" for reason, n in counts["rejected_by_reason"].items()]
    lines.append(f"  reconciled (read = with paraphrases + rejected): {counts['reconciled']}")
    if counters:
        lines.append("  counters: " + ", ".join(f"{k}={v}" for k, v in counters.items()))
    lines.append(f"  output: {output}")
    print("\n".join(lines), flush=True)


def main(argv=None) -> int:
    configure_logging()
    return cli_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
