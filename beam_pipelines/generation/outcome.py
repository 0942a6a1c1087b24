"""After the pipeline: the run's manifest from its summary, and whether it may be published.

``collect`` sums the read and group records the pipeline gathered (compact.py) into the run's
counts and files, adds what the run reuses from ``--previous``, and builds the manifest (checked
against the contract, paracorpus/schema.py). The ``Outcome`` says whether the run can be
published (its counts reconcile; it has rows, or --allow_empty) for the commit phase
(beam_pipelines/commit.py), and carries what the report prints (beam_pipelines/report.py).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from beam_pipelines.generation.check import Job, Request
from beam_pipelines.generation.compact import read_summary
from beam_pipelines.generation.plan import PLAN_KEY_VERSION, Inputs, Plan
from beam_pipelines.options import is_local
from beam_pipelines.report import nothing_to_publish
from common.cli import EXIT_EMPTY, JobFailed, versions
from paracorpus.commit import entry_path, file_location
from paracorpus.compaction import TABLES as DATA_TABLES
from paracorpus.incremental import Reuse
from paracorpus.schema import CONTRACT_VERSION, check_manifest
from paracorpus.unit_failures import describe, read_failures
from paracorpus.units import record_counters, run_setups, summarize_run, totals

log = logging.getLogger("paragen.generate")
MANIFEST_FAILURES = 20            # failed attempts the manifest describes (all are counted)


@dataclass(frozen=True)
class Outcome:
    """A finished pipeline's run: its manifest and what decides whether it is published."""
    manifest: dict
    output: str
    counters: dict                   # the run's counters (summed from its records)
    elapsed: float                   # seconds the pipeline took
    work: str                        # the run's _work directory
    allow_empty: bool

    @property
    def counts(self) -> dict:
        return self.manifest["counts"]

    @property
    def problem(self) -> JobFailed | None:
        """Why the run must not be published, or None."""
        if not self.counts["reconciled"]:
            return JobFailed(f"counts do not reconcile (records read != pairs with output + rejects); "
                             f"not published, the previous run (if any) stays; see {self.work}/manifest.json")
        if self.counts["paraphrase_rows"] == 0 and not self.allow_empty:
            return JobFailed(f"{nothing_to_publish(self.counts)}; not published, the previous run (if any) stays; its "
                             f"rejects are listed in {self.work}/manifest.json (--allow_empty publishes such a run)",
                             EXIT_EMPTY)
        return None


