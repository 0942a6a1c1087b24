"""The generation job end to end, on DirectRunner (both modes) and a real dask.distributed cluster."""
import json
import logging
import os
import re
import shutil
import subprocess
import sys

import pytest

from beam_pipelines.generate import run
from beam_pipelines.options import worker_threads
from common.cli import UsageError
from common import storage
from tests.claims import run_files
from paracorpus.commit import committed_files
from paracorpus.schema import PARAPHRASE_SCHEMA, REJECT_SCHEMA

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTILE = {  # input index -> expected reject reason
    40: "bad_utf8", 41: "missing_column", 42: "empty_src", 43: "overlong_line", 44: "duplicate",
    45: "not_encodable_tgt",
}


@pytest.fixture(scope="module")
def bitext(tmp_path_factory):
    from tests.toydata import toy_bitext

    pairs = toy_bitext(400, seed=9)[:40]
    lines = [f"{s}\t{t}".encode() for s, t in pairs]
    lines += [b"\xff\xfe broken\tA dog .", b"no tab in this line", "\tA lonely reference .".encode(),
              ("x" * 100_000 + "\tlong").encode(), lines[0], "pes\tдобрый день".encode()]
    path = tmp_path_factory.mktemp("in") / "toy.tsv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return str(path)


def _args(bitext, out, models, *extra):
    return ["--input", bitext, "--output", str(out), "--src_lang", "cs", "--tgt_lang", "en",
            "--forward_model", os.path.join(models, "cs-en"),
            "--backward_model", os.path.join(models, "en-cs"),
            "--preset", "parabank2-cpu", "--num_sets", "2", "--num_samples", "6",
            # Tiny models are unsure of themselves: thresholds from the paper would reject all.
            "--score_threshold", "20", "--dual_xent_threshold", "20",
            "--num_output_shards", "3", "--batch_pairs", "8", "--device", "cpu", "--overwrite", *extra]


def _rows(out, table="paraphrases"):
    """The rows of TABLE that the run's manifest lists."""
    files = committed_files(str(out), table)
    if not files:
        return []
    t = storage.parquet_dataset(files).to_table()
    return sorted(t.to_pylist(), key=lambda r: (r["pair_id"], r.get("rank") or r.get("input_index")))


@pytest.fixture(scope="module")
def direct_run(bitext, tiny_nmt_models, tmp_path_factory):
    out = tmp_path_factory.mktemp("direct")
    manifest = run(_args(bitext, out, tiny_nmt_models, "--runner", "DirectRunner"))
    return out, manifest


@pytest.mark.slow
def test_counts_reconcile_and_hostile_records_are_rejects(direct_run):
    out, manifest = direct_run
    counts = manifest["counts"]
    assert counts["records_read"] == 46
    assert counts["reconciled"] and counts["pairs_with_paraphrases"] + counts["rejected"] == 46
    rejects = {r["input_index"]: r for r in _rows(out, "rejects")}
    for index, reason in HOSTILE.items():
        assert rejects[index]["reason"] == reason, rejects.get(index)
    assert rejects[43]["source"] is not None and len(rejects[43]["source"]) <= 1000
    # Every record is accounted for exactly once: one reject row or paraphrase rows, never both.
    reject_rows = _rows(out, "rejects")
    assert len(reject_rows) == len(rejects) == counts["rejected"]
    kept_ids = {r["pair_id"] for r in _rows(out)}
    assert len(kept_ids) == counts["pairs_with_paraphrases"]
    assert not kept_ids & {r["pair_id"] for r in reject_rows}
    assert counts["pairs_with_paraphrases"] > 20     # most toy pairs yield paraphrases


@pytest.mark.slow
def test_parquet_matches_the_contract(direct_run):
    out, _ = direct_run
    manifest = json.load(open(os.path.join(out, "_manifest.json")))
    for table, schema in (("paraphrases", PARAPHRASE_SCHEMA), ("rejects", REJECT_SCHEMA)):
        files = committed_files(str(out), table)
        assert files and all(os.path.exists(f) for f in files)
        dataset = storage.parquet_dataset(files)
        assert dataset.schema.names == schema.names                  # partition columns stored too
        for field in schema:
            assert dataset.schema.field(field.name).type == field.type
        rows = dataset.to_table().to_pylist()
        assert {r["lang_pair"] for r in rows} == {"cs-en"}
        for f, entry in zip(files, manifest["files"][table]):       # the directory says the same
            _table, lang_pair, shard, _name = entry["path"].split("/")
            assert (lang_pair, int(shard)) == ("cs-en", storage.parquet_file(f).read().column("shard")[0].as_py())
            assert entry["rows"] == storage.parquet_file(f).metadata.num_rows
    # every file in the table directories is listed, nothing is left of attempts or bookkeeping
    on_disk = run_files(out)
    listed = sorted(e["path"] for t in manifest["files"].values() for e in t)
    assert on_disk == sorted(listed + ["_manifest.json"])
    import hashlib
    shard = manifest["inputs"][0]
    with open(shard["paths"][0], "rb") as f:
        assert shard["sha256"] == [hashlib.sha256(f.read()).hexdigest()]
    assert manifest["models"]["forward"]["fingerprint"] and manifest["models"]["forward"]["sha256"]["model.pt"]


