"""A flaky or briefly absent object store does not end a job: transient faults (503 SlowDown, 500,
a connection dropped before the answer, a store that refuses connections) are retried with
backoff for up to PARAGEN_STORAGE_RETRY_SECONDS; past that, and at once for a refusal (403,
a missing bucket), one StorageError line names the store. The faults are real: a proxy on
loopback (tests/fault_proxy.py) in front of moto's S3 server answers them."""
import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common import storage
from tests.fault_proxy import FaultProxy
from tests.object_stores import s3_store  # noqa: F401: a fixture


@pytest.fixture
def through(s3_store, monkeypatch):
    """through(rate, kinds, seed) -> a FaultProxy in front of the S3 server that this process's
    storage layer talks to."""
    proxies = []

    def make(rate=0.0, kinds=("503", "500", "reset"), seed=1):
        proxy = FaultProxy(s3_store.endpoint, rate=rate, seed=seed, kinds=kinds).__enter__()
        proxies.append(proxy)
        for name, value in {**s3_store.env, "AWS_ENDPOINT_URL": proxy.url, "AWS_ENDPOINT_URL_S3": proxy.url,
                            "PARAGEN_STORAGE_TIMEOUT": "6"}.items():
            monkeypatch.setenv(name, value)
        return proxy
    yield make
    for proxy in proxies:
        proxy.__exit__(None, None, None)


def test_every_operation_rides_out_a_store_failing_a_third_of_its_requests(s3_store, through, monkeypatch):
    bucket = s3_store.make_bucket()
    monkeypatch.setenv("PARAGEN_STORAGE_RETRY_SECONDS", "120")
    proxy = through(rate=0.33, seed=7)
    data = os.urandom(3 << 20)                  # several ranged reads
    for i in range(4):
        storage.write_bytes(f"s3://{bucket}/d/{i}.bin", data)
    assert [storage.read_bytes(f"s3://{bucket}/d/{i}.bin") == data for i in range(4)] == [True] * 4
    with storage.open_input(f"s3://{bucket}/d/0.bin") as f:         # streamed, as input shards are read
        assert b"".join(iter(lambda: f.read(100_000), b"")) == data
    table = pa.table({"x": list(range(50_000))})
    with storage.open_output(f"s3://{bucket}/t.parquet") as f:
        pq.write_table(table, f)
    assert storage.parquet_file(f"s3://{bucket}/t.parquet").read().equals(table)
    storage.write_json(f"s3://{bucket}/m.json", {"a": 1})
    storage.write_json(f"s3://{bucket}/m.json", {"a": 2})           # a rewrite is one object, the last
    assert storage.read_json(f"s3://{bucket}/m.json") == {"a": 2}
    assert len(storage.list_files(f"s3://{bucket}/d")) == 4 and storage.listdir(f"s3://{bucket}") == ["d", "m.json",
                                                                                                         "t.parquet"]
    storage.delete_tree(f"s3://{bucket}/d")
    storage.delete(f"s3://{bucket}/m.json")
    assert storage.listdir(f"s3://{bucket}") == ["t.parquet"]
    assert all(proxy.counts[kind] > 0 for kind in ("503", "500", "reset")), proxy.counts


def test_a_store_that_is_down_for_a_while_is_waited_for(s3_store, through, monkeypatch):
    bucket = s3_store.make_bucket()
    monkeypatch.setenv("PARAGEN_STORAGE_RETRY_SECONDS", "60")
    proxy = through()
    storage.write_bytes(f"s3://{bucket}/a", b"x")
    proxy.down(4)
    start = time.monotonic()
    assert storage.read_bytes(f"s3://{bucket}/a") == b"x"
    assert time.monotonic() - start >= 3.5 and proxy.counts["refused"] >= 2