def collect(job: Job, request: Request, inputs: Inputs, plan: Plan, elapsed: float,
            gpu_sharing: dict | None = None, slurm: dict | None = None) -> Outcome:
    """The Outcome of PLAN's pipeline, from the summary and records its workers wrote (GPU_SHARING:
    decode()'s, where the workers could decode on a GPU; SLURM: the worker jobs of --slurm_workers,
    their failed starts, excluded nodes and GPU-hours: beam_pipelines/slurm.py last_usage())."""
    reuse, output = inputs.reuse, plan.output
    summary = read_summary(plan.work)
    decoded_counts, new_files, units, decoded = summarize_run(summary["groups"], summary["reads"])
    shards = input_entries(plan.run_id, summary["reads"], decoded, reuse, plan.bins)
    files = {t: sorted([_reused_entry(output, reuse.previous, f) for f in reuse.kept_files[t]] + new_files[t],
                       key=lambda e: (e["bin"], e["shard"], e["path"])) for t in DATA_TABLES}
    units.update(planned=plan.num_units, published_files=sum(len(v) for v in files.values()))
    precision = job.precision
    # what ran, from the records the workers wrote: the same on every runner (Beam's counters
    # are not reported by the Dask runner) and across attempts
    counters = record_counters(summary["groups"], decoded_counts)
    failed = read_failures(plan.work)        # attempts at units that failed, across this run's attempts
    if failed:
        counters["unit_attempts_failed"] = len(failed)
    units["failed_attempts"] = len(failed)
    units["failures"] = [describe(record) for _name, record in failed[:MANIFEST_FAILURES]]
    setups = run_setups(summary["groups"])
    for name, entry in shards.items():
        if name in setups["per_shard"]:
            entry["precision"] = setups["per_shard"][name]
    mixed = precisions_of(shards)
    if len(mixed) > 1:
        log.warning("this run's rows were decoded in %s precision (units by input shard: the manifest's "
                    "inputs[].precision): their scores and samples differ slightly; set --precision "
                    "explicitly to have one", " and ".join(sorted(mixed)))
    manifest = check_manifest({
        "contract_version": CONTRACT_VERSION, "run_id": plan.run_id, "config_hash": plan.config_hash,
        "preset": job.preset, "config": job.cfg.to_dict(), "cleaning": job.cleaning_dict, "models": job.models,
        "runner": job.runner.rsplit(".", 1)[-1],
        "precision": {"requested": job.requested_precision, "resolved": precision if precision != "auto" else None,
                      "workers": setups["workers"], "units": setups["units"], "mixed": len(mixed) > 1},
        "device": job.device, "torch_threads_per_worker": job.threads,
        "decode_step": {"requested": job.decode_step, "workers": setups["decode_steps"],
                        "compile_ms": counters.get("ms_compile", 0),
                        "compile_in_units_ms": counters.get("ms_compile_in_units", 0)},
        "gpu_sharing": gpu_sharing_of(gpu_sharing, setups["gpu_workers"], is_local(job.runner), job.processes_per_gpu),
        "slurm": slurm,
        "inputs": [shards[name] for name in sorted(shards)],
        "previous": {"run_id": reuse.previous_run_id, "path": reuse.previous, "why_nothing_reused": reuse.why_not,
                     "reused_shards": sorted(reuse.reused), "copied_shards": sorted(reuse.carried),
                     "removed_shards": reuse.removed}
        if request.previous else None,
        "counts": totals(shards), "files": files, "units": units, "counters": counters,
        "file_target": {"rows": job.file_target.rows, "mb": job.file_target.megabytes},
        "versions": versions(), "command": list(request.command), "resumed": plan.resumed, "plan_key": plan.plan_key,
        "plan_key_version": PLAN_KEY_VERSION,
        "seconds": round(elapsed, 2), "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return Outcome(manifest, output, counters, elapsed, plan.work, request.allow_empty)


def gpu_sharing_of(driver: dict | None, gpu_workers: dict, local: bool, processes_per_gpu: int) -> dict | None:
    """The manifest's gpu_sharing: the driver's (DRIVER: processes per GPU and the MPS daemon it
    started, or None where it did not expect a GPU) with what the workers that decoded on a GPU
    recorded (GPU_WORKERS: run_setups' gpu_workers). Off this machine (not LOCAL: Dask, SLURM,
    Flink, Dataflow) the daemon is the workers' launcher's, so whether MPS was on is what the
    workers saw, not the driver's "cpu"; None when no worker decoded on a GPU and the driver
    expected none."""
    if not gpu_workers:
        return driver
    sharing = dict(driver or {"processes_per_gpu": processes_per_gpu, "mps": {"on": False, "how": "off"}})
    if not local:
        under = gpu_workers.get("mps", 0)
        sharing["mps"] = {"on": under > 0, "how": "the workers' launcher" if under else "off"}
    sharing["workers"] = gpu_workers
    return sharing


def precisions_of(shards: dict) -> set:
    """The precisions the rows of SHARDS (the manifest's inputs by name) were decoded in, those
    reused from an earlier run included (entries of code before setups name none)."""
    return {p for entry in shards.values() for p in (entry.get("precision") or {})}


def input_entries(run_id: str, reads: list[dict], decoded: dict, reuse: Reuse, bins: dict) -> dict:
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


def _reused_entry(output: str, previous: str, entry: dict) -> dict:
    """The previous run's manifest ENTRY as OUTPUT's manifest names it: its path rewritten to be
    relative to OUTPUT (or a full URL), so every entry opens as <OUTPUT>/<path>."""
    moved = {k: v for k, v in entry.items() if k != "root"}
    moved["path"] = entry_path(output, file_location(previous, entry))
    return moved
