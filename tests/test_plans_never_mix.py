"""Plans never mix (issue 53): a run's work directory holds one plan's records, and every
unit and group record names its plan.

- `--run_id X` where `_work/X` holds an unfinished run of other settings is refused before
  anything is written (it used to start a "new" run there, over the other plan's plan.json and
  beside its records).
- The Parquet columns read are part of what decides the rows: after fixing swapped
  `--src_column/--tgt_column` the same command decodes again (it used to say "nothing to do").
- A group record or a unit record of another plan is never reused.
"""
import json
import os
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.cli import UsageError
from paracorpus.compaction import FileTarget, compact_group
from tests.jobs import committed_rows, quick_args
from tests.test_compaction import _unit
from tests.claims import claim_record
from tests import warm_python


def test_a_group_record_of_another_plan_is_not_reused(tmp_path):
    out, work = str(tmp_path / "out"), str(tmp_path / "out" / "_work" / "r1")
    units = [_unit(out, u, 3) for u in (1, 2)]
    first = compact_group(out, work, "cs-en", "b1", 3, units, [], FileTarget(rows=5), plan_key="plan-a")
    again = compact_group(out, work, "cs-en", "b1", 3, units, [], FileTarget(rows=5), plan_key="plan-a")
    assert again.get("reused_group") and again["files"] == first["files"]
    other = compact_group(out, work, "cs-en", "b1", 3, units, [], FileTarget(rows=5), plan_key="plan-b")
    assert not other.get("reused_group") and other["plan_key"] == "plan-b" and other["files"] != first["files"]


def test_a_unit_record_of_another_plan_is_refused(tmp_path):
    from paracorpus.units import unit_record_path
    from transforms.units import reuse_unit

    work = str(tmp_path / "w")
    os.makedirs(os.path.dirname(unit_record_path(work, 4)))
    with open(unit_record_path(work, 4), "w") as f:
        json.dump({"unit": 4, "plan_key": "plan-a"}, f)
    assert reuse_unit(4, work, "plan-a")["reused"]
    with pytest.raises(RuntimeError, match="written for plan plan-a, not this run's"):
        reuse_unit(4, work, "plan-b")


@pytest.fixture(scope="module")
def bitext(tmp_path_factory):
    from tests.toydata import toy_bitext

    path = tmp_path_factory.mktemp("in") / "toy.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in toy_bitext(400, seed=31)[:24]))
    return str(path)


@pytest.mark.slow
def test_a_run_id_of_another_plans_unfinished_run_is_refused_before_writing(bitext, tiny_nmt_models, tmp_path):
    from beam_pipelines.generate import run

    out = tmp_path / "out"
    work = out / "_work" / "nightly"
    work.mkdir(parents=True)
    (work / "plan.json").write_text(json.dumps({"run_id": "nightly", "plan_key": "0123456789abcdef"}))
    before = (work / "plan.json").read_text()
    with pytest.raises(UsageError, match="--run_id nightly: .* holds an unfinished run of another plan"):
        run(quick_args(bitext, out, tiny_nmt_models, "--run_id", "nightly"))
    assert (work / "plan.json").read_text() == before and sorted(os.listdir(work)) == ["plan.json"]
    assert not claim_record(out)


