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
    record = compact_group(out, work, "cs-en", units, FileTarget(rows=5))
    files = record["files"]["paraphrases"]
    assert [f["rows"] for f in files] == [5, 5, 4]
    assert all(f["path"].startswith("paraphrases/cs-en/00003/part-s") and f["input_shard"] == "a.tsv" for f in files)
    got = pa.concat_tables(pq.read_table(os.path.join(out, f["path"])) for f in files).column("pair_id").to_pylist()
    want = [f"u{u}r{i}" for u, rows in ((2, 7), (5, 4), (9, 3)) for i in range(rows)]     # units in order
    assert got == want
    # rows of several units make one row group, not one each
    assert [pq.ParquetFile(os.path.join(out, f["path"])).metadata.num_row_groups for f in files] == [1, 1, 1]
    assert record["units"] == [2, 5, 9] and record["counts"]["paraphrase_rows"] == 14
    assert record["per_worker"] == {"w1": 3} and record["unit_files"] == 3
    assert os.path.isfile(group_record_path(work, "a.tsv", 3))
    # the same group again (a resumed run): its record is taken, nothing rewritten
    again = compact_group(out, work, "cs-en", units, FileTarget(rows=5))
    assert again["files"] == record["files"] and again["reused_group"]
    # one unit's file is published as it is
    single = compact_group(out, str(tmp_path / "w2"), "cs-en", [_unit(out, 11, 4, partition=1)], FileTarget())
    assert single["files"]["paraphrases"][0]["path"].endswith("part-u000011-x.parquet")


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
    on_disk = sorted(os.path.relpath(os.path.join(d, f), tmp_path / "many")
                     for d, _, fs in os.walk(tmp_path / "many") for f in fs)
    assert on_disk == sorted([e["path"] for t in many["files"].values() for e in t] + ["_manifest.json"])
    assert many["counts"] == one["counts"]


@pytest.mark.slow
def test_a_kill_during_compaction_then_resume_gives_the_uninterrupted_rows(bitext, tiny_nmt_models, tmp_path):
    from beam_pipelines.generate import run

    # one-row files: compaction writes hundreds of files, long enough to be killed half way
    args = ("--unit_pairs", "3", "--num_output_shards", "4", "--file_rows", "1")
    whole = run(_args(bitext, tmp_path / "whole", tiny_nmt_models, *args))
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "beam_pipelines.generate", *_args(bitext, out, tiny_nmt_models, *args)],
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
    on_disk = {os.path.relpath(os.path.join(d, f), out) for d, _, fs in os.walk(out) for f in fs}
    assert on_disk == listed | {"_manifest.json"}                  # the killed attempt's files are gone


@pytest.mark.slow
def test_incremental_runs_and_refreshes_reuse_compacted_files(bitext, tiny_nmt_models, tmp_path):
    from beam_pipelines.generate import run
    from beam_pipelines.refresh import run as refresh

    first = run(_args(bitext / "a.tsv", tmp_path / "r1", tiny_nmt_models, "--unit_pairs", "3", "--num_output_shards", "2"))
    compacted = {e["path"] for e in first["files"]["paraphrases"]}
    assert any("/part-s" in p for p in compacted), compacted       # (a partition with one unit keeps its file)
    second = run(_args(bitext, tmp_path / "r2", tiny_nmt_models, "--unit_pairs", "3", "--num_output_shards", "2",
                       "--previous", str(tmp_path / "r1")))
    reused = {e["path"] for e in second["files"]["paraphrases"] if e["input_shard"] == "a.tsv"}
    assert reused == {f"../r1/{p}" for p in compacted}
    root = str(tmp_path / "root")
    job = _args(bitext / "a.tsv", "x", tiny_nmt_models, "--unit_pairs", "3", "--num_output_shards", "2")
    job = job[:2] + job[4:]                                          # without --output
    r1 = refresh(["--root", root, "--", *job])
    job[1] = str(bitext)
    r2 = refresh(["--root", root, "--", *job])
    latest = json.load(open(os.path.join(root, "latest", "_manifest.json")))
    a_files = {e["path"] for e in latest["files"]["paraphrases"] if e["input_shard"] == "a.tsv"}
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
    assert "files the run would publish" in out and "estimated decoding time" in out
    assert "note: files would hold up to about" in out and plan["rows_per_file"] < 1000   # 48 records
    assert os.listdir(tmp_path) == []
    plan = run(_args(bitext, tmp_path / "out", tiny_nmt_models, "--dry_run", "--rate", "2", "--file_rows", "50"))
    assert plan["estimated_seconds"] == pytest.approx(24.0)
    assert "note: files would hold" not in capsys.readouterr().out          # files near a 50-row target
    job = _args(bitext, "x", tiny_nmt_models)
    refreshed = refresh(["--root", str(tmp_path / "root"), "--dry_run", "--", *(job[:2] + job[4:])])
    assert refreshed["dry_run"] and os.listdir(tmp_path) == []
