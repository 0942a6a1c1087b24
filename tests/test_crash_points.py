"""A sample of the jobs' crash points on the paths users take (tests/crash_points.py; the whole
sweep, with worker processes' operations, Dask, paused holders and refreshes that gain or lose
--filter_args, is bench/bench_crash_points.py): stopped by SIGKILL or SIGTERM just before one of
its storage operations, a reader then sees the state before or the new run, never a mix (every
table, the filter report, a refresh's latest.json and latest/ view); the same command finishes
with the rows of an uninterrupted run; nothing is left that the manifest does not list. The
generation job replacing a run (--overwrite) on a local disk, and rerun as it was (no
--overwrite) in an S3 bucket (moto), a GCS bucket (fake-gcs-server) and on HDFS (a MiniDFSCluster
over WebHDFS, stopped also between a file's upload and its rename); the filter job with its
report; refreshes with --keep 2 and references across runs."""
import os

import pytest

from tests.crash_points import Store, chosen, filter_sweep, generation_sweep, refresh_sweep, temporary_store
from tests.hdfs_cluster import hdfs_store  # noqa: F401: fixture
from tests.object_stores import gcs_store, s3_store  # noqa: F401: fixtures
from tests.claims import claim_record

pytestmark = pytest.mark.slow          # each point is two runs of the job


def _check(points):
    bad = [p for p in points if not p.ok]
    assert not bad, [(p.n, p.kind, p.path.rsplit("/", 2)[-2:], p.signal, p.exit_status, p.seen, p.seen_view,
                      p.rerun_status, p.rows_right, p.left[:3]) for p in bad]


def _op(ops, test, after=None):
    return next(o for o in ops if test(o) and (after is None or o[0] > after[0]))


def _by_path(ops, op, suffix: str) -> str:
    """PARAGEN_CRASH_AT's ``~SUFFIX@K`` for the operation OP of the prepared run: the same operation
    in the stopped run whatever other threads did before it (the claim's renewals are storage
    operations too, and on a loaded machine they fall elsewhere in the count than in prepare())."""
    n, _, path, pid = op
    assert path.endswith(suffix)
    return f"~{suffix}@{sum(1 for o in ops if o[3] == pid and o[0] <= n and o[2].endswith(suffix))}"


def _manifest(o):
    return o[2].endswith("/_manifest.json")


def test_a_run_replacing_another_stopped_at_sampled_operations(tiny_nmt_models, tmp_path):
    store, work = temporary_store(str(tmp_path))
    sweep = generation_sweep(store, work, tiny_nmt_models, "overwrite")
    ops = sweep.prepare()
    assert {"write", "rename", "delete", "list"} <= {o[1] for o in ops} and len(ops) >= 20
    record = _op(ops, lambda o: o[1] == "write" and "/units/" in o[2])
    manifest = _op(ops, _manifest)
    after = _op(ops, lambda o: o[1] in ("delete", "delete_tree"), manifest)
    points = [sweep.point(*record[:3], "KILL"), sweep.point(*manifest[:3], "TERM"), sweep.point(*after[:3], "KILL")]
    _check(points)
    assert {p.seen for p in points} == {"previous", "new"}          # the sample straddles the manifest


@pytest.mark.parametrize("bucket", ["s3", "gcs", "hdfs"])
def test_the_same_command_in_a_bucket_stopped_at_its_manifest(tiny_nmt_models, tmp_path, bucket, request):
    store_server = request.getfixturevalue(f"{bucket}_store")
    name = store_server.make_bucket()
    env = {k: v for k, v in store_server.env.items()}
    store = Store(f"{store_server.scheme}://{name}/runs", env, bucket)
    try:
        sweep = generation_sweep(store, str(tmp_path), tiny_nmt_models, "same")
        ops = sweep.prepare()
        points = [sweep.point(*_op(ops, _manifest)[:3], "KILL" if bucket == "s3" else "TERM")]
        if bucket != "hdfs":                  # the store's probe made, not yet removed (left in the bucket before)
            points.append(sweep.point(*_op(ops, lambda o: o[1] == "delete" and "/.probe." in o[2])[:3], "TERM"))
        if bucket == "hdfs":                  # uploaded under a hidden name, not yet renamed into place
            points.append(sweep.point(*_op(ops, lambda o: o[1] == "rename" and ".parquet" in o[2])[:3], "KILL"))
    finally:
        for key, value in env.items():                    # prepare() set them for this process's reader
            if os.environ.get(key) == value:
                del os.environ[key]
    _check(points)


