"""Every documented reader reads every committed run whole: the code blocks of docs/contract.md
("Reading a run") are executed against a plain run, an incremental run (--previous into another
directory), a run built on itself in place (--previous OUT --output OUT --overwrite), one built
in place that copies the rows of an under-full bin out of the files it replaces, and a
refresh's ROOT/latest, with pyarrow, DuckDB, polars, pandas, HF datasets and the project's own
helper. Also: publishing never deletes a file its manifest lists."""
import json
import os
import re
import shutil

import pytest

from beam_pipelines.generate import run as generate
from beam_pipelines.refresh import run as refresh
from common import storage
from paracorpus.commit import committed_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow          # every test here reads runs made with the tiny models


def _lines(start, n):
    from tests.toydata import toy_bitext

    return "".join(f"{s}\t{t}\n" for s, t in toy_bitext(400, seed=61)[start:start + n])


def _job(inputs, models):
    return ["--input", ",".join(inputs), "--forward_model", os.path.join(models, "cs-en"),
            "--backward_model", os.path.join(models, "en-cs"), "--num_sets", "1", "--num_samples", "3",
            "--score_threshold", "20", "--dual_xent_threshold", "20", "--unit_pairs", "4", "--device", "cpu",
            # bins of 2 partitions x 4 rows: each 8-record shard fills one, so refreshes keep its files
            "--num_output_shards", "2", "--file_rows", "4"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_nmt_models):
    """{name: run directory}: plain, incremental, in_place, in_place_copied, latest."""
    base = tmp_path_factory.mktemp("readers")
    shards = {}
    for i, name in enumerate("abc"):
        shards[name] = str(base / f"{name}.tsv")
        with open(shards[name], "w") as f:
            f.write(_lines(8 * i, 8))
    ab, abc = [shards["a"], shards["b"]], [shards["a"], shards["b"], shards["c"]]
    out = {"plain": str(base / "runs" / "plain"), "incremental": str(base / "runs" / "incremental"),
           "in_place": str(base / "runs" / "in_place"), "in_place_copied": str(base / "runs" / "in_place_copied")}
    generate([*_job(ab, tiny_nmt_models), "--output", out["plain"]])
    generate([*_job(abc, tiny_nmt_models), "--output", out["incremental"], "--previous", out["plain"]])
    shutil.copytree(out["plain"], out["in_place"])
    generate([*_job(abc, tiny_nmt_models), "--output", out["in_place"], "--previous", out["in_place"], "--overwrite"])
    shutil.copytree(out["plain"], out["in_place_copied"])      # a larger file target: a's and b's bins under-full
    generate([*_job(abc, tiny_nmt_models), "--output", out["in_place_copied"], "--previous", out["in_place_copied"],
              "--overwrite", "--file_rows", "1000"])
    root = str(base / "refresh")
    refresh(["--root", root, "--", *_job(ab, tiny_nmt_models)])
    refresh(["--root", root, "--", *_job(abc, tiny_nmt_models)])
    out["latest"] = os.path.join(root, "latest")
    return out


def _manifest(run_dir):
    with open(os.path.join(run_dir, "_manifest.json")) as f:
        return json.load(f)


def test_incremental_runs_name_reused_files_relative_to_themselves(runs):
    for name in ("incremental", "in_place", "latest"):
        paths = [e["path"] for e in _manifest(runs[name])["files"]["paraphrases"]]
        assert all("root" not in e for e in _manifest(runs[name])["files"]["paraphrases"])
        assert all(not os.path.isabs(p) and "://" not in p for p in paths)
        if name != "in_place":
            assert any(p.startswith("../") for p in paths), (name, paths)     # reused from an earlier run
        for table in ("paraphrases", "rejects", "dedup"):
            for e in _manifest(runs[name])["files"][table]:
                assert os.path.isfile(os.path.join(runs[name], e["path"])), (name, e["path"])


def test_building_on_a_run_in_place_keeps_every_file_it_lists(runs):
    """--previous X --output X --overwrite: the reused shards' files are the run's own now; the
    publish step used to delete them (40 of 79 rows lost)."""
    manifest = _manifest(runs["in_place"])
    assert sorted(manifest["previous"]["reused_shards"]) == ["a.tsv", "b.tsv"]
    for table in ("paraphrases", "rejects", "dedup"):
        files = committed_files(runs["in_place"], table)
        assert all(os.path.isfile(f) for f in files), table
        listed = sum(e["rows"] for e in manifest["files"][table])
        assert (storage.parquet_dataset(files).count_rows() if files else 0) == listed, table
    rows = manifest["counts"]["paraphrase_rows"]
    assert rows == sum(e["rows"] for e in manifest["files"]["paraphrases"]) and rows > 0
    # and it holds what a run into a fresh directory holds
    assert sorted(_pyarrow_ids(runs["in_place"])) == sorted(_pyarrow_ids(runs["incremental"]))


