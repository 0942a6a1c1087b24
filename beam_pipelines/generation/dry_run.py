"""``--dry_run``: the plan phase's result printed with an estimate of its cost; nothing is written.

The estimate's rate is measured on this machine: the first clean pairs of the first input shard
decoded by the job's own decoding steps, after one pair of warm-up (or ``--rate`` given).
"""
from __future__ import annotations

import logging
import time

from beam_pipelines.generation.check import Job, Request
from beam_pipelines.generation.plan import Inputs
from common.cli import option_value
from common.progress import format_seconds
from common.shards import shard_size
from paracorpus.bins import bin_capacity
from paracorpus.units import plan_units

log = logging.getLogger("paragen.generate")

DRY_RUN_SAMPLE = 16          # pairs decoded on the driver to measure a rate for --dry_run


def measure_rate(shard, job: Job) -> tuple[float, int]:
    """(pairs per second, pairs timed) of one worker on this machine: the first DRY_RUN_SAMPLE clean
    pairs of SHARD through JOB's decoding steps, after one pair of warm-up."""
    from common.shards import read_shard
    from models.nmt.engines.loading import load_engine
    from paracorpus.cleaning import Rejection, clean_pair, pair_id
    from paracorpus.paraphrasing import piece_limits
    from paracorpus.steps import decoding_steps
    from paracorpus.units import PAIR, generate_unit

    cfg, models = job.cfg, job.models
    step = {"step_mode": job.decode_step} if job.decode_step != "auto" else {}
    forward = load_engine(models["forward"]["path"], device=job.device, precision=job.precision, threads=job.threads,
                          **step)
    backward = load_engine(models["backward"]["path"], device=job.device, precision=job.precision,
                           threads=job.threads) if "backward" in models else None
    steps = decoding_steps(forward, backward, cfg, "dry-run", piece_limits(forward, backward, cfg.max_pieces))
    pairs = []
    for rec in read_shard(shard, job.max_line_chars, job.src_column, job.tgt_column):
        if rec.error is None:
            cleaned = clean_pair(rec.source, rec.reference, job.cleaning)
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