@pytest.mark.slow
def test_continue_only_continues_its_own_plans_run_and_writes_nothing_for_another(bitext, tiny_nmt_models,
                                                                                  tmp_path):
    """--run_id X --continue_only (how a refresh continues a stopped one, decided by the job under
    the output's claim): a stopped run of another plan is not continued and nothing is written;
    one of this plan is continued. Without --run_id it is refused."""
    from beam_pipelines.generate import run

    out = tmp_path / "out"
    work = out / "_work" / "nightly"
    work.mkdir(parents=True)
    (work / "plan.json").write_text(json.dumps({"run_id": "nightly", "plan_key": "0123456789abcdef"}))
    result = run(quick_args(bitext, out, tiny_nmt_models, "--run_id", "nightly", "--continue_only"))
    assert result["not_continued"] and sorted(os.listdir(out)) == ["_work"] and os.listdir(work) == ["plan.json"]
    assert not claim_record(out)
    with pytest.raises(UsageError, match="--continue_only continues the run --run_id names"):
        run(quick_args(bitext, out, tiny_nmt_models, "--continue_only"))
    # this plan's run, stopped while its second unit is written: continued, the first reused
    mine = tmp_path / "mine"
    args = quick_args(bitext, mine, tiny_nmt_models, "--run_id", "r1")
    stopped = warm_python.run([sys.executable, "-m", "beam_pipelines.generate", *args], capture_output=True, text=True,
                              env={**os.environ, "PARAGEN_CRASH_AT": "*part-u000001-:TERM"}, timeout=600)
    assert stopped.returncode == 143, stopped.stderr[-2000:]
    again = run([*args, "--continue_only"])
    assert again["run_id"] == "r1" and again["resumed"] and not again.get("not_continued")


@pytest.mark.slow
def test_fixing_swapped_parquet_columns_decodes_again(tmp_path, tiny_nmt_models):
    from beam_pipelines.generate import run
    from tests.toydata import toy_bitext

    pairs = toy_bitext(400, seed=31)[:12]
    shard = tmp_path / "in" / "part-0.parquet"
    shard.parent.mkdir()
    pq.write_table(pa.table({"czech": [s for s, _ in pairs], "english": [t for _, t in pairs]}), shard)
    out = tmp_path / "out"
    swapped = run(quick_args(str(shard.parent), out, tiny_nmt_models, "--src_column", "english",
                             "--tgt_column", "czech", "--allow_empty"))
    fixed_args = quick_args(str(shard.parent), out, tiny_nmt_models, "--src_column", "czech", "--tgt_column", "english")
    with pytest.raises(UsageError, match="already holds a committed run .* --overwrite"):
        run(fixed_args)                          # another plan now, not "nothing to do"
    fixed = run([*fixed_args, "--overwrite"])
    assert not fixed.get("noop") and fixed["config_hash"] != swapped["config_hash"]
    assert {r["reference"] for r in committed_rows(out)} <= {t for _, t in pairs}      # English references now


@pytest.mark.slow
def test_an_input_rewritten_to_the_same_size_is_another_plan_and_older_runs_still_match(bitext, tiny_nmt_models,
                                                                                       tmp_path):
    """Inputs are known by each file's size and modification time: a shard rewritten in place to
    the same size (a fixed line) is no longer 'nothing to do'. A run committed by a version that
    knew inputs by name and size only (no plan_key_version) still counts as done."""
    import shutil

    from beam_pipelines.generate import run

    shard = tmp_path / "in.tsv"
    shutil.copy(bitext, shard)
    out = tmp_path / "out"
    args = quick_args(str(shard), out, tiny_nmt_models)
    run(args)
    assert run(args).get("noop")                                      # the same command: nothing to do
    manifest = json.loads((out / "_manifest.json").read_text())
    # as an earlier version wrote it: the name-and-size key, no version
    from beam_pipelines.generation.check import check
    from beam_pipelines.generation.plan import _plan_key, plan_inputs

    _request, job = check(args)
    inputs = plan_inputs(job, None)
    legacy = _plan_key(job.config_hash, inputs.decode, job.unit_pairs, None, inputs.capacity, version=1)
    old = {**manifest, "plan_key": legacy}
    del old["plan_key_version"]
    (out / "_manifest.json").write_text(json.dumps(old))
    assert run(args).get("noop")                                      # still done
    (out / "_manifest.json").write_text(json.dumps(manifest))         # this version's again
    text = shard.read_text()
    shard.write_text(text.replace("a", "b", 1) if "a" in text else text[::-1])   # the same size, other content
    os.utime(shard, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
    with pytest.raises(UsageError, match="already holds a committed run"):
        run(args)