def test_building_in_place_on_files_it_copies_from_keeps_every_row(runs):
    """The unchanged shards' rows are copied out of the files the run then replaces: none lost."""
    manifest = _manifest(runs["in_place_copied"])
    assert manifest["previous"]["copied_shards"] == ["a.tsv", "b.tsv"]
    assert all(not e["path"].startswith("../") for e in manifest["files"]["paraphrases"])
    for table in ("paraphrases", "rejects", "dedup"):
        files = committed_files(runs["in_place_copied"], table)
        listed = sum(e["rows"] for e in manifest["files"][table])
        assert (storage.parquet_dataset(files).count_rows() if files else 0) == listed, table
    assert sorted(_pyarrow_ids(runs["in_place_copied"])) == sorted(_pyarrow_ids(runs["incremental"]))


def _pyarrow_ids(run_dir):
    table = storage.parquet_dataset(committed_files(run_dir, "paraphrases")).to_table()
    return list(zip(table.column("pair_id").to_pylist(), table.column("rank").to_pylist()))


def _reader_blocks():
    """The python code blocks of contract.md's 'Reading a run' section, in order."""
    with open(os.path.join(ROOT, "docs", "contract.md"), encoding="utf-8") as f:
        text = f.read()
    section = text.split("## Reading a run", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def _rows_of(value):
    if hasattr(value, "num_rows"):            # pyarrow Table, HF Dataset
        return value.num_rows
    if hasattr(value, "shape"):               # pandas, polars
        return value.shape[0]
    raise TypeError(type(value))


@pytest.mark.parametrize("name", ["plain", "incremental", "in_place", "in_place_copied", "latest"])
def test_the_documented_readers_read_every_run_whole(runs, name, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", os.path.join(os.path.dirname(runs["plain"]), "hf-home"))
    blocks = _reader_blocks()
    assert len(blocks) == 7, "files list, pyarrow, DuckDB, polars, pandas, HF datasets, committed_files"
    listing, readers = blocks[0], blocks[1:]
    assert 'OUT = "' in listing
    manifest = _manifest(runs[name])
    expected = sum(e["rows"] for e in manifest["files"]["paraphrases"])
    assert expected == manifest["counts"]["paraphrase_rows"] > 0
    pairs = manifest["counts"]["pairs_with_paraphrases"]
    seen = {}
    for block in readers:
        scope: dict = {}
        exec(re.sub(r'OUT = "[^"]*"', f"OUT = {runs[name]!r}", listing), scope)        # noqa: S102
        before = set(scope)
        exec(block, scope)                                                              # noqa: S102
        made = [k for k in scope if k not in before or k == "files"]
        result = scope[[k for k in made if k != "files"][-1]]
        reader = block.split("\n", 1)[0]
        seen[reader] = _rows_of(result)
        columns = list(result.column_names) if hasattr(result, "column_names") else list(result.columns)
        assert "lang_pair" in columns and "shard" in columns, (reader, columns)
        if "pandas" in reader:
            assert str(result["lang_pair"].dtype) != "category"
    assert seen.pop("import duckdb") == pairs                  # its example keeps rank 1: one row per pair
    assert set(seen.values()) == {expected}, seen


def test_latest_is_a_run_directory_any_reader_opens(runs):
    latest = runs["latest"]
    assert os.path.isdir(latest) and not os.path.islink(latest)
    pointer = json.load(open(os.path.join(os.path.dirname(latest), "latest.json")))
    run_dir = os.path.join(os.path.dirname(latest), "runs", pointer["run_id"])
    assert sorted(committed_files(latest, "paraphrases")) == sorted(committed_files(run_dir, "paraphrases"))
    assert _manifest(latest)["counts"] == _manifest(run_dir)["counts"]


def test_pandas_reads_the_files_a_manifest_lists(runs):
    """pandas infers Hive partitions from key=value directory names and used to fail with
    'lang_pair string vs dictionary' beside the column stored in the files."""
    import pandas as pd

    for name in ("plain", "latest"):
        frame = pd.read_parquet(committed_files(runs[name], "paraphrases"))
        assert len(frame) == _manifest(runs[name])["counts"]["paraphrase_rows"]
        assert set(frame["lang_pair"]) == {"cs-en"} and str(frame["lang_pair"].dtype) != "category"
