"""How manifests name their files (contract 3): every path opens from the manifest's directory or
is a full URL; publishing removes only what the manifest does not list, however a listed file is
named; contract-2 manifests (with "root") are still read."""
import os

from paracorpus.commit import entry_path, file_location, publish
from paracorpus.schema import table_relative


def _touch(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").close()
    return str(path)


def test_paths_are_relative_to_the_manifest_on_a_disk_and_urls_elsewhere(tmp_path):
    runs = tmp_path / "runs"
    r2 = str(runs / "r2")
    assert entry_path(r2, str(runs / "r2" / "paraphrases" / "x.parquet")) == "paraphrases/x.parquet"
    assert entry_path(r2, str(runs / "r1" / "paraphrases" / "x.parquet")) == "../r1/paraphrases/x.parquet"
    assert entry_path("s3://b/runs/r2", "s3://b/runs/r2/paraphrases/x.parquet") == "paraphrases/x.parquet"
    # a bucket has no '..': a file of another run is named by its URL
    assert entry_path("s3://b/runs/r2", "s3://b/runs/r1/paraphrases/x.parquet") == "s3://b/runs/r1/paraphrases/x.parquet"
    assert entry_path(r2, "gs://c/x.parquet") == "gs://c/x.parquet"


def test_file_location_reads_every_form(tmp_path):
    runs = tmp_path / "runs"
    r2 = str(runs / "r2")
    want = os.path.realpath(runs / "r1" / "paraphrases" / "x.parquet")
    assert file_location(r2, {"path": "../r1/paraphrases/x.parquet"}) == want
    assert file_location(r2, {"path": want}) == want
    assert file_location("s3://b/runs/r2", {"path": "../r1/p/x"}) == "s3://b/runs/r1/p/x"
    assert file_location("s3://b/runs/r2", {"path": "gs://c/x"}) == "gs://c/x"
    # contract 2: a sibling run's name, or a full path, in "root"
    assert file_location(r2, {"path": "paraphrases/x.parquet", "root": "r1"}) == want
    assert file_location(r2, {"path": "paraphrases/x.parquet", "root": str(runs / "r1")}) == want


def test_a_path_climbing_out_of_a_symlinked_directory_goes_where_the_kernel_goes(tmp_path):
    """A refresh root of an earlier version has latest -> runs/r2 as a symlink: '../r1' from there
    is runs/r1, not ROOT/r1."""
    target = _touch(tmp_path / "runs" / "r1" / "paraphrases" / "x.parquet")
    (tmp_path / "runs" / "r2").mkdir()
    os.symlink("runs/r2", tmp_path / "latest")
    assert file_location(str(tmp_path / "latest"), {"path": "../r1/paraphrases/x.parquet"}) == os.path.realpath(target)


def test_publish_keeps_every_listed_file_however_it_is_named(tmp_path):
    out = tmp_path / "out"
    own = _touch(out / "paraphrases" / "cs-en" / "00000" / "part-u1-new.parquet")
    reused = _touch(out / "paraphrases" / "cs-en" / "00001" / "part-u0-old.parquet")
    stale = _touch(out / "paraphrases" / "cs-en" / "00001" / "part-u0-dead.parquet")
    manifest = {"files": {"paraphrases": [
        {"path": "paraphrases/cs-en/00000/part-u1-new.parquet"},
        # what an in-place incremental run wrote for a reused file: a path that climbs out and back
        {"path": "../out/paraphrases/cs-en/00001/part-u0-old.parquet"}]}}
    removed = publish(str(out), "_manifest.json", manifest, ("paraphrases",))
    assert removed == ["paraphrases/cs-en/00001/part-u0-dead.parquet"]
    assert os.path.exists(own) and os.path.exists(reused) and not os.path.exists(stale)


def test_table_relative_finds_the_part_below_the_table():
    assert table_relative("paraphrases/cs-en/00001/p.parquet", "paraphrases") == "cs-en/00001/p.parquet"
    assert table_relative("../r1/paraphrases/cs-en/00001/p.parquet", "paraphrases") == "cs-en/00001/p.parquet"
    assert table_relative("s3://b/paraphrases/r/paraphrases/cs-en/00001/p.parquet", "paraphrases") == \
        "cs-en/00001/p.parquet"