@pytest.mark.slow
def test_ranking_clusters_and_constraints(direct_run):
    out, manifest = direct_run
    by_pair = {}
    for r in _rows(out):
        by_pair.setdefault(r["pair_id"], []).append(r)
    assert by_pair
    for rows in by_pair.values():
        assert 1 <= len(rows) <= manifest["config"]["keep"]
        assert [r["rank"] for r in rows] == list(range(1, len(rows) + 1))
        scores = [r["combined_score"] for r in rows]
        assert scores == sorted(scores)
        assert all(r["cluster_id"] != 0 for r in rows)           # reference cluster never outputs
        assert len({r["cluster_id"] for r in rows}) == len(rows)  # one per cluster
        assert len({r["paraphrase"] for r in rows}) == len(rows)
        for r in rows:
            words = {w.strip(".,!?;:\"'").lower() for w in r["paraphrase"].split()}
            assert not words & {w.lower() for w in r["constraint_set"]}, r
            assert r["num_surviving"] <= r["num_sampled"] <= 2 * 6
            assert r["backward_nll"] is not None and r["mode"] == "sample"


@pytest.mark.slow
def test_same_seed_same_rows_other_seed_other_rows(direct_run, bitext, tiny_nmt_models, tmp_path):
    out, _ = direct_run
    again = run(_args(bitext, tmp_path / "again", tiny_nmt_models))
    _same_rows(_rows(tmp_path / "again"), _rows(out))
    _same_rows(_rows(tmp_path / "again", "rejects"), _rows(out, "rejects"))
    assert again["config_hash"] == json.load(open(os.path.join(out, "_manifest.json")))["config_hash"]
    run(_args(bitext, tmp_path / "seed2", tiny_nmt_models, "--seed", "2"))
    assert _text(_rows(tmp_path / "seed2")) != _text(_rows(out))
    assert again["config_hash"] != json.load(open(tmp_path / "seed2" / "_manifest.json"))["config_hash"]


def _text(rows):
    return [(r["pair_id"], r["rank"], r["paraphrase"], r["cluster_id"], r["shard"]) for r in rows]


_FLOATS = ("forward_nll", "backward_nll", "combined_score")


