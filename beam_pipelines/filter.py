"""Filter job: score every paraphrase pair of a generation run, decide with reasons, report.

    paragen-filter --input runs/example-output --output runs/example-filtered \
        --config examples/filter-report/config.yaml --encoder runs/example-encoder

(runs/example-output is what scripts/quickstart.sh writes; runs/example-encoder what
paragen-train-embeddings --input runs/example-output --output runs/example-encoder writes.)

Reads the paraphrase files a generation run's manifest lists (a local directory or a bucket URL;
or any Parquet), writes ``<output>/scored/<same partition>/<file>-<attempt>.parquet`` with every
input row and column, one column per score, ``keep`` and ``reasons``, the statistics report
(``report/<run id>/report.md``, ``report.json``, PNG plots: a run's own names, so a stopped run
never mixes its report with the published one's) and, last, ``_filter_manifest.json``, which
lists the run's files (the same commit protocol as the generation job: paracorpus/commit.py).
The same command run again finds its run committed (the same input run, config and options) and
only finishes a clean-up a stop cut short.
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
from dataclasses import dataclass

import apache_beam as beam

from beam_pipelines.commit import Claim, commit, finish_cleanup, refuse_to_replace
from beam_pipelines.options import (check_beam_args, cluster_options_epilog, direct_workers, join_dashed_values,
                                    run_pipeline, runner_name, torch_threads_for)
from beam_pipelines.slurm import check_slurm
from beam_pipelines.report import print_filter_summary, top_reasons
from common.stopping import Stopping
from common import storage
from common.cli import (EXIT_EMPTY, JobFailed, UsageError, check_apart, check_output_location, cli_main,
                        command_line, configure_logging, versions)
from paracorpus.commit import Fence, new_run_id, read_manifest, read_manifest_versioned, work_dir
from paracorpus.runs import ParquetInput, open_input
from paracorpus.schema import CONTRACT_VERSION, FILTER_MANIFEST, FILTER_MANIFEST_KEYS, check_manifest, manifest_reconciled
from transforms.filtering import ScoreFile, merge_stats, rejected_counter

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
               "Any other option is an error." + " " + cluster_options_epilog())
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
    known, beam_args = parser.parse_known_args(["--input", "-", "--output", "-", *join_dashed_values(argv)])
    check_beam_args(beam_args, parser)
    filter_config(known, {"models": {"forward": {"path": forward_model}}} if forward_model else None)


@dataclass(frozen=True)
class FilterJob:
    """What the check phase established: the input run and its files, the config, where to write."""
    input: ParquetInput
    input_path: str                  # --input as given, absolute (the manifest records it)
    output: str
    cfg: object                      # filtering.config.FilterConfig, its given models loaded
    overrides: dict                  # what the options changed in the config (workers apply them too)
    rows_expected: int
    threads: int | None
    beam_args: tuple
    report: bool
    command: tuple
    plan_key: str = ""               # what a rerun of the same command compares (filter_plan_key)
    overwrite: bool = False

    @property
    def generation_manifest(self) -> dict | None:
        return self.input.manifest if self.input.kind == "generation" else None


@dataclass(frozen=True)
class Fitted:
    """The plan phase's result: the config with the fitted models' parameters filled in."""
    raw: dict                        # the config as the workers build it
    fit_ids: list                    # pair ids of the fitting sample (flagged fit_sample in the output)
    files: list                      # the fitted models' manifest entries


def check(argv: list[str]) -> FilterJob:
    """The checked FilterJob of ARGV: options, input run, config and its given models, the output
    (apart from the input; an earlier filter run there only replaced with --overwrite)."""
    parser = build_parser()
    known, beam_args = parser.parse_known_args(join_dashed_values(argv))
    beam_args = check_beam_args(beam_args, parser)
    # the filter scores on the CPU: its SLURM workers hold no GPU unless asked for
    beam_args = check_slurm(beam_args, runner_name(beam_args), default_gpus=0, output=known.output)
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
    key = filter_plan_key(inp, cfg, overrides, not known.no_report)
    # refused before anything is written; decided again under the claim (_run)
    refuse_other_filter_run(read_manifest(output, FILTER_MANIFEST), key, output, known.overwrite)
    rows_expected = sum(storage.parquet_file(f).metadata.num_rows for f in inp.files)
    return FilterJob(inp, storage.absolute(known.input), output, cfg, overrides, rows_expected, threads,
                     tuple(beam_args), not known.no_report, tuple(command_line(argv)), key, known.overwrite)


def filter_plan_key(inp: ParquetInput, cfg, overrides: dict, report: bool) -> str:
    """What must be the same for a rerun to find its filter run done: the input (a run by its run
    id and files; plain Parquet by each file's name, size and time), the config and the options
    that change the output."""
    if inp.manifest is not None:
        source = [inp.manifest.get("run_id"), list(inp.relatives)]
    else:
        source = [[f, *storage.stat(f)] for f in inp.files]
    blob = json.dumps([source, cfg.raw, overrides, report], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def plan_key_of(argv: list[str]) -> str:
    """The plan key a filter run of ARGV (the filter job's options, --input included) would have:
    what paragen-refresh compares with the filter run latest names to tell whether its
    --filter_args changed. Nothing written; --output plays no part."""
    known, _ = build_parser().parse_known_args(["--output", "-", *join_dashed_values(argv)])
    inp = open_input(known.input)
    cfg, overrides = filter_config(known, inp.manifest if inp.kind == "generation" else None)
    return filter_plan_key(inp, cfg, overrides, not known.no_report)


def refuse_other_filter_run(committed: dict | None, key: str, output: str, overwrite: bool) -> None:
    """UsageError when OUTPUT holds a filter run of another plan and --overwrite is not given (a
    committed run of this plan is the same command's: done, not refused)."""
    if committed is not None and committed.get("plan_key") != key:
        refuse_to_replace(output, FILTER_MANIFEST, "a filter run of another input or config", overwrite, committed)


def fit(job: FilterJob, run_id: str) -> Fitted:
    """The models that must be fitted on the data (KenLM, classifiers), fitted on the driver on a
    hash-selected sample of the input and saved under OUTPUT/_fitted/RUN_ID."""
    cfg = job.cfg
    raw = json.loads(json.dumps(cfg.raw))
    if not any(f.needs_fit() for f in cfg.filters):
        return Fitted(raw, [], [])
    sample = fit_sample(list(job.input.files), cfg.fit_sample)
    if sample is None or sample.num_rows < 10:
        raise UsageError("too few rows to fit the LM / classifiers (need 10 in the hash sample)")
    fit_ids = sorted(set(sample.column("pair_id").to_pylist()))
    print(f"fitting on {sample.num_rows} sample rows ({len(fit_ids)} pairs)", flush=True)
    with tempfile.TemporaryDirectory(prefix="paragen-fit-") as workdir:
        fitted = [entry for f, entry in zip(cfg.filters, raw["filters"]) if f.needs_fit()]
        for f, entry in zip(cfg.filters, raw["filters"]):
            if f.needs_fit():
                entry.update(f.fit(sample, workdir, log=lambda m: print(m, flush=True)))
        remote = storage.join(job.output, "_fitted", run_id)
        files = [{**e, "path": f"_fitted/{run_id}/{e['path']}"} for e in _upload_fitted(workdir, remote, fitted)]
    return Fitted(raw, fit_ids, files)


class ScoreFiles(beam.PTransform):
    """(input file, its path inside the table) -> the merged stats of every file scored, written
    to WORK/stats.json: each file scored and decided by one worker (transforms/filtering.py)."""

    def __init__(self, job: FilterJob, fitted: Fitted, work: str, fence=None):
        super().__init__()
        self.job, self.fitted, self.work, self.fence = job, fitted, work, fence

    def expand(self, files):
        job, work, workers, fence = self.job, self.work, direct_workers(list(self.job.beam_args)), self.fence
        return (files
                | "Reshuffle" >> beam.Reshuffle()
                | "Score" >> beam.ParDo(ScoreFile(job.output, self.fitted.raw, job.overrides, self.fitted.fit_ids,
                                                  job.threads, job.rows_expected // workers if workers else None,
                                                  fence))
                | "Key" >> beam.Map(lambda s: (None, s))
                | "Group" >> beam.GroupByKey()
                | "Merge" >> beam.Map(lambda kv: merge_stats(kv[1]))
                | "WriteStats" >> beam.Map(write_stats, work, fence))


def write_stats(stats: dict, work: str, fence=None) -> str:
    if fence is not None:
        fence()
    return storage.write_json(storage.join(work, "stats.json"), stats)


def score(job: FilterJob, fitted: Fitted, work: str, fence=None) -> dict:
    """Run the scoring pipeline: the merged stats its workers wrote. FENCE: what its workers check
    before each write (paracorpus.commit.Fence)."""
    todo = list(zip(job.input.files, job.input.relatives))        # (file to read, its path inside the table)
    run_pipeline(lambda p: p | "Files" >> beam.Create(todo)
                 | "ScoreFiles" >> ScoreFiles(job, fitted, work, fence), list(job.beam_args),
                 name=f"paragen-filter-{storage.basename(work.rstrip('/'))}")
    return storage.read_json(storage.join(work, "stats.json"))


def collect(job: FilterJob, fitted: Fitted, run_id: str, stats: dict, elapsed: float) -> dict:
    """The filter run's manifest from the pipeline's merged STATS (what its workers wrote: its
    counters are these, the same on every runner; Beam's Dask runner reports no metrics)."""
    gen_manifest, rows_expected = job.generation_manifest, job.rows_expected
    scored = sorted(stats.pop("files"), key=lambda e: e["path"])
    rows_out = sum(e["rows"] for e in scored)
    counters = {"rows": stats.get("rows", 0), "kept": stats.get("kept", 0), "files": len(scored),
                **{rejected_counter(k): v for k, v in sorted(stats.items()) if k.startswith("reason:")}}
    return {"contract_version": CONTRACT_VERSION, "run_id": run_id, "input": job.input_path,
            "input_run_id": (job.input.manifest or {}).get("run_id"),
            "input_config_hash": (gen_manifest or {}).get("config_hash"),
            "config": fitted.raw, "config_source": job.cfg.source,
            "rules": [r.describe() for r in job.cfg.rules], "input_files": len(job.input.files),
            "rows_in": rows_expected, "rows_out": rows_out, "kept": stats.get("kept", 0),
            "rejected_by_reason": {k[7:]: v for k, v in sorted(stats.items()) if k.startswith("reason:")},
            # rows a score could not be computed for (null in the output): its rule let them pass
            "unscored_by_score": {k[9:]: v for k, v in sorted(stats.items()) if k.startswith("unscored:")},
            "reconciled": rows_expected == rows_out == stats.get("rows", -1),
            "fit_sample_pairs": len(fitted.fit_ids), "seconds": round(elapsed, 2),
            "rows_per_s": round(rows_expected / max(elapsed, 1e-9), 1),
            "files": {"scored": scored, "fitted": fitted.files, "report": []},
            "counters": counters, "versions": versions(), "command": list(job.command), "plan_key": job.plan_key}


def run(argv=None) -> dict:
    """Check everything, then run the job; returns the manifest. UsageError for a mistake."""
    argv = sys.argv[1:] if argv is None else list(argv)
    with Stopping("the filter job") as stopping:        # SIGTERM/SIGINT: stop in one line, workers too
        return _run(argv, stopping)


def _run(argv: list[str], stopping: Stopping) -> dict:
    with storage.first_contact():                      # a store never reached is a mistake, said at once
        job = check(argv)                               # 1. check: refused before anything is written
    output = job.output
    with Claim(output, new_run_id(), on_lost=lambda why: stopping.end(why, 75)) as claim:
        stopping.watch("the filter job", None, claim.release)
        # decided under the claim: no other run publishes between here and this run's publish
        finish_cleanup(output, FILTER_MANIFEST, TABLES, claim)    # a run stopped during its clean-up
        committed, version = read_manifest_versioned(output, FILTER_MANIFEST)
        if committed is not None and committed.get("plan_key") == job.plan_key and not job.overwrite:
            print(f"nothing to do: filter run {committed['run_id']} in {output} is committed with this plan (same "
                  "input run, config and options); --overwrite makes it again", flush=True)
            manifest = committed
        else:
            refuse_other_filter_run(committed, job.plan_key, output, job.overwrite)
            manifest = _filter_run(job, claim, version, stopping)
    if manifest["kept"] == 0:
        # published (its report says why), but a scheduler must notice an empty corpus
        top = top_reasons(manifest["rejected_by_reason"])
        raise JobFailed(f"the filter kept no row of {job.rows_expected:,}" + (f" (top reasons: {top})" if top else "")
                        + f"; published with its report in {output}", EXIT_EMPTY)
    return manifest


def _filter_run(job: FilterJob, claim: Claim, version, stopping: Stopping) -> dict:
    """A new filter run into JOB.output under CLAIM, published only over manifest VERSION."""
    run_id, started, output = claim.run_id, time.time(), job.output
    stopping.watch(f"filter run {run_id}", lambda: "nothing published (a filter run starts again from the start)",
                   claim.release)
    cfg = job.cfg
    print(f"filter run {run_id}: {len(job.input.files)} file(s), {job.rows_expected:,} rows under "
          f"{job.input.root}; config {cfg.source}; rules: {'; '.join(r.describe() for r in cfg.rules) or 'none'}",
          flush=True)
    fitted = fit(job, run_id)                           # 2. plan: the models fitted on a sample
    work = work_dir(output, run_id)
    stats = score(job, fitted, work, Fence(output, claim.token, throttle=False))   # 3. score: the pipeline
    manifest = collect(job, fitted, run_id, stats, time.time() - started)
    print_filter_summary(manifest, job.rows_expected, manifest["seconds"])   # 4. report
    problem = None if manifest["reconciled"] else JobFailed(f"rows in != rows out; not published; see "
                                                            f"{work}/manifest.json")
    if problem is None and job.report and manifest["files"]["scored"]:
        # under the run's own name: published with its manifest, the old one's removed after
        report_dir = storage.join(output, "report", run_id)
        manifest["files"]["report"] = _write_report([storage.join(output, e["path"])
                                                     for e in manifest["files"]["scored"]],
                                                    report_dir, f"report/{run_id}", cfg, manifest)
        print(f"report: {storage.join(report_dir, 'report.md')}", flush=True)
    commit(output, FILTER_MANIFEST, check_manifest(manifest, FILTER_MANIFEST_KEYS), TABLES, work, problem,
           stopping.critical, claim, version)           # 5. commit
    return manifest


def _write_report(files: list[str], out_dir: str, listed_as: str, cfg, manifest: dict) -> list[dict]:
    """The statistics report, made in a local directory and copied to OUT_DIR (local or a
    bucket); its manifest entries (paths LISTED_AS/<name>)."""
    from filtering.report import write_report

    with tempfile.TemporaryDirectory(prefix="paragen-report-") as tmp:
        write_report(files, tmp, cfg, manifest)
        entries = []
        for name in sorted(os.listdir(tmp)):
            storage.copy_file(os.path.join(tmp, name), storage.join(out_dir, name))
            entries.append({"path": f"{listed_as}/{name}", "bytes": os.path.getsize(os.path.join(tmp, name))})
    return entries


def main(argv=None) -> int:
    configure_logging(quiet=("apache_beam",))
    return cli_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
