"""The plan phase: what the run reads, where its rows go, and which run it is.

``plan_inputs`` finds what there is to decode: the input shards (minus those ``--previous`` gives
unchanged, paracorpus/incremental.py), their records (counted, or estimated from a sample for
compressed text), and the bins their rows are packed into (paracorpus/bins.py). The dry run stops
there. ``plan_run`` then decides the run: a new one, or the unfinished run with the same plan
with the same plan (an interrupted attempt of the same command), cut into work units
(paracorpus/units.py), or nothing at all when the committed run already has this plan.
``record_plan``, under the output's claim, writes the plan where a rerun finds it and says which
units are done already.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field

from beam_pipelines.commit import refuse_to_replace
from beam_pipelines.generation.check import Job, Request
from common import storage
from common.cli import UsageError
from common.shards import estimate_records, shard_identity, shard_size
from paracorpus.bins import bin_capacity, pack
from paracorpus.commit import (WORK, Fence, file_location, new_run_id, read_manifest_versioned, resumable_run,
                               work_dir)
from paracorpus.compaction import TABLES as DATA_TABLES
from paracorpus.compaction import carry_item, group_key
from paracorpus.incremental import Reuse, plan_reuse
from paracorpus.schema import MANIFEST
from paracorpus.units import finished_units, plan_units

log = logging.getLogger("paragen")


@dataclass(frozen=True)
class Inputs:
    """What the run has to decode and what it takes from --previous."""
    reuse: Reuse                     # shards to decode, shards reused or carried from --previous
    per_shard: dict                  # input shard to decode -> records (estimated unless EXACT)
    exact: bool
    bins: dict                       # input shard (decoded or carried) -> bin
    capacity: int                    # records per bin (all but the last)

    @property
    def decode(self) -> list:
        return self.reuse.decode

    @property
    def expected(self) -> int:
        return sum(self.per_shard.values())

    @property
    def nothing_to_do(self) -> bool:
        """Every shard unchanged since --previous: the run would be that run."""
        return self.reuse.nothing_to_do


@dataclass(frozen=True)
class Plan:
    """What a run will do, fixed before the pipeline starts (and kept for a rerun to continue)."""
    run_id: str
    output: str
    layout: dict                 # input shard -> (first unit, number of units): paracorpus.units.plan_units
    lang_pair: str
    config_hash: str
    bins: dict = field(default_factory=dict)     # input shard -> bin (decoded and carried shards)
    carries: list = field(default_factory=list)  # (group key, compaction.carry_item): rows to copy
    plan_key: str = ""           # what a rerun compares (_plan_key)
    resumed: bool = False        # continues an unfinished run
    unit_pairs: int = 0
    done: bool = False           # the committed run in OUTPUT has this plan: nothing to do
    committed_version: storage.Version = storage.ABSENT   # OUTPUT's manifest as planned on: published only over it
    claim_token: str = ""        # the claim the run writes under: its workers check it (paracorpus.commit.Fence)

    @property
    def work(self) -> str:
        return work_dir(self.output, self.run_id)

    @property
    def fence(self) -> Fence:
        """What the run's workers check before each write (paracorpus.commit.Fence)."""
        return Fence(self.output, self.claim_token, throttle=False)

    @property
    def num_units(self) -> int:
        return sum(n for _first, n in self.layout.values())


def plan_inputs(job: Job, previous: str | None) -> Inputs:
    """The shards JOB decodes, their records and bins, after taking what the run PREVIOUS gives."""
    capacity = bin_capacity(job.file_target.rows, job.cfg.num_output_shards)
    reuse = plan_reuse(previous, list(job.shards), job.config_hash, capacity) if previous \
        else Reuse(decode=list(job.shards))
    if reuse.why_not:
        log.warning("--previous %s: nothing reused: %s", previous, reuse.why_not)
    if reuse.nothing_to_do:
        return Inputs(reuse, {}, True, {}, capacity)
    per_shard, exact = estimate_records(reuse.decode)
    bins = pack({**per_shard, **{n: reuse.reused[n]["records_read"] for n in reuse.carried}}, capacity)
    return Inputs(reuse, per_shard, exact, bins, capacity)


