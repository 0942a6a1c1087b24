"""Files sized for readers: each input shard's unit files in an output partition are rewritten
into files of about --file_rows rows before the run is published (paracorpus/compaction.py). The
compacted rows are the units' rows; a kill during compaction leaves no published run and
--resume gives the uninterrupted rows; incremental runs and refreshes reuse compacted files;
--dry_run writes nothing."""
import json
import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common import storage
from paracorpus.commit import committed_files
from paracorpus.compaction import FileTarget, compact_group, group_record_path
from tests.claims import run_files
from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------ the core, on synthetic unit files
def _unit(out, unit, rows, partition=3, shard="a.tsv"):
    rel = f"paraphrases/cs-en/{partition:05d}/part-u{unit:06d}-x.parquet"
    os.makedirs(os.path.dirname(os.path.join(out, rel)), exist_ok=True)
    table = pa.table({"pair_id": [f"u{unit}r{i}" for i in range(rows)], "n": list(range(rows))})
    pq.write_table(table, os.path.join(out, rel))
    return {"unit": unit, "input_shard": shard, "shard": partition, "worker": "w1", "seconds": 1.0,
            "files": {"paraphrases": [{"path": rel, "rows": rows, "bytes": os.path.getsize(os.path.join(out, rel))}]},
            "counts": {"records": rows, "pairs_with_paraphrases": rows, "paraphrase_rows": rows, "rejected": 0,
                       "rejected_by_reason": {}}, "counters": {"paraphrases": rows}}


def test_a_group_is_rewritten_into_files_of_the_target_size_in_unit_order(tmp_path):
    out, work = str(tmp_path / "out"), str(tmp_path / "out" / "_work" / "r1")
    units = [_unit(out, u, rows) for u, rows in ((5, 4), (2, 7), (9, 3))]
    record = compact_group(out, work, "cs-en", "b1", 3, units, [], FileTarget(rows=5))
    files = record["files"]["paraphrases"]
    assert [f["rows"] for f in files] == [5, 5, 4]
    assert all(f["path"].startswith("paraphrases/cs-en/00003/part-s") and f["bin"] == "b1" and f["shard"] == 3
               for f in files)
    got = pa.concat_tables(pq.read_table(os.path.join(out, f["path"])) for f in files).column("pair_id").to_pylist()
    want = [f"u{u}r{i}" for u, rows in ((2, 7), (5, 4), (9, 3)) for i in range(rows)]     # units in order
    assert got == want
    # rows of several units make one row group, not one each
    assert [pq.ParquetFile(os.path.join(out, f["path"])).metadata.num_row_groups for f in files] == [1, 1, 1]
    assert record["units"] == [2, 5, 9] and record["counts"]["paraphrase_rows"] == 14
    assert record["per_worker"] == {"w1": 3} and record["unit_files"] == 3
    assert record["counts_per_shard"]["a.tsv"]["paraphrase_rows"] == 14
    assert os.path.isfile(group_record_path(work, "b1", 3))
    # the same group again (a resumed run): its record is taken, nothing rewritten
    again = compact_group(out, work, "cs-en", "b1", 3, units, [], FileTarget(rows=5))
    assert again["files"] == record["files"] and again["reused_group"]
    # 11 rows, 10 a file: two even files, not 10 rows and a stub of 1
    even = compact_group(out, str(tmp_path / "w3"), "cs-en", "b2", 2, [_unit(out, u, n, partition=2) for u, n in
                                                                         ((20, 4), (21, 7))], [], FileTarget(rows=10))
    assert [f["rows"] for f in even["files"]["paraphrases"]] == [6, 5]
    # one unit's file is published as it is
    single = compact_group(out, str(tmp_path / "w2"), "cs-en", "b1", 1, [_unit(out, 11, 4, partition=1)], [],
                           FileTarget())
    assert single["files"]["paraphrases"][0]["path"].endswith("part-u000011-x.parquet")


