"""The generation job: bitext shards -> paraphrase Parquet partitions, rejects and a manifest.

    paragen-generate --input examples/cs-en.example.tsv --output runs/example-out \\
        --forward_model runs/example-models/cs-en --backward_model runs/example-models/en-cs

A run is six phases, each in its own module of beam_pipelines/generation/ (run() below is their
order): **check** everything before anything is written (check.py) -> under the output's claim,
**plan** the inputs, bins and the run to start or continue (plan.py; ``--dry_run`` stops before the
claim with an estimate, dry_run.py) -> **decode** with one Beam pipeline (decode.py) whose last
stages **compact** the unit files (compact.py) -> **commit**: publish the manifest only if the
counts reconcile, and only over the manifest the plan read (outcome.py, beam_pipelines/commit.py)
-> **report** (beam_pipelines/report.py).
The same command run again after a stop continues the run (plan.py); a signal or a failure ends
it in one line with the committed units kept (common/stopping.py).

One pair's path: ReadShard (transforms/io.py, common/shards.py) -> Clean (paracorpus/steps.py
CleanStep through transforms/steps.py) -> Deduplicate -> GroupByKey on the pair's work unit ->
RunInference with UnitTranslatorHandler (transforms/units.py -> paracorpus/units.py ->
paracorpus/paraphrasing.py -> models/nmt/engines/fairseq_engine.py, paracorpus/clustering.py) -> WriteUnit
(paracorpus/units.py; columns in paracorpus/schema.py) -> compaction (paracorpus/compaction.py)
-> the run's manifest, written last (paracorpus/commit.py).
"""
from __future__ import annotations

import dataclasses
import sys

from beam_pipelines.commit import Claim, commit, finish_cleanup
from beam_pipelines.generation.check import check
from beam_pipelines.generation.dry_run import dry_run
from beam_pipelines.generation.options import build_parser
from beam_pipelines.generation.outcome import collect
from beam_pipelines.generation.plan import plan_inputs, plan_run, record_plan, run_to_finish, units_committed
from beam_pipelines.report import report_already_done, report_generation, report_not_continued, report_nothing_changed
from beam_pipelines.slurm import last_usage
from common.stopping import Stopping
from common import storage
from common.cli import cli_main, configure_logging
from paracorpus.commit import new_run_id
from paracorpus.schema import MANIFEST

TABLES = ("paraphrases", "rejects", "dedup", "_counts")      # what publish() cleans (_counts: contract v1 runs)

__all__ = ["run", "main", "build_parser", "TABLES"]


def run(argv=None) -> dict:
    """Check everything, then run the job; returns the manifest. UsageError for a mistake."""
    argv = sys.argv[1:] if argv is None else list(argv)
    with Stopping("the generation job") as stopping:    # SIGTERM/SIGINT: stop in one line, workers too
        with storage.first_contact():                  # a store never reached is a mistake, said at once
            request, job = check(argv)                  # 1. check: refused before anything is written
        if request.dry_run:                             #    the plan and its estimate; nothing written
            inputs = plan_inputs(job, request.previous)
            if inputs.nothing_to_do:
                return report_nothing_changed(inputs.reuse.previous_run_id, inputs.reuse.previous)
            return dry_run(job, request, inputs)
        # 2. plan, under the output's claim: what is decided here (replace, done, resume, what
        # --previous gives) stays true until the publish, which requires the manifest read here
        with Claim(request.output, request.run_id or new_run_id(), on_lost=lambda why: stopping.end(why, 75)) as claim:
            stopping.watch("the generation job", None, claim.release)
            finish_cleanup(request.output, MANIFEST, TABLES, claim)    # a run stopped during its clean-up
            previous = previous_manifest_check(request.previous)
            inputs = plan_inputs(job, request.previous)  # what to decode, what --previous gives
            if inputs.nothing_to_do:
                return report_nothing_changed(inputs.reuse.previous_run_id, inputs.reuse.previous)
            if request.continue_only and run_to_finish(job, request, inputs) != request.run_id:
                return report_not_continued(request.run_id, request.output)
            plan = plan_run(job, request, inputs, claim.run_id)   # new, the stopped one continued, or done
            if plan.done:
                return report_already_done(plan.run_id, plan.output)
            claim.rename(plan.run_id)
            plan = dataclasses.replace(plan, claim_token=claim.token)      # its workers write under this claim
            stopping.watch(f"generation run {plan.run_id}", lambda: units_committed(plan), claim.release)
            finished = record_plan(plan, job, request, inputs)
            # imported here: the decoding stages pull in torch (about 3 s), which a mistake refused
            # by the check or a --dry_run never needs
            from beam_pipelines.generation.decode import decode

            # 3-4. the pipeline: decode, then compact; a failure is one line, the committed units kept
            elapsed, sharing = decode(job, plan, inputs, finished, stopping)
            outcome = collect(job, request, inputs, plan, elapsed, sharing, last_usage())
            try:                                        # 5. commit: publish only if the counts reconcile
                commit(plan.output, MANIFEST, outcome.manifest, TABLES, plan.work, outcome.problem, stopping.critical,
                       claim, plan.committed_version, watch=previous)
            finally:                                    # 6. report, published or not
                report_generation(outcome.manifest, outcome.counters, elapsed, plan.output)
    return outcome.manifest


def previous_manifest_check(previous: str | None) -> tuple:
    """The check that the run --previous names (when it is not the output itself, whose manifest
    the publish requires anyway) is still the one this run builds on when it publishes."""
    if not previous:
        return ()
    path = storage.join(previous, MANIFEST)
    return ((path, storage.read_versioned(path)[1], "the run --previous names"),)


def main(argv=None) -> int:
    configure_logging()
    return cli_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
