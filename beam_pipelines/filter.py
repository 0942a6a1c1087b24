"""Filter job: score every paraphrase pair of a generation run, decide with reasons, report.

    paragen-filter --input runs/example-output --output runs/example-filtered \
        --config examples/filter-report/config.yaml --encoder runs/example-encoder

(runs/example-output is what scripts/quickstart.sh writes; runs/example-encoder what
paragen-train-embeddings --input runs/example-output --output runs/example-encoder writes.)

Reads ``<input>/paraphrases`` (the generation job's Hive-partitioned Parquet), writes
``<output>/scored/<same partition>/part-*.parquet`` with every input row and column, one column
per score, ``keep`` and ``reasons``; then ``_filter_manifest.json`` and the statistics report
(``report/report.md``, ``report.json``, PNG plots). Models that must be fitted on the data
(KenLM, classifiers) are trained first, on the driver, on a hash-selected sample of the input
(rows flagged ``fit_sample``), and saved under ``<output>/_fitted``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import sys
import time

import apache_beam as beam

from beam_pipelines.options import check_beam_args, direct_workers, run_pipeline, torch_threads_for
from paracorpus.atomic import write_json
from paracorpus.cli import UsageError, check_output_location, cli_main, command_line, configure_logging, versions
from paracorpus.schema import manifest_reconciled, read_manifest
from transforms.filtering import ScoreFile, merge_stats

log = logging.getLogger("paragen.filter")


def list_partitions(input_dir: str) -> tuple[str, list[str]]:
    """(root, relative paths of the Parquet files under ROOT), sorted: the explicit shard list."""
    root = os.path.join(input_dir, "paraphrases") if os.path.isdir(os.path.join(input_dir, "paraphrases")) \
        else input_dir
    if not os.path.isdir(root):
        raise FileNotFoundError(f"{input_dir}: no such directory")
    files = []
    for d, _, names in os.walk(root):
        files += [os.path.relpath(os.path.join(d, n), root) for n in names
                  if n.endswith(".parquet") and not n.startswith(".")]
    if not files:
        raise FileNotFoundError(f"{root}: no Parquet files (expected the generation job's paraphrases/)")
    return root, sorted(files)


def fit_sample(root: str, files: list[str], rows: int):
    """About ROWS rows: every row of the pairs whose pair_id hashes into a share of the hash space
    sized from the input's row count (Parquet metadata), so all ranks of a pair go together and
    reruns pick the same pairs; at most ROWS rows, in file order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    total = sum(pq.ParquetFile(os.path.join(root, rel)).metadata.num_rows for rel in files)
    cut = int(min(1.0, rows / max(total, 1)) * 0xFFFFFFFF)
    parts, n = [], 0
    for rel in files:
        t = pq.read_table(os.path.join(root, rel), columns=["pair_id", "reference", "paraphrase"])
        ids = t.column("pair_id").to_pylist()
        mask = [int(hashlib.sha1((i or "").encode()).hexdigest()[:8], 16) <= cut for i in ids]
        sel = t.filter(pa.array(mask, type=pa.bool_()))
        parts.append(sel)
        n += sel.num_rows
        if n >= rows:
            break
    table = pa.concat_tables(parts).slice(0, rows) if parts else None
    return table


def input_manifest(input_dir: str) -> dict | None:
    """The generation run's _manifest.json (in INPUT_DIR, or beside it when INPUT_DIR is the run's
    paraphrases/), or None when there is none. The generation job writes it last."""
    for d in (input_dir, os.path.dirname(os.path.normpath(input_dir))):
        manifest = read_manifest(d)
        if manifest is not None:
            return manifest
    return None


def _spm_from_manifest(manifest: dict | None) -> str | None:
    model = (manifest or {}).get("models", {}).get("forward", {}).get("path")
    spm = os.path.join(model, "spm.model") if model else None
    return spm if spm and os.path.isfile(spm) else None