def test_carried_rows_are_copied_filtered_by_input_shard_before_the_units_rows(tmp_path):
    """A group of a refresh copies the rows of the shards it carries out of an earlier run's file
    (which also holds rows of a shard that changed), then writes its units' rows."""
    out, work = str(tmp_path / "out"), str(tmp_path / "out" / "_work" / "r2")
    old = str(tmp_path / "r1" / "paraphrases" / "old.parquet")
    os.makedirs(os.path.dirname(old))
    shards = ["a.tsv", "b.tsv", "c.tsv"] * 4                   # b.tsv changed: its old rows must not come back
    pq.write_table(pa.table({"pair_id": [f"old{i}" for i in range(12)], "n": list(range(12)), "input_shard": shards}),
                   old, row_group_size=5)
    unit = _unit(out, 7, 3, shard="b.tsv")
    unit_table = pq.read_table(os.path.join(out, unit["files"]["paraphrases"][0]["path"]))
    pq.write_table(unit_table.append_column("input_shard", pa.array(["b.tsv"] * 3)),
                   os.path.join(out, unit["files"]["paraphrases"][0]["path"]))
    carry = {"table": "paraphrases", "location": old, "input_shards": ["a.tsv", "c.tsv"], "rows": 12,
             "bytes": os.path.getsize(old)}
    record = compact_group(out, work, "cs-en", "b9", 3, [unit], [carry], FileTarget(rows=100))
    files = record["files"]["paraphrases"]
    got = pa.concat_tables(pq.read_table(os.path.join(out, f["path"])) for f in files)
    want_old = [f"old{i}" for i in range(12) if shards[i] != "b.tsv"]
    assert got.column("pair_id").to_pylist() == want_old + ["u7r0", "u7r1", "u7r2"]
    assert record["input_shards"] == ["a.tsv", "b.tsv", "c.tsv"] and record["carried"] == ["a.tsv", "c.tsv"]
    assert sum(f["rows"] for f in files) == 11 and record["counts_per_shard"] == {
        "b.tsv": {"pairs_with_paraphrases": 3, "paraphrase_rows": 3, "rejected": 0, "rejected_by_reason": {}}}
    # the same units with other carried rows are not the same group: compacted again
    again = compact_group(out, work, "cs-en", "b9", 3, [unit], [{**carry, "input_shards": ["a.tsv"]}],
                          FileTarget(rows=100))
    assert not again.get("reused_group") and sum(f["rows"] for f in again["files"]["paraphrases"]) == 7


def test_shards_are_packed_into_bins_of_the_capacity_in_name_order():
    from paracorpus.bins import bin_capacity, bin_id, pack

    assert bin_capacity(1_000_000, 8) == 8_000_000
    bins = pack({"d": 5, "a": 4, "c": 30, "b": 3, "e": 1}, capacity=10)
    assert bins == {"a": bin_id(["a", "b", "c"]), "b": bin_id(["a", "b", "c"]), "c": bin_id(["a", "b", "c"]),
                    "d": bin_id(["d", "e"]), "e": bin_id(["d", "e"])}
    # 2,500 shards of 20k records with a 1M-row target and 8 partitions: 7 bins, not 2,500
    many = pack({f"s{i:04d}": 20_000 for i in range(2500)}, bin_capacity(1_000_000, 8))
    assert len(set(many.values())) == 7


def test_the_megabyte_target_bounds_files_too():
    target = FileTarget(rows=1_000_000, megabytes=1)
    assert target.rows_per_file(rows=10_000, size=100 << 20) == 100            # 10 KB a row: 100 rows per MB
    assert target.rows_per_file(rows=10, size=5) == 1_000_000                  # half a byte a row: rows bound it
    with pytest.raises(ValueError):
        FileTarget(rows=0)


# ------------------------------------------------------------------ the job
def _args(inp, out, models, *extra):
    return ["--input", str(inp), "--output", str(out), "--forward_model", os.path.join(models, "cs-en"),
            "--backward_model", os.path.join(models, "en-cs"), "--num_sets", "1", "--num_samples", "3",
            "--score_threshold", "20", "--dual_xent_threshold", "20", "--device", "cpu", *extra]


@pytest.fixture(scope="module")
def bitext(tmp_path_factory):
    from tests.toydata import toy_bitext

    folder = tmp_path_factory.mktemp("compaction-in")
    pairs = toy_bitext(400, seed=31)
    for i, name in enumerate(("a.tsv", "b.tsv")):
        (folder / name).write_text("".join(f"{s}\t{t}\n" for s, t in pairs[24 * i:24 * (i + 1)]))
    return folder