def test_the_filter_job_with_its_report_stopped_at_sampled_operations(tmp_path):
    sweep = filter_sweep(str(tmp_path))
    ops = sweep.prepare()
    assert any(o[2].endswith("_filter_manifest.json") for o in ops) and any("/report/" in o[2] for o in ops)
    points = [sweep.point(n, kind, path, "KILL") for n, kind, path, _ in chosen(ops, 3)]
    points.append(sweep.point(*_op(ops, lambda o: o[2].endswith("/_filter_manifest.json"))[:3], "TERM"))
    _check(points)
    assert {p.seen for p in points} == {"previous", "new"}
    fresh = filter_sweep(str(tmp_path / "fresh"), mode="same")
    ops = fresh.prepare()
    after = _op(ops, lambda o: o[1] == "rename" and o[2].endswith("/_filter_manifest.json"))
    _check([fresh.point(*ops[after[0]][:3], "TERM")])                    # the first step of its clean-up


def test_refreshes_with_keep_2_stopped_at_their_own_steps(tiny_nmt_models, tmp_path):
    """At the refresh's own steps (its jobs' are the sweeps above): latest's next version (the
    commit point), the latest/ view written after it, and retention; --keep 2 after a refresh
    that took files from the one before."""
    sweep = refresh_sweep(str(tmp_path), tiny_nmt_models, mode="keep2")
    ops = sweep.prepare()
    named = _op(ops, lambda o: o[2].endswith("-latest.json") and o[1] == "write")
    view = _op(ops, lambda o: o[2].endswith("latest/_manifest.json") and o[1] == "write")
    points = [sweep.point(*view[:3], "KILL", crash=_by_path(ops, view, "latest/_manifest.json")),
              sweep.point(*named[:3], "TERM", crash=_by_path(ops, named, "-latest.json"))]
    _check(points)
    assert [p.seen for p in points] == ["new", "previous"] and points[0].seen_view in ("previous", "partial")


def test_a_refresh_that_filters_latest_again_stopped_at_its_filter_runs_commit(tiny_nmt_models, tmp_path):
    """A refresh that gains --filter_args with no new bitext filters the run latest names, then
    moves latest to that filter run: SIGKILLed between the filter manifest's version and its plain
    copy (the latest/ view must be made from the version), just after the filter job published (its
    clean-up and claim left: the same command, finding the filter run current, must finish them)
    and at latest's next version. (Found by the sweep: the rerun left the filter run's _work and
    claim; and by the suite under load: a view made from the copy before it was repaired.)"""
    sweep = refresh_sweep(str(tmp_path), tiny_nmt_models, mode="filter_on")
    ops = sweep.prepare()
    published = _op(ops, lambda o: o[1] == "rename" and o[2].endswith("/_filter_manifest.json"))
    copy = ops[ops.index(published) - 1]             # its version created, its plain copy not yet placed
    after = _op(ops, lambda o: True, after=published)                # the filter job's next operation
    named = _op(ops, lambda o: o[2].endswith("-latest.json") and o[1] == "write", after=published)
    points = [sweep.point(*copy[:3], "KILL"), sweep.point(*after[:3], "KILL"), sweep.point(*named[:3], "KILL")]
    _check(points)