def build_parser() -> argparse.ArgumentParser:
    from filtering.config import presets

    parser = argparse.ArgumentParser(
        prog="paragen-filter", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
        epilog="Beam's options pass through: --runner DirectRunner|DaskRunner|FlinkRunner|DataflowRunner, "
               "--direct_running_mode multi_processing, --direct_num_workers N, --dask_client_address HOST:PORT, ... "
               "Any other option is an error.")
    parser.add_argument("--input", required=True, metavar="DIR",
                        help="a generation run's output directory (or its paraphrases/) (required)")
    parser.add_argument("--output", required=True, metavar="DIR",
                        help="directory for scored/, _fitted/, report/ and _filter_manifest.json (required)")
    parser.add_argument("--config", default="paranmt",
                        help=f"YAML/JSON config file or preset ({', '.join(presets())}) (default paranmt)")
    parser.add_argument("--encoder", metavar="DIR",
                        help="encoder directory (paragen-train-embeddings) for the paraphrase_score filter "
                             "(default: the config's, if any)")
    parser.add_argument("--spm_model", metavar="FILE",
                        help="sentencepiece model for bag_of_pieces (default: the generation run's forward "
                             "model, from its _manifest.json)")
    parser.add_argument("--lm_model", metavar="FILE",
                        help="KenLM model for lm_perplexity (default: one fitted on a sample of the input)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier filter run in --output (default: refuse)")
    parser.add_argument("--no_report", action="store_true", help="skip the statistics report (default: write it)")
    parser.add_argument("--torch_threads", type=int, default=0,
                        help="CPU threads of each worker's encoders and classifiers (default 0 = auto, "
                             "as in the generation job: cores / DirectRunner worker processes)")
    parser.add_argument("--allow_unreconciled", action="store_true",
                        help="filter a generation run whose manifest says its counts do not reconcile "
                             "(default: refuse)")
    return parser