def _same_rows(a, b):
    """Equal rows; scores may differ in the last float bits with batch composition."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert {k: v for k, v in x.items() if k not in _FLOATS} == {k: v for k, v in y.items() if k not in _FLOATS}
        for k in _FLOATS:
            assert (x.get(k) is None) == (y.get(k) is None), k
            if k in x and x[k] is not None:
                assert x[k] == pytest.approx(y[k], abs=1e-4)


@pytest.mark.slow
def test_direct_multiprocessing_gives_the_same_rows(direct_run, bitext, tiny_nmt_models, tmp_path):
    out, _ = direct_run
    manifest = run(_args(bitext, tmp_path / "mp", tiny_nmt_models, "--runner", "DirectRunner",
                         "--direct_running_mode", "multi_processing", "--direct_num_workers", "2"))
    assert manifest["torch_threads_per_worker"] == max(1, (os.cpu_count() or 1) // 2)
    _same_rows(_rows(tmp_path / "mp"), _rows(out))
    _same_rows(_rows(tmp_path / "mp", "rejects"), _rows(out, "rejects"))


@pytest.mark.slow
def test_dask_cluster_gives_the_same_rows(direct_run, bitext, tiny_nmt_models, tmp_path, dask_cluster):
    out, _ = direct_run
    manifest = run(_args(bitext, tmp_path / "dask", tiny_nmt_models, "--runner", "DaskRunner",
                         "--dask_client_address", dask_cluster, "--dask_npartitions", "2"))
    assert manifest["runner"] == "DaskRunner" and manifest["counts"]["reconciled"]
    _same_rows(_rows(tmp_path / "dask"), _rows(out))
    _same_rows(_rows(tmp_path / "dask", "rejects"), _rows(out, "rejects"))


@pytest.mark.slow
def test_beam_mode_paranmt_preset(bitext, tiny_nmt_models, tmp_path):
    args = _args(bitext, tmp_path / "beam", tiny_nmt_models)
    args[args.index("parabank2-cpu")] = "paranmt"
    manifest = run(args + ["--beam", "4"])
    rows = _rows(tmp_path / "beam")
    assert manifest["config"]["mode"] == "beam" and rows
    assert all(r["rank"] == 1 and r["constraint_set"] == [] and r["mode"] == "beam" for r in rows)
    assert len({r["pair_id"] for r in rows}) == len(rows)
    assert manifest["counts"]["reconciled"]


@pytest.mark.slow
def test_cli_help_and_clear_errors(tmp_path, bitext, tiny_nmt_models):
    done = subprocess.run([sys.executable, "-m", "beam_pipelines.generate", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "--forward_model" in done.stdout and "parabank2" in done.stdout
    for bad in (_args(bitext, tmp_path / "x", str(tmp_path)),                # no model.pt there
                _args(str(tmp_path / "missing.tsv"), tmp_path / "y", tiny_nmt_models),
                _args(bitext, tmp_path / "z", tiny_nmt_models, "--num_samples", "0")):
        with pytest.raises((UsageError, FileNotFoundError)):
            run(bad)
    assert not (tmp_path / "z" / "paraphrases").exists()
    out = tmp_path / "existing"
    out.mkdir()
    (out / "_manifest.json").write_text("{}")
    args = _args(bitext, out, tiny_nmt_models)
    args.remove("--overwrite")
    with pytest.raises(UsageError, match="--overwrite"):
        run(args)
    shutil.rmtree(out)


def test_worker_processes_split_the_cores():
    # Two worker processes with two threads each on two cores decode several times slower than
    # with one each (OpenMP threads wait on each other), so the DirectRunner's workers split them.
    assert worker_threads(0, "DirectRunner", "multi_processing", 2, 2) == 1
    assert worker_threads(0, "DirectRunner", "multi_processing", 2, 16) == 8
    assert worker_threads(0, "DirectRunner", "multi_processing", 0, 16) == 1      # 0 = one per core
    assert worker_threads(0, "DirectRunner", "multi_threading", 3, 2) == 1
    assert worker_threads(0, "direct", "multi_processing", 2, 8) == 4                # Beam's short name
    assert worker_threads(0, "DirectRunner", "in_memory", 1, 16) is None            # torch's default
    assert worker_threads(0, "DaskRunner", None, None, 16) is None                  # dask sets OMP_NUM_THREADS
    assert worker_threads(3, "DaskRunner", None, None, 16) == 3
    with pytest.raises(ValueError, match="torch_threads"):
        worker_threads(-1, "DirectRunner", "in_memory", 1, 2)


@pytest.mark.slow
def test_dask_workers_share_the_decoding_of_one_output_shard(bitext, tiny_nmt_models, tmp_path, dask_cluster,
                                                             caplog, monkeypatch):
    """Decoding parallelism does not depend on the number of output files: with one output shard,
    both Dask worker processes decode work units (the manifest says which decoded how many). The
    driver says how far the workers got, from their unit records (paracorpus/run_progress.py)."""
    args = _args(bitext, tmp_path / "one", tiny_nmt_models, "--runner", "DaskRunner",
                 "--dask_client_address", dask_cluster, "--dask_npartitions", "4", "--unit_pairs", "4")
    args[args.index("--num_output_shards") + 1] = "1"
    monkeypatch.setenv("PARAGEN_PROGRESS_SECONDS", "0.5")
    with caplog.at_level(logging.INFO, logger="paragen.progress"):
        manifest = run(args)
    lines = [r.getMessage() for r in caplog.records if r.name == "paragen.progress" and
             r.getMessage().startswith("progress: ")]
    assert lines and re.match(r"progress: 12 of 12 units \(100%\), \d+ of ~\d+ pairs; [\d.]+ pairs/s over the last "
                              r"(\d+s|\d+m\d\ds); workers: 2$", lines[-1]), lines[-3:]
    per_worker = manifest["units"]["per_worker"]
    assert manifest["units"]["planned"] == 12 and sum(per_worker.values()) == manifest["units"]["written"]
    # both decode (how evenly depends on Dask's scheduling and the machine's load: 1 vs 11 units
    # was seen on a busy machine)
    assert len(per_worker) == 2 and min(per_worker.values()) >= 1, per_worker
    assert {e["path"].split("/")[2] for e in manifest["files"]["paraphrases"]} == {"00000"}
