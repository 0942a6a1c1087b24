"""The generation job's phases one at a time (beam_pipelines/generation/, commit.py): the check
phase writes nothing and hashes the same settings the same way, the plan phase refuses a committed
run and finds the unfinished one, the Beam composites work on TestPipeline, the commit phase
publishes only what reconciles."""
import dataclasses
import json
import os

import apache_beam as beam
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_pipelines.commit import commit, refuse_to_replace
from beam_pipelines.generation.check import check
from beam_pipelines.generation.compact import WriteRunSummary, read_summary
from beam_pipelines.generation.decode import ReadPairs
from beam_pipelines.generation.plan import plan_inputs, plan_run, record_plan
from common.cli import EXIT_EMPTY, JobFailed, UsageError
from common.shards import discover_shards
from paracorpus.cleaning import CleaningConfig
from paracorpus.schema import MANIFEST
from tests.toydata import toy_bitext


@pytest.fixture
def tsv(tmp_path):
    pairs = toy_bitext(30, seed=5)[:12]
    lines = [f"{s}\t{t}" for s, t in pairs] + [f"{pairs[0][0]}\t{pairs[0][1]}", "no tab here", "\tA reference ."]
    path = tmp_path / "in.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _argv(tsv, out, models, *extra):
    return ["--input", tsv, "--output", str(out), "--forward_model", os.path.join(models, "cs-en"),
            "--backward_model", os.path.join(models, "en-cs"), "--unit_pairs", "5", *extra]


@pytest.mark.slow
def test_check_writes_nothing_and_hashes_settings_not_paths(tsv, tmp_path, tiny_nmt_models):
    out = tmp_path / "out"
    request, job = check(_argv(tsv, out, tiny_nmt_models))
    assert not out.exists()                                     # checked, nothing written
    assert request.output == str(out) and not request.resume and request.command[1:3] == ("--input", tsv)
    assert [s.name for s in job.shards] == ["in.tsv"] and job.lang_pair == "cs-en"
    _r, again = check(_argv(tsv, tmp_path / "elsewhere", tiny_nmt_models))
    assert again.config_hash == job.config_hash                 # the output is not a setting
    _r, other = check(_argv(tsv, out, tiny_nmt_models, "--topk", "3"))
    assert other.config_hash != job.config_hash
    # a pair's rows do not depend on its batch with this engine: a CPU's 64 and a GPU's 256 are
    # one plan, so a run continues (and a refresh reuses) what the other decoded
    for size in ("3", "256"):
        _r, batched = check(_argv(tsv, out, tiny_nmt_models, "--batch_pairs", size))
        assert batched.config_hash == job.config_hash and batched.cfg.batch_pairs == int(size)
    with pytest.raises(UsageError, match="--unit_pairs must be >= 1"):
        check(_argv(tsv, out, tiny_nmt_models, "--unit_pairs", "0"))
    assert not out.exists()


@pytest.mark.slow
def test_plan_refuses_a_committed_run_and_finds_the_unfinished_one(tsv, tmp_path, tiny_nmt_models):
    out = tmp_path / "out"
    request, job = check(_argv(tsv, out, tiny_nmt_models))
    inputs = plan_inputs(job, None)
    assert inputs.exact and inputs.per_shard == {"in.tsv": 15} and not inputs.nothing_to_do
    plan = plan_run(job, request, inputs)
    assert plan.num_units == 3 and not plan.resumed
    assert record_plan(plan, job, request, inputs) == frozenset()
    # the same plan with --resume continues that run; a different one starts anew
    resumed = plan_run(job, dataclasses.replace(request, resume=True), inputs)
    assert resumed.resumed and resumed.run_id == plan.run_id and resumed.layout == plan.layout
    other_request, other_job = check(_argv(tsv, out, tiny_nmt_models, "--unit_pairs", "4", "--resume"))
    other = plan_run(other_job, other_request, plan_inputs(other_job, None))
    assert not other.resumed and other.run_id != plan.run_id
    (out / MANIFEST).write_text(json.dumps({"run_id": "r0"}))
    with pytest.raises(UsageError, match=r"already holds a committed run \(r0\); pass --overwrite"):
        plan_run(job, request, inputs)
    with pytest.raises(UsageError, match="--overwrite"):      # --resume does not replace another plan's run
        plan_run(job, dataclasses.replace(request, resume=True), inputs)
    # the committed run has this plan: the same command (with --resume or not) has nothing to do
    (out / MANIFEST).write_text(json.dumps({"run_id": "r0", "plan_key": plan.plan_key, "plan_key_version": 2}))
    for same in (request, dataclasses.replace(request, resume=True)):
        done = plan_run(job, same, inputs)
        assert done.done and done.run_id == "r0"
    again = plan_run(job, dataclasses.replace(request, overwrite=True), inputs)      # made again on request
    assert not again.done and again.resumed and again.run_id == plan.run_id


