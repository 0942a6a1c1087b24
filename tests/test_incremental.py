"""Incremental generation (--previous) on a local disk and on a real S3 bucket: A+B, then A+B+C
(only C decoded, a duplicate of an A pair inside C rejected as a duplicate of the earlier run's
pair, rows equal to a full run on A+B+C), then A+B+C again (a no-op), then B changed (only B
decoded), then B removed; once with bins the refreshes copy from, once with full bins they keep."""
import os

import pytest

from beam_pipelines.generate import run
from common import storage
from paracorpus.commit import committed_files
from paracorpus.schema import CONTRACT_VERSION
from tests.object_stores import s3_store  # noqa: F401  (fixture)

_FLOATS = ("forward_nll", "backward_nll", "combined_score")


def _lines(start, n, seed=41):
    from tests.toydata import toy_bitext

    return [f"{s}\t{t}\n" for s, t in toy_bitext(400, seed=seed)[start:start + n]]


def _rows(run_dir, table="paraphrases"):
    files = committed_files(run_dir, table)
    rows = storage.parquet_dataset(files).to_table().to_pylist() if files else []
    return sorted(rows, key=lambda r: (r["input_shard"], r["input_index"], r.get("rank") or 0))


def _held_by(entry) -> str:
    """The run (a sibling in runs/) whose directory holds a manifest ENTRY's file: a path into
    another run is '../<run>/...' on a disk and the file's URL in a bucket."""
    path = entry["path"]
    if path.startswith("../"):
        return path.split("/")[1]
    if "://" in path:
        return path.split("/runs/", 1)[1].split("/", 1)[0]
    return "self"


def _strip(rows):
    return [{k: (round(v, 4) if k in _FLOATS and v is not None else v) for k, v in r.items() if k != "config_hash"}
            for r in rows]


@pytest.fixture(params=["local", "s3"])
def place(request, tmp_path, monkeypatch, tiny_nmt_models):
    """(input directory, runs directory, models) on a local disk or in a bucket."""
    monkeypatch.setenv("PARAGEN_CACHE", str(tmp_path / "cache"))
    if request.param == "local":
        return str(tmp_path / "in"), str(tmp_path / "runs"), tiny_nmt_models
    store = request.getfixturevalue("s3_store")
    for k, v in store.env.items():
        monkeypatch.setenv(k, v)
    bucket = f"s3://{store.make_bucket()}"
    for name in ("cs-en", "en-cs"):
        for f in os.listdir(os.path.join(tiny_nmt_models, name)):
            storage.copy_file(os.path.join(tiny_nmt_models, name, f), f"{bucket}/models/{name}/{f}")
    return f"{bucket}/in", f"{bucket}/runs", f"{bucket}/models"


def _args(inp, out, models, *extra):
    return ["--input", inp, "--output", out, "--forward_model", storage.join(models, "cs-en"),
            "--backward_model", storage.join(models, "en-cs"), "--num_sets", "1", "--num_samples", "3",
            "--score_threshold", "20", "--dual_xent_threshold", "20", "--unit_pairs", "4", "--device", "cpu", *extra]


def _write(inp, name, lines):
    storage.write_bytes(storage.join(inp, name), "".join(lines).encode())


def _decoded(manifest):
    return sorted(e["input_shard"] for e in manifest["inputs"] if e["decoded_in"] == manifest["run_id"])


def _held(manifest, shard):
    """The runs holding the files of the bin SHARD's rows are in."""
    bin_ = next(e["bin"] for e in manifest["inputs"] if e["input_shard"] == shard)
    return {_held_by(f) for f in manifest["files"]["paraphrases"] if f["bin"] == bin_}