def test_a_stopped_refresh_is_continued_by_the_same_command(tiny_nmt_models, tmp_path):
    """A refresh stopped (SIGTERM) while its generation job decodes, or after that job published
    its run but before latest moved, or SIGKILLed while decoding: the same command continues that run (its committed units
    kept: the manifest says resumed) or finishes it (its clean-up, then latest), instead of
    decoding again in a new run, and leaves nothing behind. (Before: a new run each time; the
    stopped run's units were decoded again, and a published one kept its clean-up's files.)"""
    from common import storage
    from tests.crash_points import REFRESH, job, leftovers, rows
    from tests.jobs import units_committed

    sweep = refresh_sweep(str(tmp_path), tiny_nmt_models, mode="filter_off")
    ops = sweep.prepare()
    second_unit = [o for o in ops if o[1] == "rename" and "/units/" in o[2]][1]     # one unit committed
    manifest = _op(ops, lambda o: o[1] == "rename" and "/runs/" in o[2] and _manifest(o))
    cleanup = _op(ops, lambda o: o[1] == "delete", after=manifest)
    for op, resumed in ((second_unit, True), (cleanup, False)):
        out = sweep.store.path(f"continued-{op[0]}")
        sweep.store.copy(sweep.start, out)
        args = sweep.args(out, sweep.command)
        before = set(storage.listdir(storage.join(out, "runs")))
        stopped = job(args, {**sweep.env, "PARAGEN_CRASH_AT": f"{op[0]}:TERM"}, which=REFRESH)
        assert stopped.returncode == 143, stopped.stderr[-2000:]
        (stopped_id,) = set(storage.listdir(storage.join(out, "runs"))) - before
        again = job(args, sweep.env, which=REFRESH)
        assert again.returncode == 0, again.stderr[-3000:]
        assert f"continuing run {stopped_id}" in again.stdout, again.stdout
        assert rows(out, REFRESH) == sweep.new_rows and not leftovers(out, REFRESH), leftovers(out, REFRESH)
        latest = storage.read_json(storage.join(out, "latest.json"))
        assert latest["run_id"] == stopped_id
        manifest_of = storage.read_json(storage.join(out, "runs", stopped_id, "_manifest.json"))
        assert manifest_of["resumed"] is resumed
    # SIGKILLed (no word, no release) after two units committed: its holder is gone (its process
    # ended), so the same command continues it, the committed units reused, not decoded again
    third_unit = [o for o in ops if o[1] == "rename" and "/units/" in o[2]][2]
    out = sweep.store.path("killed")
    sweep.store.copy(sweep.start, out)
    args = sweep.args(out, sweep.command)
    before = set(storage.listdir(storage.join(out, "runs")))
    killed = job(args, {**sweep.env, "PARAGEN_CRASH_AT": f"{third_unit[0]}:KILL"}, which=REFRESH)
    assert killed.returncode in (-9, 137), killed.stderr[-2000:]
    (killed_id,) = set(storage.listdir(storage.join(out, "runs"))) - before
    run_dir = storage.join(out, "runs", killed_id)
    assert claim_record(run_dir)                                          # never released
    committed = units_committed(run_dir)
    assert committed >= 2, committed
    again = job(args, sweep.env, which=REFRESH)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"continuing run {killed_id}" in again.stdout, again.stdout
    assert rows(out, REFRESH) == sweep.new_rows and not leftovers(out, REFRESH), leftovers(out, REFRESH)
    manifest_of = storage.read_json(storage.join(run_dir, "_manifest.json"))
    assert manifest_of["resumed"] is True and manifest_of["units"]["reused_from_earlier_attempt"] == committed
    # published, then new input arrives before the rerun: a new run (another plan); the stopped
    # run is kept (a complete run, retention's to remove) with its clean-up finished
    out = sweep.store.path("orphan")
    sweep.store.copy(sweep.start, out)
    args = sweep.args(out, sweep.command)
    before = set(storage.listdir(storage.join(out, "runs")))
    assert job(args, {**sweep.env, "PARAGEN_CRASH_AT": f"{cleanup[0]}:TERM"}, which=REFRESH).returncode == 143
    (stopped_id,) = set(storage.listdir(storage.join(out, "runs"))) - before
    more = os.path.join(args[args.index("--input") + 1], "d.tsv")
    with open(more, "w", encoding="utf-8") as f:
        f.write("Muž jede na kole.\tA man rides a bike.\n")
    again = job(args, sweep.env, which=REFRESH)
    assert again.returncode == 0 and "continuing run" not in again.stdout, again.stderr[-3000:]
    assert storage.read_json(storage.join(out, "latest.json"))["run_id"] != stopped_id
    assert not leftovers(out, REFRESH), leftovers(out, REFRESH)
