import json
import os

import pytest

from common.atomic import copy_file, replacing, write_json


def test_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "model.pt"
    path.write_text("old")
    with pytest.raises(RuntimeError):
        with replacing(str(path)) as tmp:
            with open(tmp, "w") as f:
                f.write("half a mod")
            assert path.read_text() == "old"              # not visible before the rename
            raise RuntimeError("crash mid-write")
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["model.pt"]


def test_successful_write_replaces_and_creates_directories(tmp_path):
    path = tmp_path / "a" / "b" / "report.json"
    write_json(str(path), {"x": 1})
    write_json(str(path), {"x": 2})
    assert json.loads(path.read_text()) == {"x": 2}
    assert os.listdir(path.parent) == ["report.json"]


def test_temporary_name_is_hidden_from_dataset_discovery(tmp_path):
    with replacing(str(tmp_path / "part-00000.parquet")) as tmp:
        assert os.path.basename(tmp).startswith(".") and os.path.dirname(tmp) == str(tmp_path)
        open(tmp, "w").close()


def test_copy_file(tmp_path):
    (tmp_path / "src").write_bytes(b"\x00\x01weights")
    copy_file(str(tmp_path / "src"), str(tmp_path / "out" / "dst"))
    assert (tmp_path / "out" / "dst").read_bytes() == b"\x00\x01weights"
