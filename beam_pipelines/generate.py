"""The generation job: bitext shards -> paraphrase Parquet partitions, rejects and a manifest.

    python -m beam_pipelines.generate --input corpus.tsv.gz --output out/ \\
        --forward_model models/cs-en --backward_model models/en-cs --preset parabank2-cpu

One pair's path: ReadShard (transforms/io.py, paracorpus/shards.py) -> CleanPairs
(paracorpus/cleaning.py) -> Deduplicate -> GroupByKey on the output shard -> GenerateForShard
(transforms/generation.py -> paracorpus/paraphrasing.py -> models/nmt.py, paracorpus/clustering.py)
-> WritePartition (columns in paracorpus/schema.py).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, SetupOptions, StandardOptions

from paracorpus.atomic import write_json
from paracorpus.cleaning import CleaningConfig
from paracorpus.config import PRESETS, GenerationConfig, config_hash
from paracorpus.schema import CONTRACT_VERSION, MANIFEST, PARAPHRASE_SCHEMA, REJECT_SCHEMA
from paracorpus.shards import DEFAULT_MAX_LINE_CHARS, discover_shards, shard_fingerprint
from transforms.cleaning import CleanPairs, Deduplicate
from transforms.generation import GenerateForShard
from transforms.io import (COUNTS_TAG, MAIN_TAG, REJECTS_TAG, ReadShard, SplitTagged, WriteCounts,
                           WritePartition, output_shard)

log = logging.getLogger("paragen")

_TUNABLES = ("mode", "num_sets", "num_samples", "topk", "beam", "nbest", "clusters", "keep",
             "score_threshold", "dual_xent_threshold", "seed", "batch_pairs", "num_output_shards",
             "max_banned_words")


def add_generate_args(parser: argparse.ArgumentParser) -> None:
    """The job's own options, Beam style (--snake_case). Not a PipelineOptions subclass: those are
    re-parsed from the Beam arguments by every view_as(), where our required options are absent."""
    g = parser.add_argument_group("paraphrase generation")
    g.add_argument("--input", action="append", required=True,
                   help="input shard: file (.tsv/.tsv.gz/.parquet), glob, directory, or Moses prefix "
                        "(PREFIX.<src_lang>[.gz] + PREFIX.<tgt_lang>[.gz]); repeat or comma-separate")
    g.add_argument("--output", required=True, help="output directory (Hive-partitioned Parquet)")
    g.add_argument("--src_lang", default="cs", help="foreign language code (default cs)")
    g.add_argument("--tgt_lang", default="en", help="English side language code (default en)")
    g.add_argument("--forward_model", required=True, help="fairseq model dir, src->tgt (generator)")
    g.add_argument("--backward_model", default=None,
                   help="fairseq model dir, tgt->src (dual scoring and the dual cross-entropy filter)")
    g.add_argument("--preset", default="parabank2-cpu", choices=sorted(PRESETS),
                   help="paper settings to start from (default parabank2-cpu)")
    g.add_argument("--mode", default=None, choices=["sample", "beam"], help="override the preset's mode")
    for name, typ, doc in [
        ("num_sets", int, "S: negative-constraint sets per pair"),
        ("num_samples", int, "N: top-k samples per constraint set"),
        ("topk", int, "k of top-k sampling"),
        ("max_banned_words", int, "words per constraint set (1..this)"),
        ("beam", int, "beam size (beam mode)"),
        ("nbest", int, "hypotheses kept per source (beam mode)"),
        ("clusters", int, "k free Levenshtein clusters (plus the reference cluster)"),
        ("keep", int, "n paraphrases kept per pair"),
        ("score_threshold", float, "drop candidates whose combined score is above (<0: off)"),
        ("dual_xent_threshold", float, "drop pairs whose dual cross-entropy is above (<0: off)"),
        ("seed", int, "random seed (same seed, same output)"),
        ("batch_pairs", int, "pairs per decoding batch"),
        ("num_output_shards", int, "output partitions per language pair"),
    ]:
        g.add_argument(f"--{name}", type=typ, default=None, help=f"{doc} (default: from preset)")
    g.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    g.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16", "fp16"],
                   help="model weights' precision: auto = fp16 on a GPU, fp32 on the CPU; bf16 halves "
                        "the weights on CPUs with AVX512-BF16 (speed: see README), slightly different scores")
    g.add_argument("--torch_threads", type=int, default=0,
                   help="CPU threads of each worker process's model (default 0 = auto: the cores divided "
                        "by the DirectRunner's worker processes; elsewhere torch's default, which "
                        "follows OMP_NUM_THREADS). Two processes with two threads each on two cores "
                        "decode about 3x slower than with one each.")
    g.add_argument("--max_line_chars", type=int, default=DEFAULT_MAX_LINE_CHARS,
                   help="records longer than this are rejected unparsed")
    g.add_argument("--max_tokens", type=int, default=100, help="max whitespace tokens per side")
    g.add_argument("--max_length_ratio", type=float, default=3.0, help="max token-length ratio")
    g.add_argument("--encodings", default="",
                   help="per-language charset rule, e.g. 'en=latin-1,cs=iso8859-2' ('xx=' disables)")
    g.add_argument("--src_column", default=None, help="Parquet input: foreign column (default src_lang)")
    g.add_argument("--tgt_column", default=None, help="Parquet input: English column (default tgt_lang)")
    g.add_argument("--overwrite", action="store_true", help="replace an existing output directory")


def generation_config(opts) -> GenerationConfig:
    base = PRESETS[opts.preset]
    changes = {name: getattr(opts, name) for name in _TUNABLES if getattr(opts, name, None) is not None}
    for name in ("score_threshold", "dual_xent_threshold"):
        if name in changes and changes[name] < 0:
            changes[name] = None
    import dataclasses
    return dataclasses.replace(base, **changes)


def _parse_encodings(spec: str) -> dict:
    out = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        if "=" not in item:
            raise ValueError(f"--encodings item {item!r} is not LANG=CHARSET")
        lang, enc = item.split("=", 1)
        if enc:
            "".encode(enc)   # raises LookupError for an unknown charset, before any work starts
        out[lang.strip()] = enc.strip()
    return out


def build(p: beam.Pipeline, shards, output: str, cfg: GenerationConfig, cleaning: CleaningConfig,
          chash: str, forward_model: str, backward_model: str | None, device: str | None,
          precision: str, max_line_chars: int, src_column: str, tgt_column: str,
          torch_threads: int | None = None) -> None:
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
                                                                  precision, torch_threads))
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


def _prepare_output(output: str, overwrite: bool) -> None:
    existing = [n for n in ("paraphrases", "rejects", "_counts", MANIFEST)
                if os.path.exists(os.path.join(output, n))]
    if existing and not overwrite:
        raise SystemExit(f"error: {output} already holds a run ({', '.join(existing)}); "
                         "pass --overwrite to replace it")
    for n in existing:
        path = os.path.join(output, n)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    os.makedirs(output, exist_ok=True)


_RUNNER_ALIASES = {"daskrunner": "apache_beam.runners.dask.dask_runner.DaskRunner",
                   "dask": "apache_beam.runners.dask.dask_runner.DaskRunner"}


def _qualify_runner(beam_args: list[str]) -> list[str]:
    """Beam knows the DaskRunner only by its module path; accept the short name too."""
    out = list(beam_args)
    for i, arg in enumerate(out):
        if arg == "--runner" and i + 1 < len(out):
            out[i + 1] = _RUNNER_ALIASES.get(out[i + 1].lower(), out[i + 1])
        elif arg.startswith("--runner="):
            out[i] = "--runner=" + _RUNNER_ALIASES.get(arg.split("=", 1)[1].lower(), arg.split("=", 1)[1])
    return out


def worker_threads(requested: int, runner: str, running_mode: str | None, num_workers: int | None,
                   cpu_count: int) -> int | None:
    """Torch threads per worker process, or None to keep torch's default. Worker processes that
    share a machine must split its cores: oversubscribed, OpenMP threads wait on each other."""
    if requested < 0:
        raise ValueError(f"--torch_threads must be >= 0, not {requested}")
    if requested:
        return requested
    direct = runner.lower().removesuffix("runner") == "direct"     # Beam accepts direct, DirectRunner, ...
    if direct and running_mode in ("multi_processing", "multi_threading"):
        workers = num_workers or cpu_count          # Beam: 0 workers means one per core
        return max(1, cpu_count // workers)
    return None


def torch_threads_for(requested: int, beam_args: list[str]) -> int | None:
    """worker_threads() for the runner and DirectRunner options in BEAM_ARGS, on this machine."""
    options = PipelineOptions(_qualify_runner(beam_args))
    runner = (options.view_as(StandardOptions).runner or "DirectRunner").rsplit(".", 1)[-1]
    direct = options.view_as(DirectOptions)
    return worker_threads(requested, runner, direct.direct_running_mode, direct.direct_num_workers,
                          os.cpu_count() or 1)


def run(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        prog="paragen-generate", description=__doc__.split("\n")[0],
        epilog="Beam options (--runner DirectRunner|DaskRunner|FlinkRunner|DataflowRunner, "
               "--direct_running_mode, --direct_num_workers, --dask_client_address, --setup_file, ...) "
               "are passed through to Beam.")
    add_generate_args(parser)
    known, beam_args = parser.parse_known_args(argv)
    opts = argparse.Namespace(**vars(known))
    try:
        threads = torch_threads_for(opts.torch_threads, beam_args)
    except ValueError as exc:
        parser.error(str(exc))
    opts.input = [x for item in opts.input for x in item.split(",") if x]
    try:
        cfg = generation_config(opts)
        cleaning = CleaningConfig(src_lang=opts.src_lang, tgt_lang=opts.tgt_lang,
                                  encodings=_parse_encodings(opts.encodings),
                                  max_tokens=opts.max_tokens, max_length_ratio=opts.max_length_ratio)
        shards = discover_shards(opts.input, opts.src_lang, opts.tgt_lang)
    except (ValueError, LookupError, FileNotFoundError) as exc:
        parser.error(str(exc))
    if not shards:
        parser.error(f"no input shards found in {opts.input}")
    for label, path in (("--forward_model", opts.forward_model), ("--backward_model", opts.backward_model)):
        if path and not os.path.exists(os.path.join(path, "model.pt")):
            parser.error(f"{label} {path}: no model.pt there (train with python -m models.train_nmt)")

    from models.nmt import model_fingerprint

    _prepare_output(opts.output, opts.overwrite)
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
    log.info("generation: %d shard(s), preset %s, mode %s, config %s", len(shards), opts.preset, cfg.mode, chash)

    pipeline_options = PipelineOptions(_qualify_runner(beam_args))
    pipeline_options.view_as(SetupOptions).save_main_session = False
    runner = (pipeline_options.view_as(StandardOptions).runner or "DirectRunner").rsplit(".", 1)[-1]
    start = time.time()
    with beam.Pipeline(options=pipeline_options) as p:
        build(p, shards, os.path.abspath(opts.output), cfg, cleaning, chash, os.path.abspath(opts.forward_model),
              os.path.abspath(opts.backward_model) if opts.backward_model else None, opts.device,
              opts.precision, opts.max_line_chars, opts.src_column or opts.src_lang, opts.tgt_column or opts.tgt_lang,
              threads)
    elapsed = time.time() - start
    counts = summarize(opts.output)
    manifest = {
        "contract_version": CONTRACT_VERSION, "config_hash": chash, "preset": opts.preset,
        "config": cfg.to_dict(), "cleaning": cleaning_dict, "models": models, "runner": runner,
        "precision": opts.precision, "torch_threads_per_worker": threads,
        "inputs": [shard_fingerprint(s) for s in shards], "counts": counts,
        "seconds": round(elapsed, 2), "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_json(os.path.join(opts.output, MANIFEST), manifest)
    _print_summary(counts, elapsed, opts.output)
    if not counts["reconciled"]:
        raise SystemExit("error: counts do not reconcile (records read != pairs with output + rejects); "
                         f"see {opts.output}/_manifest.json")
    return manifest


def _print_summary(counts: dict, elapsed: float, output: str) -> None:
    lines = [f"read {counts['records_read']} records in {elapsed:.1f}s",
             f"  pairs with paraphrases: {counts['pairs_with_paraphrases']} "
             f"({counts['paraphrase_rows']} paraphrase rows)",
             f"  rejected: {counts['rejected']}"]
    lines += [f"    {reason}: {n}" for reason, n in counts["rejected_by_reason"].items()]
    lines.append(f"  reconciled (read = with paraphrases + rejected): {counts['reconciled']}")
    lines.append(f"  output: {output}")
    print("\n".join(lines), flush=True)


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("apache_beam", "fairseq", "distributed"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    run(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