def test_read_pairs_on_a_test_pipeline(tsv, tmp_path):
    shards = discover_shards([tsv], "cs", "en")
    work = str(tmp_path / "work")
    with test_pipeline.TestPipeline() as p:
        records = (p | beam.Create(shards)
                   | ReadPairs(CleaningConfig("cs", "en"), 10_000, "cs", "en", "hash", work))
        assert_that(records["pairs"] | beam.Map(lambda r: r["input_index"]), equal_to(list(range(12))),
                    label="pairs")
        assert_that(records["rejects"] | beam.Map(lambda r: (r["input_index"], r["reason"])),
                    equal_to([(12, "duplicate"), (13, "missing_column"), (14, "empty_src")]), label="rejects")
        assert_that(records["reads"] | beam.Map(lambda r: (r["input_shard"], r["records_read"])),
                    equal_to([("in.tsv", 15)]), label="reads")
    assert json.load(open(os.path.join(work, "read", "in.tsv.json")))["records_read"] == 15


def test_run_summary_gathers_groups_and_reads_on_a_test_pipeline(tmp_path):
    work = str(tmp_path / "work")
    groups, reads = [{"bin": "b0", "shard": 1}, {"bin": "b0", "shard": 0}], [{"input_shard": "a.tsv"}]
    with test_pipeline.TestPipeline() as p:
        n = {"groups": p | "G" >> beam.Create(groups), "reads": p | "R" >> beam.Create(reads)} | WriteRunSummary(work)
        assert_that(n, equal_to([3]))
    summary = read_summary(work)
    assert sorted(summary["groups"], key=lambda g: g["shard"]) == groups[::-1] and summary["reads"] == reads
    assert read_summary(str(tmp_path / "no-run")) == {"groups": [], "reads": []}


def test_commit_holds_back_a_run_with_a_problem_and_keeps_the_committed_one(tmp_path):
    out, work = tmp_path / "out", tmp_path / "out" / "_work" / "r2"
    (out / "paraphrases").mkdir(parents=True)
    (out / "paraphrases" / "old.parquet").write_bytes(b"old")
    (out / MANIFEST).write_text(json.dumps({"run_id": "r1", "files": {"paraphrases": [{"path": "paraphrases/old.parquet"}]}}))
    with pytest.raises(UsageError, match=r"already holds a committed run \(r1\)"):
        refuse_to_replace(str(out), MANIFEST, "a committed run", allowed=False)
    refuse_to_replace(str(out), MANIFEST, "a committed run", allowed=True)
    new = {"run_id": "r2", "files": {"paraphrases": [{"path": "paraphrases/new.parquet"}]}}
    (out / "paraphrases" / "new.parquet").write_bytes(b"new")
    with pytest.raises(JobFailed) as failed:
        commit(str(out), MANIFEST, new, ("paraphrases",), str(work), JobFailed("nothing to publish", EXIT_EMPTY))
    assert failed.value.code == EXIT_EMPTY
    assert json.loads((work / "manifest.json").read_text())["run_id"] == "r2"
    assert json.loads((out / MANIFEST).read_text())["run_id"] == "r1" and (out / "paraphrases" / "old.parquet").exists()
    removed = commit(str(out), MANIFEST, new, ("paraphrases",), str(work))
    assert removed == ["paraphrases/old.parquet"] and not (out / "_work").exists()
    assert json.loads((out / MANIFEST).read_text())["run_id"] == "r2"


def test_outcome_says_why_a_run_is_not_published():
    from beam_pipelines.generation.outcome import Outcome

    def outcome(counts, allow_empty=False):
        return Outcome({"counts": counts}, "out", {}, 1.0, "out/_work/r", allow_empty)
    good = {"records_read": 2, "paraphrase_rows": 3, "rejected": 1, "reconciled": True,
            "rejected_by_reason": {"duplicate": 1}}
    assert outcome(good).problem is None
    unreconciled = outcome({**good, "reconciled": False}).problem
    assert unreconciled.code == 1 and "do not reconcile" in str(unreconciled)
    empty = {**good, "paraphrase_rows": 0, "rejected": 2, "rejected_by_reason": {"duplicate": 2}}
    assert outcome(empty).problem.code == EXIT_EMPTY and "duplicate 2" in str(outcome(empty).problem)
    assert outcome(empty, allow_empty=True).problem is None