def _rows(out, table="paraphrases", drop=("shard",)):
    """A table's rows, sorted; scores rounded: batches of other sizes differ in the 7th digit."""
    files = committed_files(str(out), table)
    rows = storage.parquet_dataset(files).to_table().to_pylist() if files else []
    return sorted(({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items() if k not in drop}
                   for r in rows), key=lambda r: (r["pair_id"], r.get("rank") or 0))


@pytest.mark.slow
def test_compacted_rows_are_the_units_rows(bitext, tiny_nmt_models, tmp_path):
    from beam_pipelines.generate import run

    many = run(_args(bitext, tmp_path / "many", tiny_nmt_models, "--unit_pairs", "3", "--num_output_shards", "2"))
    one = run(_args(bitext, tmp_path / "one", tiny_nmt_models, "--unit_pairs", "1000", "--num_output_shards", "2"))
    assert many["units"]["written"] == 16 and one["units"]["written"] == 2
    # 16 units' files (one per table with rows) became one file per (input shard, partition) and table
    assert many["units"]["unit_files"] >= 32 and many["units"]["published_files"] <= 2 * 2 * 3
    for table in ("paraphrases", "rejects", "dedup"):
        assert _rows(tmp_path / "many", table) == _rows(tmp_path / "one", table)
        assert sum(e["rows"] for e in many["files"][table]) == sum(e["rows"] for e in one["files"][table])
    on_disk = run_files(tmp_path / "many")
    assert on_disk == sorted([e["path"] for t in many["files"].values() for e in t] + ["_manifest.json"])
    assert many["counts"] == one["counts"]


@pytest.mark.slow
def test_a_kill_during_compaction_then_resume_gives_the_uninterrupted_rows(bitext, tiny_nmt_models, tmp_path):
    from beam_pipelines.generate import run

    # one-row files: compaction writes hundreds of files, long enough to be killed half way
    args = ("--unit_pairs", "3", "--num_output_shards", "4", "--file_rows", "1")
    whole = run(_args(bitext, tmp_path / "whole", tiny_nmt_models, *args))
    out = tmp_path / "out"
    proc = warm_python.popen([sys.executable, "-m", "beam_pipelines.generate",
                              *_args(bitext, out, tiny_nmt_models, *args)],
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)

    def compacting():
        work = out / "_work"
        return work.exists() and any((work / r / "groups").exists() for r in os.listdir(work)) or any(
            "part-s" in f for _, _, fs in os.walk(out) for f in fs)
    deadline = time.time() + 300
    while not compacting():
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        assert time.time() < deadline
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    run_dir = next((out / "_work").iterdir())
    done_groups = len(os.listdir(run_dir / "groups")) if (run_dir / "groups").exists() else 0
    assert done_groups < whole["units"]["written"] and not (out / "_manifest.json").exists()
    resumed = run(_args(bitext, out, tiny_nmt_models, *args, "--resume"))
    assert resumed["resumed"] and resumed["units"]["reused_from_earlier_attempt"] == whole["units"]["written"]
    for table in ("paraphrases", "rejects", "dedup"):
        assert _rows(out, table, drop=()) == _rows(tmp_path / "whole", table, drop=())
    listed = {e["path"] for t in resumed["files"].values() for e in t}
    on_disk = set(run_files(out))
    assert on_disk == listed | {"_manifest.json"}                  # the killed attempt's files are gone


