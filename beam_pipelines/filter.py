"""Filter job: score every paraphrase pair of a generation run, decide with reasons, report.

    paragen-filter --input runs/example-output --output runs/example-filtered \
        --config examples/filter-report/config.yaml --encoder runs/example-encoder

(runs/example-output is what scripts/quickstart.sh writes; runs/example-encoder what
paragen-train-embeddings --input runs/example-output --output runs/example-encoder writes.)

Reads the paraphrase files a generation run's manifest lists (a local directory or a bucket URL;
or any Parquet), writes ``<output>/scored/<same partition>/<file>-<attempt>.parquet`` with every
input row and column, one column per score, ``keep`` and ``reasons``, the statistics report
(``report/report.md``, ``report.json``, PNG plots) and, last, ``_filter_manifest.json``, which
lists the run's files (the same commit protocol as the generation job: paracorpus/commit.py).
Models that must be fitted on the data (KenLM, classifiers) are trained first, on the driver, on
a hash-selected sample of the input (rows flagged ``fit_sample``), and saved under
``<output>/_fitted/<run id>``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import tempfile
import time

import apache_beam as beam

from beam_pipelines.options import check_beam_args, direct_workers, run_pipeline, torch_threads_for
from common import storage
from common.cli import (EXIT_EMPTY, JobFailed, UsageError, check_apart, check_output_location, cli_main,
                        command_line, configure_logging, versions)
from paracorpus.commit import Claim, new_run_id, publish, read_manifest, work_dir
from paracorpus.runs import ParquetInput, open_input
from paracorpus.schema import CONTRACT_VERSION, FILTER_MANIFEST, FILTER_MANIFEST_KEYS, check_manifest, manifest_reconciled
from transforms.filtering import ScoreFile, merge_stats

log = logging.getLogger("paragen.filter")
TABLES = ("scored", "_fitted", "report")


def fit_sample(files: list[str], rows: int):
    """About ROWS rows: every row of the pairs whose pair_id hashes into a share of the hash space
    sized from the input's row count (Parquet metadata), so all ranks of a pair go together and
    reruns pick the same pairs; at most ROWS rows, in file order."""
    import pyarrow as pa

    total = sum(storage.parquet_file(f).metadata.num_rows for f in files)
    cut = int(min(1.0, rows / max(total, 1)) * 0xFFFFFFFF)
    parts, n = [], 0
    for path in files:
        t = storage.parquet_file(path).read(columns=["pair_id", "reference", "paraphrase"])
        ids = t.column("pair_id").to_pylist()
        mask = [int(hashlib.sha1((i or "").encode()).hexdigest()[:8], 16) <= cut for i in ids]
        sel = t.filter(pa.array(mask, type=pa.bool_()))
        parts.append(sel)
        n += sel.num_rows
        if n >= rows:
            break
    table = pa.concat_tables(parts).slice(0, rows) if parts else None
    return table


def _spm_from_manifest(manifest: dict | None) -> str | None:
    model = (manifest or {}).get("models", {}).get("forward", {}).get("path")
    spm = storage.join(model, "spm.model") if model else None
    return spm if spm and storage.isfile(spm) else None


def _upload_fitted(local_dir: str, remote_dir: str, entries: list[dict]) -> list[dict]:
    """Copy the fitted models in LOCAL_DIR to REMOTE_DIR (so workers anywhere can load them) and
    point the config ENTRIES there; returns their manifest entries (paths relative to the run)."""
    files = []
    for d, _, names in os.walk(local_dir):
        for name in names:
            rel = os.path.relpath(os.path.join(d, name), local_dir).replace(os.sep, "/")
            dst = storage.join(remote_dir, rel)
            storage.copy_file(os.path.join(d, name), dst)
            files.append({"path": rel, "bytes": os.path.getsize(os.path.join(d, name))})

    def moved(value):
        if isinstance(value, str) and value.startswith(local_dir):
            return storage.join(remote_dir, os.path.relpath(value, local_dir).replace(os.sep, "/"))
        if isinstance(value, dict):
            return {k: moved(v) for k, v in value.items()}
        return value
    for entry in entries:
        entry.update(moved(dict(entry)))
    return files


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


def filter_config(known, gen_manifest: dict | None):
    """(config, overrides) of the options KNOWN, every model that is given (not fitted) loaded
    now, so that a bad file fails before the job; UsageError otherwise."""
    from filtering.config import load_config

    overrides = {"paraphrase_score": {"model": known.encoder} if known.encoder else {},
                 "bag_of_pieces": {"spm_model": known.spm_model or _spm_from_manifest(gen_manifest)},
                 "lm_perplexity": {"model": known.lm_model} if known.lm_model else {}}
    overrides = {k: {kk: vv for kk, vv in v.items() if vv} for k, v in overrides.items()}
    try:
        cfg = load_config(known.config, overrides)
        for f in cfg.filters:
            if not f.needs_fit():
                f.setup()
    except (ValueError, ImportError, OSError, RecursionError) as e:
        raise UsageError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    return cfg, overrides


def check_args(argv: list[str], forward_model: str | None = None) -> None:
    """Refuse (UsageError) what paragen-filter would refuse in ARGV (its options without --input
    and --output) before reading any input: paragen-refresh checks its --filter_args this way
    before the generation run. FORWARD_MODEL: the generation job's, whose spm.model is the
    default of bag_of_pieces."""
    for forbidden in ("--input", "--output"):
        if any(x == forbidden or x.startswith(forbidden + "=") for x in argv):
            raise UsageError(f"--filter_args: {forbidden} is set by the refresh; leave it out")
    parser = build_parser()
    known, beam_args = parser.parse_known_args(["--input", "-", "--output", "-", *argv])
    check_beam_args(beam_args, parser)
    filter_config(known, {"models": {"forward": {"path": forward_model}}} if forward_model else None)


def run(argv=None) -> dict:
    """Check everything, then run the job; returns the manifest. UsageError for a mistake."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    known, beam_args = parser.parse_known_args(argv)
    beam_args = check_beam_args(beam_args, parser)
    threads = torch_threads_for(known.torch_threads, beam_args)
    output = check_output_location(known.output)
    check_apart(output, known.input)
    inp: ParquetInput = open_input(known.input)
    gen_manifest = inp.manifest if inp.kind == "generation" else None
    if inp.kind == "parquet":
        print(f"warning: {known.input} is not a generation run (no _manifest.json): its rows are filtered as "
              "they are", file=sys.stderr, flush=True)
    elif gen_manifest is not None and not manifest_reconciled(gen_manifest) and not known.allow_unreconciled:
        raise UsageError(f"{known.input}: the generation run's counts do not reconcile (a failed or partial run, "
                         "see its _manifest.json); pass --allow_unreconciled to filter it anyway")
    cfg, overrides = filter_config(known, gen_manifest)
    committed = read_manifest(output, FILTER_MANIFEST)
    if committed is not None and not known.overwrite:
        raise UsageError(f"{output} already holds a filter run ({committed.get('run_id')}); pass --overwrite "
                         "to replace it (it stays readable until the new run commits)")
    files = list(inp.files)
    rows_expected = sum(storage.parquet_file(f).metadata.num_rows for f in files)
    run_id = new_run_id()
    t0 = time.time()
    with Claim(output, run_id):
        print(f"filter run {run_id}: {len(files)} file(s), {rows_expected:,} rows under {inp.root}; config "
              f"{cfg.source}; rules: {'; '.join(r.describe() for r in cfg.rules) or 'none'}", flush=True)
        raw = json.loads(json.dumps(cfg.raw))
        fit_ids: list[str] = []
        fitted_files: list[dict] = []
        if any(f.needs_fit() for f in cfg.filters):
            sample = fit_sample(files, cfg.fit_sample)
            if sample is None or sample.num_rows < 10:
                raise UsageError("too few rows to fit the LM / classifiers (need 10 in the hash sample)")
            fit_ids = sorted(set(sample.column("pair_id").to_pylist()))
            print(f"fitting on {sample.num_rows} sample rows ({len(fit_ids)} pairs)", flush=True)
            with tempfile.TemporaryDirectory(prefix="paragen-fit-") as workdir:
                fitted = [entry for f, entry in zip(cfg.filters, raw["filters"]) if f.needs_fit()]
                for f, entry in zip(cfg.filters, raw["filters"]):
                    if f.needs_fit():
                        entry.update(f.fit(sample, workdir, log=lambda m: print(m, flush=True)))
                remote = storage.join(output, "_fitted", run_id)
                fitted_files = [{**e, "path": f"_fitted/{run_id}/{e['path']}"}
                                for e in _upload_fitted(workdir, remote, fitted)]
        work = work_dir(output, run_id)
        workers = direct_workers(beam_args)
        todo = list(zip(files, inp.relatives))        # (file to read, its path inside the table)

        def build(p):
            _ = (p | "Files" >> beam.Create(todo)
                 | "Reshuffle" >> beam.Reshuffle()
                 | "Score" >> beam.ParDo(ScoreFile(output, raw, overrides, fit_ids, threads,
                                                   rows_expected // workers if workers else None))
                 | "Key" >> beam.Map(lambda s: (None, s))
                 | "Group" >> beam.GroupByKey()
                 | "Merge" >> beam.Map(lambda kv: merge_stats(kv[1]))
                 | "WriteStats" >> beam.Map(lambda stats: storage.write_json(storage.join(work, "stats.json"), stats)))

        counters = run_pipeline(build, beam_args)
        elapsed = time.time() - t0
        stats = storage.read_json(storage.join(work, "stats.json"))
        scored = sorted(stats.pop("files"), key=lambda e: e["path"])
        rows_out = sum(e["rows"] for e in scored)
        manifest = {"contract_version": CONTRACT_VERSION, "run_id": run_id, "input": storage.absolute(known.input),
                    "input_run_id": (inp.manifest or {}).get("run_id"),
                    "input_config_hash": (gen_manifest or {}).get("config_hash"),
                    "config": raw, "config_source": cfg.source,
                    "rules": [r.describe() for r in cfg.rules], "input_files": len(files), "rows_in": rows_expected,
                    "rows_out": rows_out, "kept": stats.get("kept", 0),
                    "rejected_by_reason": {k[7:]: v for k, v in sorted(stats.items()) if k.startswith("reason:")},
                    # rows a score could not be computed for (null in the output): its rule let them pass
                    "unscored_by_score": {k[9:]: v for k, v in sorted(stats.items()) if k.startswith("unscored:")},
                    "reconciled": rows_expected == rows_out == stats.get("rows", -1),
                    "fit_sample_pairs": len(fit_ids), "seconds": round(elapsed, 2),
                    "rows_per_s": round(rows_expected / max(elapsed, 1e-9), 1),
                    "files": {"scored": scored, "fitted": fitted_files, "report": []},
                    "counters": counters, "versions": versions(), "command": command_line(argv)}
        print(f"scored {rows_expected} rows in {elapsed:.1f}s ({manifest['rows_per_s']:.0f} rows/s): "
              f"kept {manifest['kept']}, rejected {rows_expected - manifest['kept']}", flush=True)
        for reason, n in manifest["rejected_by_reason"].items():
            print(f"  {reason}: {n}")
        for score, n in manifest["unscored_by_score"].items():
            print(f"  no {score} score (rule not applied): {n}")
        print(f"  reconciled (rows in = rows out): {manifest['reconciled']}", flush=True)
        if not manifest["reconciled"]:
            storage.write_json(storage.join(work, "manifest.json"), manifest)
            raise JobFailed(f"rows in != rows out; not published; see {work}/manifest.json")
        if not known.no_report and scored:
            manifest["files"]["report"] = _write_report([storage.join(output, e["path"]) for e in scored],
                                                        storage.join(output, "report"), cfg, manifest)
            print(f"report: {storage.join(output, 'report', 'report.md')}", flush=True)
        publish(output, FILTER_MANIFEST, check_manifest(manifest, FILTER_MANIFEST_KEYS), TABLES)
    if manifest["kept"] == 0:
        # published (its report says why), but a scheduler must notice an empty corpus
        top = sorted(manifest["rejected_by_reason"].items(), key=lambda kv: (-kv[1], kv[0]))[:3]
        raise JobFailed(f"the filter kept no row of {rows_expected:,}" +
                        (f" (top reasons: {', '.join(f'{r} {n:,}' for r, n in top)})" if top else "") +
                        f"; published with its report in {output}", EXIT_EMPTY)
    return manifest


def _write_report(files: list[str], out_dir: str, cfg, manifest: dict) -> list[dict]:
    """The statistics report, made in a local directory and copied to OUT_DIR (local or a
    bucket); its manifest entries."""
    from filtering.report import write_report

    with tempfile.TemporaryDirectory(prefix="paragen-report-") as tmp:
        write_report(files, tmp, cfg, manifest)
        entries = []
        for name in sorted(os.listdir(tmp)):
            storage.copy_file(os.path.join(tmp, name), storage.join(out_dir, name))
            entries.append({"path": f"report/{name}", "bytes": os.path.getsize(os.path.join(tmp, name))})
    return entries


def main(argv=None) -> int:
    configure_logging(quiet=("apache_beam",))
    return cli_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