def _refresh_sequence(inp, runs, models, tmp_path, *target):
    """The runs r1..r5 of the module doc with TARGET (file target options); checks what does not
    depend on the bins; returns the manifests."""
    a, b, c = _lines(0, 12), _lines(12, 12), _lines(24, 10) + [_lines(0, 12)[3]]    # C repeats a pair of A
    _write(inp, "a.tsv", a)
    _write(inp, "b.tsv", b)
    r1 = run(_args(inp, f"{runs}/r1", models, *target))
    assert _decoded(r1) == ["a.tsv", "b.tsv"] and r1["previous"] is None

    _write(inp, "c.tsv", c)
    r2 = run(_args(inp, f"{runs}/r2", models, *target, "--previous", f"{runs}/r1"))
    assert _decoded(r2) == ["c.tsv"] and r2["previous"]["reused_shards"] == ["a.tsv", "b.tsv"]
    assert r2["units"]["written"] == 3                                    # C's units only
    dup = [r for r in _rows(f"{runs}/r2", "rejects") if r["reason"] == "duplicate"]
    assert [(r["input_shard"], r["input_index"]) for r in dup] == [("c.tsv", 10)]
    assert dup[0]["detail"].endswith("(a.tsv:3)")
    # the same rows as a full run on A+B+C (which also keeps A's copy and rejects C's)
    full = run(_args(inp, str(tmp_path / "full"), models, *target))
    for table in ("paraphrases", "rejects", "dedup"):
        assert _strip(_rows(f"{runs}/r2", table)) == _strip(_rows(str(tmp_path / "full"), table))
    assert r2["counts"] == full["counts"]

    noop = run(_args(inp, f"{runs}/r3", models, *target, "--previous", f"{runs}/r2"))
    assert noop["noop"] and not storage.exists(f"{runs}/r3")

    _write(inp, "b.tsv", b[:6] + _lines(100, 4))                          # B changed
    r4 = run(_args(inp, f"{runs}/r4", models, *target, "--previous", f"{runs}/r2"))
    assert _decoded(r4) == ["b.tsv"] and r4["counts"]["records_read_per_shard"]["b.tsv"] == 10
    assert {(r["input_shard"], r["input_index"]) for r in _rows(f"{runs}/r4", "dedup") if r["input_shard"] == "b.tsv"} \
        == {("b.tsv", i) for i in range(10)}                              # B's old rows are gone

    storage.delete(storage.join(inp, "b.tsv"))                            # B removed
    r5 = run(_args(inp, f"{runs}/r5", models, *target, "--previous", f"{runs}/r4"))
    assert _decoded(r5) == [] and r5["previous"]["removed_shards"] == ["b.tsv"]
    for table in ("paraphrases", "rejects", "dedup"):
        assert {r["input_shard"] for r in _rows(f"{runs}/r5", table)} <= {"a.tsv", "c.tsv"}
        assert _rows(f"{runs}/r5", table) == [r for r in _rows(f"{runs}/r4", table) if r["input_shard"] != "b.tsv"]
    assert r5["counts"]["reconciled"] and "b.tsv" not in r5["counts"]["records_read_per_shard"]
    return r1, r2, r4, r5


@pytest.mark.slow
def test_refresh_sequence_decodes_only_what_changed(place, tmp_path):
    """With the default file target every shard here fits one under-full bin, so each refresh
    copies the unchanged shards' rows into its new files (never decoding them again)."""
    inp, runs, models = place
    _r1, r2, r4, r5 = _refresh_sequence(inp, runs, models, tmp_path)
    assert r2["previous"]["copied_shards"] == ["a.tsv", "b.tsv"] and _held(r2, "a.tsv") == {"self"}
    assert r4["previous"]["copied_shards"] == ["a.tsv", "c.tsv"] and _held(r4, "c.tsv") == {"self"}
    assert r5["previous"]["copied_shards"] == ["a.tsv", "c.tsv"]
    assert len({e["bin"] for e in r5["inputs"]}) == 1


