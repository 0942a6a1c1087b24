"""Round trips through pyarrow.fs against the real S3 (moto) and GCS (fake-gcs-server) servers of
tests/object_stores.py. Each test runs against both stores and takes well under a few seconds."""
import os
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from pyarrow import fs as pafs

from tests.object_stores import gcs_store, s3_store  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow    # starts the S3 and GCS servers


@pytest.fixture(params=["s3", "gcs"])
def store(request):
    return request.getfixturevalue(f"{request.param}_store")


def _files(filesystem, base):
    """{path: size} of the files under base (recursive)."""
    infos = filesystem.get_file_info(pafs.FileSelector(base, recursive=True))
    return {i.path: i.size for i in infos if i.type == pafs.FileType.File}


def _write(filesystem, path, data):
    with filesystem.open_output_stream(path) as out:
        out.write(data)


def _read(filesystem, path):
    with filesystem.open_input_stream(path) as f:
        return f.read()


def test_write_list_read_overwrite_delete(store):
    filesystem, bucket = store.filesystem(), store.make_bucket()
    assert filesystem.get_file_info(bucket).type == pafs.FileType.Directory
    _write(filesystem, f"{bucket}/a/one.txt", b"one")
    _write(filesystem, f"{bucket}/a/b/two.txt", b"second")

    assert _files(filesystem, bucket) == {f"{bucket}/a/one.txt": 3, f"{bucket}/a/b/two.txt": 6}
    assert _read(filesystem, f"{bucket}/a/b/two.txt") == b"second"
    with filesystem.open_input_file(f"{bucket}/a/one.txt") as f:     # random access (ranged GET)
        assert f.size() == 3 and f.read_at(1, 2) == b"e"   # read_at(nbytes, offset)
    # A prefix with objects under it reads as a directory although nothing was created for it.
    assert filesystem.get_file_info(f"{bucket}/a/b").type == pafs.FileType.Directory

    _write(filesystem, f"{bucket}/a/one.txt", b"replaced")              # overwrite in place
    assert _read(filesystem, f"{bucket}/a/one.txt") == b"replaced"

    filesystem.move(f"{bucket}/a/one.txt", f"{bucket}/moved.txt")      # copy + delete on both
    assert _read(filesystem, f"{bucket}/moved.txt") == b"replaced"
    assert filesystem.get_file_info(f"{bucket}/a/one.txt").type == pafs.FileType.NotFound

    filesystem.delete_file(f"{bucket}/moved.txt")
    assert filesystem.get_file_info(f"{bucket}/moved.txt").type == pafs.FileType.NotFound
    with pytest.raises(FileNotFoundError):
        _read(filesystem, f"{bucket}/moved.txt")


def test_delete_prefix(store):
    filesystem, bucket = store.filesystem(), store.make_bucket()
    for name in ("x/1", "x/2", "x/sub/3", "keep/4"):
        _write(filesystem, f"{bucket}/{name}", b"data")

    filesystem.delete_dir_contents(f"{bucket}/x")
    assert _files(filesystem, bucket) == {f"{bucket}/keep/4": 4}

    _write(filesystem, f"{bucket}/y/1", b"data")
    if store.scheme == "s3":
        filesystem.delete_dir(f"{bucket}/y")
        assert filesystem.get_file_info(f"{bucket}/y").type == pafs.FileType.NotFound
    else:
        # Arrow's GCS delete_dir removes the objects, then the "y/" marker object, which exists
        # only when create_dir made the directory: on a bare prefix it raises after deleting.
        with pytest.raises(FileNotFoundError):
            filesystem.delete_dir(f"{bucket}/y")
    assert _files(filesystem, bucket) == {f"{bucket}/keep/4": 4}


def test_parquet_files_and_dataset(store):
    filesystem, bucket = store.filesystem(), store.make_bucket()
    for part in range(3):
        table = pa.table({"part": [part] * 4, "value": list(range(part * 4, part * 4 + 4))})
        pq.write_table(table, f"{bucket}/table/part-{part}.parquet", filesystem=filesystem)

    assert pq.read_table(f"{bucket}/table/part-1.parquet", filesystem=filesystem)["value"].to_pylist() \
        == [4, 5, 6, 7]
    dataset = ds.dataset(f"{bucket}/table", filesystem=filesystem, format="parquet")
    assert len(dataset.files) == 3
    table = dataset.to_table(filter=ds.field("part") >= 1)
    assert sorted(table["value"].to_pylist()) == list(range(4, 12))

    ds.write_dataset(dataset.to_table(), f"{bucket}/copy", filesystem=filesystem, format="parquet",
                     partitioning=["part"], partitioning_flavor="hive")
    copy = ds.dataset(f"{bucket}/copy", filesystem=filesystem, format="parquet", partitioning="hive")
    assert copy.count_rows() == 12
    assert sorted(os.path.dirname(p).rsplit("/", 1)[1] for p in copy.files) == [
        "part=0", "part=1", "part=2"]


def test_self_contained_uri(store):
    filesystem, bucket = store.filesystem(), store.make_bucket()
    _write(filesystem, f"{bucket}/k/obj.txt", b"via uri")
    uri_filesystem, path = pafs.FileSystem.from_uri(store.uri(f"{bucket}/k/obj.txt"))
    assert path == f"{bucket}/k/obj.txt"
    assert _read(uri_filesystem, path) == b"via uri"


_CHILD = textwrap.dedent("""
    import sys
    import pyarrow as pa, pyarrow.parquet as pq
    from pyarrow import fs
    filesystem, path = fs.FileSystem.from_uri(sys.argv[1])
    with filesystem.open_input_stream(path) as f:
        data = f.read()
    pq.write_table(pa.table({"echo": [data.decode()]}), sys.argv[2])
    print("read", data.decode())
""")


def test_subprocess_reaches_server_through_env_alone(store):
    """A worker in another process finds the server from store.env and a plain bucket URI."""
    filesystem, bucket = store.filesystem(), store.make_bucket()
    _write(filesystem, f"{bucket}/in/msg.txt", b"hello worker")
    inherited = ("AWS_", "GOOGLE_", "STORAGE_EMULATOR_HOST", "CLOUD_STORAGE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(inherited)}
    env.update(store.env)

    result = subprocess.run(
        [sys.executable, "-c", _CHILD, store.env_uri(f"{bucket}/in/msg.txt"),
         store.env_uri(f"{bucket}/out/echo.parquet")],
        env=env, capture_output=True, text=True, timeout=60)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "read hello worker"
    echoed = pq.read_table(f"{bucket}/out/echo.parquet", filesystem=filesystem)
    assert echoed["echo"].to_pylist() == ["hello worker"]