@pytest.mark.slow
def test_incremental_runs_and_refreshes_reuse_compacted_files(bitext, tiny_nmt_models, tmp_path, capsys):
    from beam_pipelines.generate import run
    from beam_pipelines.refresh import run as refresh

    # bins of 2 partitions x 10 rows = 20 records: a.tsv's 24 records fill one, so refreshes keep it
    opts = ("--unit_pairs", "3", "--num_output_shards", "2", "--file_rows", "10")
    first = run(_args(bitext / "a.tsv", tmp_path / "r1", tiny_nmt_models, *opts))
    compacted = {e["path"] for e in first["files"]["paraphrases"]}
    assert any("/part-s" in p for p in compacted), compacted       # (a partition with one unit keeps its file)
    second = run(_args(bitext, tmp_path / "r2", tiny_nmt_models, *opts, "--previous", str(tmp_path / "r1")))
    a_bin = next(e["bin"] for e in second["inputs"] if e["input_shard"] == "a.tsv")
    assert a_bin == first["inputs"][0]["bin"] != next(e["bin"] for e in second["inputs"] if e["input_shard"] == "b.tsv")
    reused = {e["path"] for e in second["files"]["paraphrases"] if e["bin"] == a_bin}
    assert reused == {f"../r1/{p}" for p in compacted} and second["previous"]["copied_shards"] == []
    # with a larger target a.tsv's bin is under-full: a refresh would copy its rows, not decode them
    capsys.readouterr()
    plan = run(_args(bitext, tmp_path / "r3", tiny_nmt_models, "--unit_pairs", "3", "--num_output_shards", "2",
                     "--previous", str(tmp_path / "r1"), "--dry_run", "--rate", "1"))
    assert plan["copied_shards"] == ["a.tsv"] and plan["copied_records"] == 24 and plan["shards"] == 1
    assert plan["bins"] == 1 and plan["kept_files_per_table"] == 0 and not (tmp_path / "r3").exists()
    assert "1 of them copied into new files, 24 records" in capsys.readouterr().out
    root = str(tmp_path / "root")
    job = _args(bitext / "a.tsv", "x", tiny_nmt_models, *opts)
    job = job[:2] + job[4:]                                          # without --output
    r1 = refresh(["--root", root, "--", *job])
    job[1] = str(bitext)
    r2 = refresh(["--root", root, "--", *job])
    latest = json.load(open(os.path.join(root, "latest", "_manifest.json")))
    a_bin = next(e["bin"] for e in latest["inputs"] if e["input_shard"] == "a.tsv")
    a_files = {e["path"] for e in latest["files"]["paraphrases"] if e["bin"] == a_bin}
    in_r1 = json.load(open(os.path.join(root, "runs", r1["run_id"], "_manifest.json")))["files"]["paraphrases"]
    assert a_files == {f"../runs/{r1['run_id']}/{e['path']}" for e in in_r1}
    assert any("/part-s" in p for p in a_files)
    assert r2["run_id"] != r1["run_id"]


@pytest.mark.slow
def test_dry_run_writes_nothing(bitext, tiny_nmt_models, tmp_path, capsys):
    from beam_pipelines.generate import run
    from beam_pipelines.refresh import run as refresh

    plan = run(_args(bitext, tmp_path / "out", tiny_nmt_models, "--unit_pairs", "5", "--dry_run"))
    out = capsys.readouterr().out
    assert plan["dry_run"] and plan["shards"] == 2 and plan["records"] == 48 and plan["units"] == 10
    assert plan["rate"] > 0 and plan["estimated_seconds"] > 0
    assert "files the run would write" in out and "estimated decoding time" in out
    assert plan["bins"] == 1 and plan["files_per_table"] == 8               # 48 records: one bin, 8 partitions
    assert os.listdir(tmp_path) == []
    plan = run(_args(bitext, tmp_path / "out", tiny_nmt_models, "--dry_run", "--rate", "2", "--file_rows", "2",
                     "--num_output_shards", "2"))
    assert plan["estimated_seconds"] == pytest.approx(24.0)
    # bins of 4 records: each shard is one, of at most 24 x 5 (kept paraphrases) rows in files of 2
    assert plan["bins"] == 2 and plan["files_per_table"] == 120 and plan["rows_per_file"] == 2
    job = _args(bitext, "x", tiny_nmt_models)
    refreshed = refresh(["--root", str(tmp_path / "root"), "--dry_run", "--", *(job[:2] + job[4:])])
    assert refreshed["dry_run"] and os.listdir(tmp_path) == []


@pytest.mark.slow
def test_a_dask_dry_run_estimates_for_the_clusters_workers(bitext, tiny_nmt_models, dask_cluster, tmp_path, capsys):
    """The scheduler is asked how many workers it has (two here), nothing submitted or written:
    the estimate was one worker's before."""
    from beam_pipelines.generate import run

    plan = run(_args(bitext, tmp_path / "out", tiny_nmt_models, "--dry_run", "--rate", "2", "--runner", "DaskRunner",
                     "--dask_client_address", dask_cluster))
    assert plan["worker_processes"] == 2 and plan["estimated_seconds"] == pytest.approx(12.0)   # 48 / (2 x 2)
    assert "with 2 worker process(es) (the Dask cluster's workers now" in capsys.readouterr().out
    assert not (tmp_path / "out").exists()