def estimate_files(job: Job, inputs: Inputs, layout: dict) -> tuple[int, int, int]:
    """(groups, files per table, paraphrase rows bound) the run would write: per bin, the units
    that write into it (a carried shard's rows are in every partition) and a bound on its
    paraphrase rows, so files = at least one per partition written, one per file target."""
    cfg, reuse = job.cfg, inputs.reuse
    per_record = cfg.keep if cfg.mode == "sample" or cfg.nbest > 1 else 1
    bin_units: dict = {}
    bin_rows: dict = {}
    for name, bin_ in inputs.bins.items():
        carried = reuse.reused.get(name)
        bin_units[bin_] = bin_units.get(bin_, 0) + (layout[name][1] if name in layout else cfg.num_output_shards)
        bin_rows[bin_] = bin_rows.get(bin_, 0) + (carried["counts"]["paraphrase_rows"] if carried
                                                  else inputs.per_shard[name] * per_record)
    groups = sum(min(n, cfg.num_output_shards) for n in bin_units.values())
    files = sum(max(min(bin_units[b], cfg.num_output_shards), -(-bin_rows[b] // job.file_target.rows))
                for b in bin_units if bin_rows[b])
    return groups, files, sum(bin_rows.values())


def _slurm_fleet(job: Job):
    """The SLURM worker jobs' settings of JOB (None without --slurm_workers)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_pipelines.slurm_settings import settings_from

    return settings_from(PipelineOptions(list(job.beam_args)))


def _dask_workers(job: Job) -> int | None:
    """The worker processes of the Dask cluster a DaskRunner run would use, asked of its scheduler
    (nothing submitted); None for another runner, a cluster of the runner's own making, or a
    scheduler that does not answer (said)."""
    address = option_value(list(job.beam_args), "--dask_client_address")
    if not job.runner.endswith("DaskRunner") or not address:
        return None
    from distributed import Client

    try:
        with Client(address, timeout=15) as client:
            return len(client.scheduler_info()["workers"]) or None
    except (OSError, TimeoutError) as exc:
        log.warning("the Dask scheduler at %s did not say how many workers it has (%s): the estimate is for one",
                    address, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return None


def dry_run(job: Job, request: Request, inputs: Inputs) -> dict:
    """Print what the run would do and cost, write nothing; its plan as a dict."""
    cfg, reuse, bins, decode, file_target = job.cfg, inputs.reuse, inputs.bins, inputs.decode, job.file_target
    layout = plan_units(inputs.per_shard, job.unit_pairs) if inputs.per_shard else {}
    units = sum(n for _first, n in layout.values())
    records = inputs.expected
    size = sum(shard_size(s) for s in decode)
    groups, files, rows = estimate_files(job, inputs, layout)
    kept = len(reuse.kept_files["paraphrases"])
    copied = sum(reuse.reused[n]["records_read"] for n in reuse.carried)
    if request.rate is not None:
        rate, timed = request.rate, 0
    elif decode:
        rate, timed = measure_rate(decode[0], job)
    else:
        rate, timed = 0.0, 0
    fleet = _slurm_fleet(job)
    dask = None if fleet else _dask_workers(job)
    processes = fleet.workers * fleet.processes if fleet else dask or job.workers or 1
    seconds = records / (rate * processes) if rate else None
    lines = [f"dry run: nothing written to {request.output}",
             f"  input shards to decode: {len(decode)} ({'' if inputs.exact else '~'}{records:,} records, "
             f"{size:,} bytes)"
             + (f"; {len(reuse.reused)} reused from run {reuse.previous_run_id} ({len(reuse.carried)} of them copied "
                f"into new files, {copied:,} records), {len(reuse.removed)} removed" if reuse.previous else ""),
             f"  work units: {units:,} of about {job.unit_pairs} records; {len(set(bins.values())):,} bin(s) of input "
             f"shards (at least {bin_capacity(file_target.rows, cfg.num_output_shards):,} records each but the last) x "
             f"{cfg.num_output_shards} output partitions: {groups:,} groups",
             f"  files the run would write: about {files:,} per table (paraphrases, rejects, dedup), each at most "
             f"{file_target.rows:,} rows or {file_target.megabytes:g} MB"
             + (f", and keep {kept:,} of run {reuse.previous_run_id}" if reuse.previous else "")
             + f"; up to {3 * units:,} unit files before compaction",
             f"  decoding rate: {rate:.2f} pairs/s per worker" + (f" (measured on {timed} pairs of "
                                                                   f"{decode[0].name} on this machine)" if timed else
                                                                   " (--rate)" if request.rate is not None else ""),
             "  estimated decoding time: " + (f"{format_seconds(seconds)} with {processes} worker process(es)"
                                              if seconds is not None else "unknown")
             + (f" ({fleet.workers} SLURM worker job(s) x {fleet.processes} process(es); the rate is one process's "
                "here: measure it on a worker node, or give --rate)" if fleet else "")
             + (" (the Dask cluster's workers now; the rate is one process's here: measure it on a worker, or "
                "give --rate)" if dask else "")]
    if fleet:
        from beam_pipelines.slurm_settings import worker_script

        gpu_hours = seconds * fleet.workers * fleet.gpus_per_worker / 3600 if seconds is not None else None
        if gpu_hours is not None and fleet.gpus_per_worker:
            lines.append(f"  GPU-hours: about {gpu_hours:,.1f} ({fleet.workers} x {fleet.gpus_per_worker} GPU(s))")
        lines += ["  the worker jobs' batch script (sbatch; scheduler address and log folder set at the start):", "",
                  *("    " + line for line in worker_script(fleet, logs=False).splitlines())]
    print("\n".join(lines), flush=True)
    return {"dry_run": True, "shards": len(decode), "records": records, "exact": inputs.exact, "bytes": size,
            "units": units, "processes": processes, "bins": len(set(bins.values())), "groups": groups,
            "files_per_table": files,
            "rows_per_file": rows // files if files else 0, "unit_files": 3 * units,
            "kept_files_per_table": kept, "copied_records": copied, "rate": rate, "estimated_seconds": seconds,
            "worker_processes": processes,
            "reused_shards": sorted(reuse.reused), "copied_shards": sorted(reuse.carried),
            "removed_shards": reuse.removed}
