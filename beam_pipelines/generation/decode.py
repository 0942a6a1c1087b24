"""The decode phase: the generation job's Beam pipeline, built from composite transforms named for
what they do, and run to the end.

    ShardList     the input shards, found and checked by the check phase
    Read          ReadPairs: records -> clean -> deduplicate; every reject so far; one read record
                  per input shard
    Decode        DecodeByUnit: every pair and reject keyed by its work unit; each unit not
                  finished by an earlier attempt decoded (RunInference) and written, with its
                  completion record
    Compact       compact.py: a bin's unit files in one output partition rewritten into files
                  sized for readers
    Summary       compact.py: the read and group records gathered into WORK/summary.json

One pipeline, so that the workers compact as they go; the driver reads the summary afterwards
(outcome.py).
"""
from __future__ import annotations

import time

import apache_beam as beam

from beam_pipelines.generation.check import Job
from beam_pipelines.generation.compact import Compact, WriteRunSummary
from beam_pipelines.generation.mps import MpsDaemon
from beam_pipelines.generation.plan import Inputs, Plan, units_committed
from beam_pipelines.options import is_local, run_pipeline
from common.stopping import RunnerNoise, Stopping, pipeline_failure
from paracorpus.cleaning import CleaningConfig
from paracorpus.commit import file_location
from paracorpus.run_progress import DriverProgress
from paracorpus.steps import CleanStep
from transforms.cleaning import Deduplicate
from transforms.io import COUNTS_TAG, MAIN_TAG, REJECTS_TAG, ReadShard, SplitTagged
from transforms.steps import ApplyStep
from transforms.units import PAIR, REJECT, UNIT, DecodeUnits, UnitTranslatorHandler, key_by_unit, reuse_unit


class ReadPairs(beam.PTransform):
    """Input shards -> {"pairs": cleaned, deduplicated pairs; "rejects": the read, clean and
    duplicate rejects; "reads": one read record per shard (also written to WORK/read/)}.
    PREVIOUS_DEDUP: (dedup file, input shards whose rows count or None) of the shards an
    incremental run reuses, whose pairs a new pair duplicates."""

    def __init__(self, cleaning: CleaningConfig, max_line_chars: int, src_column: str, tgt_column: str,
                 config_hash: str, work: str, previous_dedup: list[tuple] | None = None, fence=None):
        super().__init__()
        self.cleaning, self.max_line_chars = cleaning, max_line_chars
        self.src_column, self.tgt_column = src_column, tgt_column
        self.config_hash, self.work, self.previous_dedup = config_hash, work, previous_dedup
        self.fence = fence

    def expand(self, shards):
        chash = self.config_hash
        read = (shards | "ReadShards" >> beam.ParDo(ReadShard(self.max_line_chars, self.src_column, self.tgt_column,
                                                               chash, self.work, self.fence))
                | "SplitRead" >> SplitTagged((MAIN_TAG, REJECTS_TAG, COUNTS_TAG)))
        cleaned = (read[MAIN_TAG] | "Clean" >> beam.ParDo(ApplyStep(CleanStep(self.cleaning), chash, "pairs_clean"))
                   | "SplitClean" >> SplitTagged())
        dedup = (cleaned[MAIN_TAG] | "Deduplicate" >> Deduplicate(chash, self.previous_dedup)
                 | "SplitDedup" >> SplitTagged())
        rejects = (read[REJECTS_TAG], cleaned[REJECTS_TAG], dedup[REJECTS_TAG]) | "EarlyRejects" >> beam.Flatten()
        return {"pairs": dedup[MAIN_TAG], "rejects": rejects, "reads": read[COUNTS_TAG]}


class DecodeByUnit(beam.PTransform):
    """{"pairs", "rejects"} -> the completion record of every unit of PLAN: each record keyed by
    its work unit; a unit an earlier attempt finished (FINISHED) is not decoded again, its record
    read back; every other unit decoded and written (transforms/units.py DecodeUnits)."""

    def __init__(self, plan: Plan, handler: UnitTranslatorHandler, num_output_shards: int,
                 finished: frozenset = frozenset(), use_run_inference: bool = True):
        super().__init__()
        self.plan, self.handler, self.num_output_shards = plan, handler, num_output_shards
        self.finished, self.use_run_inference = finished, use_run_inference

    def expand(self, records):
        plan, finished = self.plan, self.finished
        p = records["pairs"].pipeline
        pairs = records["pairs"] | "KeyPairsByUnit" >> beam.Map(key_by_unit(PAIR, plan.layout))
        rejects = records["rejects"] | "KeyRejectsByUnit" >> beam.Map(key_by_unit(REJECT, plan.layout))
        # One marker element per unit, from a Create: on the DaskRunner a GroupByKey keeps the partition
        # count of its inputs and only a Create's is set (--dask_npartitions), so the markers are what
        # spreads the units over the workers there.
        markers = p | "UnitMarkers" >> beam.Create([(u, (UNIT, None)) for u in range(plan.num_units)
                                                    if u not in finished])
        units = ((pairs, rejects, markers) | "AllRecords" >> beam.Flatten()
                 | "SkipFinishedUnits" >> beam.Filter(lambda kv: kv[0] not in finished)
                 | "GroupByUnit" >> beam.GroupByKey())
        written = units | "Units" >> DecodeUnits(self.handler, plan.output, plan.work, plan.lang_pair,
                                                 self.num_output_shards, plan.layout, self.use_run_inference,
                                                 plan.plan_key, plan.fence)
        reused = (p | "FinishedUnits" >> beam.Create(sorted(finished))
                  | "ReuseUnits" >> beam.Map(reuse_unit, plan.work, plan.plan_key))
        return (written, reused) | "UnitRecords" >> beam.Flatten()