def plan_run(job: Job, request: Request, inputs: Inputs, new_id: str | None = None) -> Plan:
    """The run into REQUEST.output, chosen under the output's claim (so that no other run publishes
    between this choice and this run's publish, which requires the manifest read here to be still
    there) so that the same command run again continues:

    - the committed run there has this plan (same config, inputs, units, previous run, bins):
      nothing to do (``Plan.done``), unless --overwrite asks for it again;
    - an unfinished run there has this plan (an attempt of this command that was stopped): it is
      continued, its finished units kept (with --run_id, only a run of that id);
    - otherwise a new run (named NEW_ID, the id its claim was taken with, or --run_id). A committed
      run with another plan is only replaced with --overwrite (UsageError), --resume or not."""
    key, same = _plan_identity(job, inputs)
    output = request.output
    committed, version = read_manifest_versioned(output, MANIFEST)     # under the claim: no one publishes now
    if committed is not None and same(committed) and not request.overwrite:
        return Plan(committed["run_id"], output, {}, job.lang_pair, job.config_hash, plan_key=key, done=True,
                    committed_version=version)
    refuse_to_replace(output, MANIFEST, "a committed run", request.overwrite, committed)
    if request.run_id is not None:
        refuse_other_plans_run(output, request.run_id, same)
    run_id = resumable_run(output, same)
    if run_id is not None and request.run_id in (None, run_id):
        plan = storage.read_json(storage.join(work_dir(output, run_id), "plan.json"))
        layout = {k: tuple(v) for k, v in plan["layout"].items()}
        return Plan(run_id, output, layout, job.lang_pair, job.config_hash, inputs.bins,
                    carries(inputs.reuse, inputs.bins), key, True, job.unit_pairs, committed_version=version)
    others = [r for r in storage.listdir(storage.join(output, WORK)) if r != run_id]
    if others:              # stopped runs of other inputs, models or settings: theirs is not this run's work
        log.warning("%s holds %d unfinished run(s) of another plan (%s); starting a new run, their files are removed "
                    "when it commits", output, len(others), ", ".join(sorted(others)[-3:]))
    elif request.resume:
        log.info("--resume: no unfinished run with this plan in %s; starting a new one", output)
    return Plan(request.run_id or new_id or new_run_id(), output, plan_units(inputs.per_shard, job.unit_pairs),
                job.lang_pair, job.config_hash, inputs.bins, carries(inputs.reuse, inputs.bins), key, False, job.unit_pairs,
                committed_version=version)


def _plan_identity(job: Job, inputs: Inputs):
    """(this run's plan key, a test of whether a plan record or manifest has the same plan)."""
    args = (job.config_hash, inputs.decode, job.unit_pairs, inputs.reuse.previous_run_id, inputs.capacity)
    key = _plan_key(*args)
    return key, _same_plan(key, lambda: _plan_key(*args, version=1))


def run_to_finish(job: Job, request: Request, inputs: Inputs) -> str | None:
    """The id of the run in REQUEST.output that this command would finish rather than start: the
    committed run there when it has this plan (its clean-up may be left), else the newest
    unfinished run of this plan; None. Read without the output's claim (a refresh choosing where
    to continue): plan_run decides again under it."""
    _key, same = _plan_identity(job, inputs)
    committed, _version = read_manifest_versioned(request.output, MANIFEST)
    if committed is not None:
        return committed["run_id"] if same(committed) else None
    return resumable_run(request.output, same)


