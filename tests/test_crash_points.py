"""A sample of the generation job's crash points (tests/crash_points.py; the whole sweep is
bench/bench_crash_points.py): stopped by SIGKILL or SIGTERM just before one of its storage
operations (a listing, a unit file, a unit record, a compacted file, the manifest, a delete of the
clean-up), a reader then sees the run committed before or the new one, never a mix; the same
command finishes with the rows of an uninterrupted run; nothing is left that the manifest does not
list. On a local disk and in an S3 bucket (moto on loopback)."""
import os

import pytest

from tests.crash_points import Store, Sweep, chosen, temporary_store
from tests.jobs import quick_args
from tests.object_stores import s3_store  # noqa: F401: a fixture

pytestmark = pytest.mark.slow          # each point is two runs of the job


def _sweep(store: Store, work: str, tiny_nmt_models: str) -> Sweep:
    from tests.toydata import toy_bitext

    bitext = os.path.join(work, "in.tsv")
    with open(bitext, "w", encoding="utf-8") as f:
        f.writelines(f"{s}\t{t}\n" for s, t in toy_bitext(400, seed=31)[:12])
    # the committed run replaced: two samples a set instead of four (other rows, another plan)
    return Sweep(store, lambda out: quick_args(bitext, out, tiny_nmt_models), ["--num_samples", "2"], [], work)


def _check(points):
    bad = [p for p in points if not p.ok]
    assert not bad, [(p.n, p.kind, p.path.rsplit("/", 2)[-2:], p.signal, p.exit_status, p.seen, p.rerun_status,
                      p.rows_right, p.left[:3]) for p in bad]


def test_a_stop_at_sampled_storage_operations_on_a_local_disk(tiny_nmt_models, tmp_path):
    store, work = temporary_store(str(tmp_path))
    sweep = _sweep(store, work, tiny_nmt_models)
    ops = sweep.prepare()
    kinds = {k for _, k, _ in ops}
    assert {"write", "delete", "list"} <= kinds and len(ops) >= 20
    points = [sweep.point(n, kind, path, "KILL") for n, kind, path in chosen(ops, 5)]
    manifest = next(o for o in ops if o[2].endswith("_manifest.json"))
    after = next(o for o in ops if o[0] > manifest[0] and o[1] == "delete")
    points += [sweep.point(*manifest, "TERM"), sweep.point(*after, "TERM")]
    _check(points)
    assert {p.seen for p in points} == {"previous", "new"}          # the sample straddles the manifest


def test_a_stop_at_sampled_storage_operations_in_an_s3_bucket(tiny_nmt_models, s3_store, tmp_path):
    bucket = s3_store.make_bucket()
    sweep = _sweep(Store(f"s3://{bucket}/runs", s3_store.env), str(tmp_path), tiny_nmt_models)
    try:
        ops = sweep.prepare()
        points = [sweep.point(n, kind, path, "KILL") for n, kind, path in chosen(ops, 2)]
    finally:
        for name, value in s3_store.env.items():          # prepare() set them for this process's reader
            if os.environ.get(name) == value:
                del os.environ[name]
    _check(points)