def run(argv=None) -> dict:
    """Check everything, then run the job; returns the manifest. UsageError for a mistake."""
    from filtering.config import load_config

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    known, beam_args = parser.parse_known_args(argv)
    beam_args = check_beam_args(beam_args, parser)
    threads = torch_threads_for(known.torch_threads, beam_args)
    output = check_output_location(known.output)
    gen_manifest = input_manifest(known.input)
    if gen_manifest is None:
        print(f"warning: no _manifest.json with {known.input}: it may be an unfinished generation run; "
              "its rows are filtered as they are", file=sys.stderr, flush=True)
    elif not manifest_reconciled(gen_manifest) and not known.allow_unreconciled:
        raise UsageError(f"{known.input}: the generation run's counts do not reconcile (a failed or partial run, "
                         "see its _manifest.json); pass --allow_unreconciled to filter it anyway")
    overrides = {"paraphrase_score": {"model": known.encoder} if known.encoder else {},
                 "bag_of_pieces": {"spm_model": known.spm_model or _spm_from_manifest(gen_manifest)},
                 "lm_perplexity": {"model": known.lm_model} if known.lm_model else {}}
    overrides = {k: {kk: vv for kk, vv in v.items() if vv} for k, v in overrides.items()}
    try:
        root, files = list_partitions(known.input)
        cfg = load_config(known.config, overrides)
        for f in cfg.filters:                  # load every given model now: a bad path fails before the job
            if not f.needs_fit():
                f.setup()
    except (ValueError, ImportError, OSError) as e:
        raise UsageError(str(e).splitlines()[0]) from None
    existing = [n for n in ("scored", "_fitted", "report", "_filter_manifest.json")
                if os.path.exists(os.path.join(output, n))]
    if existing and not known.overwrite:
        raise UsageError(f"{output} already holds a filter run ({', '.join(existing)}); pass --overwrite")
    rows_expected = sum(_num_rows(os.path.join(root, rel)) for rel in files)
    for n in existing:
        p = os.path.join(output, n)
        shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    os.makedirs(output, exist_ok=True)
    t0 = time.time()
    print(f"filter: {len(files)} file(s), {rows_expected:,} rows under {root}; config {cfg.source}; "
          f"rules: {'; '.join(r.describe() for r in cfg.rules) or 'none'}", flush=True)
    raw = json.loads(json.dumps(cfg.raw))
    fit_ids: list[str] = []
    if any(f.needs_fit() for f in cfg.filters):
        sample = fit_sample(root, files, cfg.fit_sample)
        if sample is None or sample.num_rows < 10:
            raise UsageError("too few rows to fit the LM / classifiers (need 10 in the hash sample)")
        fit_ids = sorted(set(sample.column("pair_id").to_pylist()))
        workdir = os.path.join(output, "_fitted")
        os.makedirs(workdir, exist_ok=True)
        print(f"fitting on {sample.num_rows} sample rows ({len(fit_ids)} pairs)", flush=True)
        for f, entry in zip(cfg.filters, raw["filters"]):
            if f.needs_fit():
                updates = f.fit(sample, workdir, log=lambda m: print(m, flush=True))
                entry.update(updates)
    scored_root = os.path.join(output, "scored")
    workers = direct_workers(beam_args)

    def build(p):
        _ = (p | "Files" >> beam.Create(files)
             | "Reshuffle" >> beam.Reshuffle()
             | "Score" >> beam.ParDo(ScoreFile(root, scored_root, raw, overrides, fit_ids, threads,
                                               rows_expected // workers if workers else None))
             | "Key" >> beam.Map(lambda s: (None, s))
             | "Group" >> beam.GroupByKey()
             | "Merge" >> beam.Map(lambda kv: merge_stats(kv[1]))
             | "WriteStats" >> beam.Map(_write_json, os.path.join(output, "_filter_stats.json")))

    counters = run_pipeline(build, beam_args)
    elapsed = time.time() - t0
    with open(os.path.join(output, "_filter_stats.json")) as f:
        stats = json.load(f)
    rows_in = sum(_num_rows(os.path.join(root, rel)) for rel in files)
    rows_out = sum(_num_rows(os.path.join(scored_root, rel)) for rel in files)
    manifest = {"input": os.path.abspath(known.input), "input_config_hash": (gen_manifest or {}).get("config_hash"),
                "config": raw, "config_source": cfg.source,
                "rules": [r.describe() for r in cfg.rules], "files": len(files), "rows_in": rows_in,
                "rows_out": rows_out, "kept": stats.get("kept", 0),
                "rejected_by_reason": {k[7:]: v for k, v in sorted(stats.items()) if k.startswith("reason:")},
                # rows a score could not be computed for (null in the output): its rule let them pass
                "unscored_by_score": {k[9:]: v for k, v in sorted(stats.items()) if k.startswith("unscored:")},
                "reconciled": rows_in == rows_out == stats.get("rows", -1), "fit_sample_pairs": len(fit_ids),
                "seconds": round(elapsed, 2), "rows_per_s": round(rows_in / max(elapsed, 1e-9), 1),
                "counters": counters, "versions": versions(), "command": command_line(argv)}
    _write_json(manifest, os.path.join(output, "_filter_manifest.json"))
    print(f"scored {rows_in} rows in {elapsed:.1f}s ({manifest['rows_per_s']:.0f} rows/s): "
          f"kept {manifest['kept']}, rejected {rows_in - manifest['kept']}", flush=True)
    for reason, n in manifest["rejected_by_reason"].items():
        print(f"  {reason}: {n}")
    for score, n in manifest["unscored_by_score"].items():
        print(f"  no {score} score (rule not applied): {n}")
    print(f"  reconciled (rows in = rows out): {manifest['reconciled']}", flush=True)
    if not known.no_report:
        from filtering.report import write_report

        path = write_report(scored_root, os.path.join(output, "report"), cfg, manifest)
        print(f"report: {path}", flush=True)
    if not manifest["reconciled"]:
        raise SystemExit("error: rows in != rows out; see _filter_manifest.json")
    return manifest


def _num_rows(path: str) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def _write_json(obj, path: str):
    return write_json(path, obj)


def main(argv=None) -> int:
    configure_logging(quiet=("apache_beam",))
    return cli_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