def unit_handler(job: Job, inputs: Inputs) -> UnitTranslatorHandler:
    """RunInference's model handler for JOB: the models each worker process loads, and how."""
    models, workers = job.models, job.workers
    forward, backward = models["forward"]["path"], models.get("backward", {}).get("path")
    return UnitTranslatorHandler(
        forward, backward, job.device, job.precision, job.threads, {k: v["sha256"] for k, v in models.items()},
        job.cfg, job.config_hash, inputs.expected // workers if workers and inputs.expected else None,
        bitext=job.bitext if job.bitext.enabled else None, langs=(job.cleaning.src_lang, job.cleaning.tgt_lang),
        processes_per_gpu=job.processes_per_gpu, decode_step=job.decode_step)


def build(p: beam.Pipeline, job: Job, plan: Plan, inputs: Inputs, finished: frozenset = frozenset(),
          handler: UnitTranslatorHandler | None = None, use_run_inference: bool = True) -> None:
    """The pipeline of PLAN on P: read -> clean -> dedup -> decode and write each unit not in
    FINISHED -> compact -> one summary of the run (WORK/summary.json) for the driver to commit."""
    reuse = inputs.reuse
    previous_dedup = [(file_location(reuse.previous, f), shards) for f, shards in reuse.dedup_sources()]
    records = (p | "ShardList" >> beam.Create(inputs.decode)
               | "Read" >> ReadPairs(job.cleaning, job.max_line_chars, job.src_column, job.tgt_column,
                                     plan.config_hash, plan.work, previous_dedup, plan.fence))
    units = records | "Decode" >> DecodeByUnit(plan, handler or unit_handler(job, inputs), job.cfg.num_output_shards,
                                               finished, use_run_inference)
    groups = units | "Compact" >> Compact(plan.output, plan.work, plan.lang_pair, plan.bins, plan.carries,
                                          job.file_target, plan.plan_key, plan.fence)
    _ = {"groups": groups, "reads": records["reads"]} | "Summary" >> WriteRunSummary(plan.work, plan.fence)


def decode(job: Job, plan: Plan, inputs: Inputs, finished: frozenset,
           stopping: Stopping) -> tuple[float, dict]:
    """Run PLAN's pipeline to the end on JOB's runner: (seconds it took, how its GPU
    worker processes shared a GPU). A failure is one line (JobFailed) with the committed units
    kept; a worker process that dies ends the job through STOPPING at once
    (common/stopping.py). GPU worker processes of this machine run under an MPS daemon
    of the run's where --mps allows (beam_pipelines/generation/mps.py)."""
    beam_args = list(job.beam_args)
    dask = "dask" in job.runner.lower()
    if dask and not any(a.startswith(("--dask_npartitions", "--dask_partition_size")) for a in beam_args):
        beam_args += ["--dask_npartitions", str(min(max(plan.num_units, 2), 512))]
    handler = unit_handler(job, inputs)
    start = time.time()
    mps = MpsDaemon(job.mps, gpu=is_local(job.runner) and job.device == "cuda", processes_per_gpu=job.processes_per_gpu)
    try:
        with mps, RunnerNoise(stopping.on_worker_lost(plan.work)) as noise, \
                DriverProgress(plan.work, plan.num_units, inputs.expected or None, finished):
            run_pipeline(
                lambda p: build(p, job, plan, inputs, finished, handler, use_run_inference=not dask), beam_args,
                name=f"paragen-generate-{plan.run_id}")
    except Exception as exc:  # noqa: BLE001: any failure of the pipeline is one line; its units are kept
        raise pipeline_failure(exc, plan.work, units_committed(plan), noise.kept, plan.output) from None
    sharing = {"processes_per_gpu": job.processes_per_gpu, "mps": mps.state.to_dict()} if job.device != "cpu" else None
    return time.time() - start, sharing