@pytest.mark.slow
def test_full_bins_are_kept_by_reference(tmp_path, tiny_nmt_models):
    """With a file target each shard fills (--file_rows 1: bins of 8 records), a refresh lists
    the unchanged shards' files where an earlier run wrote them, and copies nothing."""
    inp, runs = str(tmp_path / "in"), str(tmp_path / "runs")
    _r1, r2, r4, r5 = _refresh_sequence(inp, runs, tiny_nmt_models, tmp_path, "--file_rows", "1")
    assert r2["previous"]["copied_shards"] == [] and _held(r2, "a.tsv") == _held(r2, "b.tsv") == {"r1"}
    assert _held(r4, "a.tsv") == {"r1"} and _held(r4, "c.tsv") == {"r2"} and _held(r4, "b.tsv") == {"self"}
    assert r5["previous"]["copied_shards"] == [] and _held(r5, "c.tsv") == {"r2"}
    assert len({e["bin"] for e in r5["inputs"]}) == 2


def _as_contract_3(run_dir):
    """Rewrite the run RUN_DIR (one input shard per bin) as the job wrote runs before bins
    (contract 3): file entries name their input shard, no bins, the files' metadata says 3."""
    import json

    import pyarrow.parquet as pq

    path = os.path.join(run_dir, "_manifest.json")
    manifest = json.load(open(path))
    shard_of = {e["bin"]: e["input_shard"] for e in manifest["inputs"]}
    assert len(shard_of) == len(manifest["inputs"])                      # one shard a bin
    for table, entries in manifest["files"].items():
        for f in entries:
            data = pq.read_table(os.path.join(run_dir, f["path"]))
            pq.write_table(data.replace_schema_metadata({**data.schema.metadata, b"contract_version": b"3"}),
                           os.path.join(run_dir, f["path"]))
            f["bytes"] = os.path.getsize(os.path.join(run_dir, f["path"]))
            f["input_shard"] = shard_of[f.pop("bin")]
            del f["shard"]
    for e in manifest["inputs"]:
        del e["bin"]
    manifest["contract_version"] = 3
    json.dump(manifest, open(path, "w"))


@pytest.mark.slow
def test_a_run_written_before_bins_is_built_on_not_decoded_again(tmp_path, tiny_nmt_models):
    """An upgrade: the first refresh after it copies the unchanged shards of a contract 3 run
    into bins, and decodes only what changed."""
    import pyarrow.parquet as pq

    inp, runs = str(tmp_path / "in"), str(tmp_path / "runs")
    _write(inp, "a.tsv", _lines(0, 12))
    _write(inp, "b.tsv", _lines(12, 12))
    run(_args(inp, f"{runs}/r1", tiny_nmt_models, "--file_rows", "1"))        # bins of 8 records: one a shard
    _as_contract_3(f"{runs}/r1")
    _write(inp, "c.tsv", _lines(24, 10))
    r2 = run(_args(inp, f"{runs}/r2", tiny_nmt_models, "--previous", f"{runs}/r1"))
    assert _decoded(r2) == ["c.tsv"] and r2["previous"]["copied_shards"] == ["a.tsv", "b.tsv"]
    assert r2["previous"]["why_nothing_reused"] is None and _held(r2, "a.tsv") == {"self"}
    full = run(_args(inp, str(tmp_path / "full"), tiny_nmt_models))
    for table in ("paraphrases", "rejects", "dedup"):
        assert _strip(_rows(f"{runs}/r2", table)) == _strip(_rows(str(tmp_path / "full"), table))
        for f in committed_files(f"{runs}/r2", table):
            assert pq.read_schema(f).metadata[b"contract_version"] == str(CONTRACT_VERSION).encode()
    assert r2["counts"] == full["counts"]


@pytest.mark.slow
def test_a_changed_config_reuses_nothing(tmp_path, tiny_nmt_models):
    inp = str(tmp_path / "in")
    _write(inp, "a.tsv", _lines(0, 6))
    run(_args(inp, str(tmp_path / "r1"), tiny_nmt_models))
    r2 = run(_args(inp, str(tmp_path / "r2"), tiny_nmt_models, "--previous", str(tmp_path / "r1"), "--seed", "2"))
    assert _decoded(r2) == ["a.tsv"] and "the config changed" in r2["previous"]["why_nothing_reused"]