def refuse_other_plans_run(output: str, run_id: str, same) -> None:
    """UsageError when OUTPUT/_work/RUN_ID holds an unfinished run of another plan (SAME(record)
    False): a --run_id names one run, and continuing it with other inputs, models or settings
    would mix the two plans' rows."""
    path = storage.join(work_dir(output, run_id), "plan.json")
    if not storage.isfile(path):
        return
    plan = storage.read_json(path)
    if not same(plan):
        raise UsageError(f"--run_id {run_id}: {storage.join(output, WORK, run_id)} holds an unfinished run of another "
                         f"plan (other inputs, models or settings: plan {plan.get('plan_key')}); give another "
                         "--run_id, run the command that started it to finish it, or remove that folder to start "
                         "afresh")


def units_committed(plan: Plan) -> str:
    """How far PLAN's run got, in words (what a stopped run keeps)."""
    try:
        done = str(len(finished_units(plan.work)))
    except OSError:                         # a store that is away cannot say
        done = "an unknown number"
    return f"{done} of {plan.num_units} work units committed in {plan.output}"


def record_plan(plan: Plan, job: Job, request: Request, inputs: Inputs) -> frozenset:
    """Under the output's claim: the units an earlier attempt of this run finished (none for a new
    run), after writing the plan where a rerun finds it, and one log line saying what runs."""
    finished = frozenset(finished_units(plan.work)) if plan.resumed else frozenset()
    storage.write_json(storage.join(plan.work, "plan.json"),
                       {"run_id": plan.run_id, "plan_key": plan.plan_key, "plan_key_version": PLAN_KEY_VERSION,
                        "layout": plan.layout, "bins": plan.bins,
                        "unit_pairs": plan.unit_pairs, "config_hash": plan.config_hash,
                        "command": list(request.command)})
    reuse = inputs.reuse
    log.info("generation run %s%s: %d shard(s) to decode (%s%s records, %d work units%s)%s, preset %s, mode %s, "
             "%s->%s, runner %s, config %s", plan.run_id, " (resumed)" if plan.resumed else "", len(inputs.decode),
             "" if inputs.exact else "~", f"{inputs.expected:,}", plan.num_units,
             f", {len(finished)} finished earlier" if finished else "",
             f", {len(reuse.reused)} reused from run {reuse.previous_run_id} ({len(reuse.carried)} of them copied "
             f"into new files), {len(reuse.removed)} removed" if reuse.previous else "", job.preset, job.cfg.mode,
             job.cleaning.src_lang, job.cleaning.tgt_lang, job.runner.rsplit(".", 1)[-1], plan.config_hash)
    return finished


PLAN_KEY_VERSION = 2      # 2: inputs known by each file's size and modification time (1: names and sizes)


def _plan_key(chash: str, shards, unit_pairs: int, previous_run: str | None = None, capacity: int = 0,
              version: int = PLAN_KEY_VERSION) -> str:
    """What must be the same for a rerun to continue a run (or find it done): config, inputs to
    decode (by name, each file's size and modification time: a file rewritten in place, even to
    the same size, is another input), how records are cut into units, the run it builds on and
    how shards are binned. VERSION 1 is the key runs made before version 2 recorded (names and
    total sizes), for the comparison with them."""
    if version == 1:
        inputs = [(s.name, shard_size(s)) for s in shards]
        return hashlib.sha256(json.dumps([chash, inputs, unit_pairs, previous_run, capacity]).encode()).hexdigest()[:16]
    inputs = [(s.name, shard_identity(s)) for s in shards]
    return hashlib.sha256(json.dumps([chash, inputs, unit_pairs, previous_run, capacity, version])
                          .encode()).hexdigest()[:16]


def _same_plan(key: str, legacy):
    """A test of a run's record (its manifest or plan.json): made for this plan? A record without
    a key version is compared with LEGACY() (the version-1 key, computed once if needed)."""
    memo: list = []

    def same(record: dict) -> bool:
        if record.get("plan_key_version") is not None:
            return record.get("plan_key") == key
        if not memo:
            memo.append(legacy())
        return record.get("plan_key") == memo[0]
    return same


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