def test_a_store_down_longer_than_the_budget_is_one_line_naming_it(s3_store, through, monkeypatch):
    bucket = s3_store.make_bucket()
    monkeypatch.setenv("PARAGEN_STORAGE_RETRY_SECONDS", "3")
    proxy = through()
    proxy.down(600)                             # far past the budget: giving up is not waiting for the store
    start = time.monotonic()
    with pytest.raises(storage.StorageError) as info:
        storage.write_bytes(f"s3://{bucket}/a", b"x")
    message = str(info.value)
    assert proxy.url.split("//")[1] in message and "\n" not in message
    assert "retried for 3s (PARAGEN_STORAGE_RETRY_SECONDS)" in message and info.value.transient
    assert 2 < time.monotonic() - start < 300   # the whole budget waited; the store was still down
    # the store stayed away: the job's last steps are not held up. Counted, not timed: one attempt
    # (the S3 client's own three connections), where a budget waited again would make more
    refused = proxy.counts["refused"]
    with pytest.raises(storage.StorageError):
        storage.exists(f"s3://{bucket}/b")
    assert 1 <= proxy.counts["refused"] - refused <= 3, proxy.counts
    proxy.down(0)                               # back: waited for again, and answering
    assert not storage.exists(f"s3://{bucket}/b")


def test_refusals_are_not_retried(s3_store, through, monkeypatch):
    monkeypatch.setenv("PARAGEN_STORAGE_RETRY_SECONDS", "120")
    bucket = s3_store.make_bucket()
    proxy = through(rate=1.0, kinds=("403",))
    with pytest.raises(storage.StorageError, match="refused .*AccessDenied|refused .*ACCESS_DENIED|refused .*403"):
        storage.write_bytes(f"s3://{bucket}/a", b"x")
    assert proxy.counts["403"] == 1, proxy.counts          # asked once: counted, not timed
    proxy = through()
    with pytest.raises(storage.StorageError, match="refused .*NO_SUCH_BUCKET"):
        storage.write_bytes("s3://no-such-bucket-here/a", b"x")
    assert proxy.counts["forwarded"] == 1, proxy.counts


def test_the_retry_budget_must_be_a_number_of_seconds(monkeypatch):
    monkeypatch.setenv("PARAGEN_STORAGE_RETRY_SECONDS", "soon")
    with pytest.raises(storage.StorageError, match="PARAGEN_STORAGE_RETRY_SECONDS='soon'"):
        storage.retry_seconds()


@pytest.mark.parametrize("kind", ["lost", "cut"])
def test_an_answer_lost_after_the_store_acted_is_retried_to_the_same_result(s3_store, monkeypatch, kind):
    """The store did the work and the answer did not arrive (reset after the fact, or cut in the
    middle): a multipart upload's completion retried after it succeeded (the store then answers
    NoSuchUpload) is a success, a put and a conditional create retried are what one would have
    been, a delete retried deletes nothing more."""
    from common import storage
    from tests.fault_proxy import FaultProxy

    bucket = s3_store.make_bucket()
    data = os.urandom(7 << 20)                       # above the 5-MiB part size: a multipart upload
    with FaultProxy(s3_store.endpoint, rate=1.0, kinds=(kind,), only=b"?uploadId=", limit=1, like_minio=True) as proxy:
        for name, value in {**s3_store.env, "AWS_ENDPOINT_URL": proxy.url, "AWS_ENDPOINT_URL_S3": proxy.url,
                            "PARAGEN_STORAGE_RETRY_SECONDS": "30"}.items():
            monkeypatch.setenv(name, value)
        storage.write_bytes(f"s3://{bucket}/big.bin", data)
        assert proxy.counts[kind] == 1, proxy.counts
    with FaultProxy(s3_store.endpoint, rate=1.0, kinds=(kind,), limit=1) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.url)
        # 412 on the retry: the bytes read back are this writer's, so the create succeeded
        storage.create_new(f"s3://{bucket}/owner.json", b"mine")          # no Conflict
        assert proxy.counts[kind] == 1
        assert storage.read_bytes(f"s3://{bucket}/owner.json") == b"mine"
    for name, value in s3_store.env.items():
        monkeypatch.setenv(name, value)
    assert storage.read_bytes(f"s3://{bucket}/big.bin") == data
