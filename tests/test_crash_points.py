"""A sample of the jobs' crash points (tests/crash_points.py; the whole sweep is
bench/bench_crash_points.py): stopped by SIGKILL or SIGTERM just before one of its storage
operations (a listing, a unit file, a unit record, a compacted file, the manifest, a delete of the
clean-up), a reader then sees the run committed before or the new one, never a mix; the same
command finishes with the rows of an uninterrupted run; nothing is left that the manifest does not
list. The generation job on a local disk and in an S3 bucket (moto on loopback); the filter job
(no model: quick); a refresh (generation, filter, publish, retention)
at the operations of its own steps (its jobs' are the sweeps above)."""
import os

import pytest

from tests.crash_points import FILTER, REFRESH, Store, Sweep, chosen, temporary_store
from tests.jobs import quick_args, refresh_job_args
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
    # a unit's record (mid-decode), the manifest, and the first delete of the clean-up after it
    record = next(o for o in ops if o[1] == "write" and "/units/" in o[2])
    manifest = next(o for o in ops if o[2].endswith("_manifest.json"))
    after = next(o for o in ops if o[0] > manifest[0] and o[1] == "delete")
    points = [sweep.point(*record, "KILL"), sweep.point(*manifest, "TERM"), sweep.point(*after, "KILL")]
    _check(points)
    assert {p.seen for p in points} == {"previous", "new"}          # the sample straddles the manifest


def test_a_stop_at_sampled_storage_operations_in_an_s3_bucket(tiny_nmt_models, s3_store, tmp_path):
    bucket = s3_store.make_bucket()
    sweep = _sweep(Store(f"s3://{bucket}/runs", s3_store.env), str(tmp_path), tiny_nmt_models)
    try:
        ops = sweep.prepare()
        points = [sweep.point(*next(o for o in ops if o[2].endswith("_manifest.json")), "KILL")]
    finally:
        for name, value in s3_store.env.items():          # prepare() set them for this process's reader
            if os.environ.get(name) == value:
                del os.environ[name]
    _check(points)


def filter_sweep(work: str, store: Store | None = None) -> Sweep:
    """The filter job over a synthetic generation run (two partitions), replacing a committed
    filter run of another threshold, in STORE (default: a local folder under WORK)."""
    from tests.toydata import paraphrase_rows, toy_paraphrases, write_generation_run

    gen = write_generation_run(os.path.join(work, "gen"), paraphrase_rows(toy_paraphrases(600, seed=2)), shards=2)
    configs = []
    for name, top in (("a", 0.9), ("b", 0.5)):
        path = os.path.join(work, f"{name}.yaml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(f"filters:\n  - name: ngram_overlap\n    thresholds: {{trigram_overlap: {{max: {top}}}}}\n")
        configs.append(path)
    store = store or temporary_store(work)[0]
    return Sweep(store, lambda out: ["--input", gen, "--output", out, "--no_report"], ["--config", configs[0]],
                 ["--config", configs[1]], work, which=FILTER)


def test_a_stop_at_sampled_storage_operations_of_the_filter_job(tmp_path):
    sweep = filter_sweep(str(tmp_path))
    ops = sweep.prepare()
    assert any(o[2].endswith("_filter_manifest.json") for o in ops) and len(ops) >= 8
    points = [sweep.point(n, kind, path, "KILL") for n, kind, path in chosen(ops, 5)]
    manifest = next(o for o in ops if o[2].endswith("_filter_manifest.json"))
    points.append(sweep.point(*manifest, "TERM"))
    _check(points)
    assert {p.seen for p in points} == {"previous", "new"}


def refresh_sweep(work: str, models: str, store: Store | None = None) -> Sweep:
    """A refresh with the filter job, after a committed refresh of other inputs (a shard changed,
    one added): the new one decodes both and, with --keep 1, prunes the run before (its generation
    run, its filter run and its log); in STORE (default: a local folder under WORK)."""
    from tests.toydata import toy_bitext

    lines = [f"{s}\t{t}\n" for s, t in toy_bitext(400, seed=51)[:12]]
    before, after = os.path.join(work, "in-before"), os.path.join(work, "in-after")
    for folder, shards in ((before, {"a.tsv": lines[:6]}), (after, {"a.tsv": lines[:8], "b.tsv": lines[8:]})):
        os.makedirs(folder)
        for name, text in shards.items():
            with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
                f.writelines(text)
    config = os.path.join(work, "filter.yaml")
    with open(config, "w", encoding="utf-8") as f:
        f.write("filters:\n  - name: ngram_overlap\n    thresholds: {trigram_overlap: {max: 0.7}}\n")
    store = store or temporary_store(work)[0]
    return Sweep(store, lambda root: ["--root", root, "--keep", "1", f"--filter_args=--config {config} --no_report",
                                      "--", *refresh_job_args(models)], ["--input", before], ["--input", after], work,
                 which=REFRESH)


def test_a_stop_at_the_operations_of_a_refresh(tiny_nmt_models, tmp_path):
    """At the refresh's own steps (its jobs' operations are the sweeps above): the latest/ view,
    latest.json, and retention's first delete of the run before."""
    sweep = refresh_sweep(str(tmp_path), tiny_nmt_models)
    ops = sweep.prepare()
    named = next(o for o in ops if o[2].endswith("latest.json") and o[1] == "write")
    view = next(o for o in ops if o[2].endswith("latest/_manifest.json"))
    prune = next(o for o in ops if o[1] == "delete_tree" and o[0] > named[0] and "/whole/runs/" in o[2])
    points = [sweep.point(*view, "KILL"), sweep.point(*named, "TERM"), sweep.point(*prune, "KILL")]
    _check(points)
    assert [p.seen for p in points] == ["previous", "previous", "new"]
    # half of latest/ (a stop while the view was written; the next refresh has nothing to decode):
    # the next refresh makes latest/ the run latest.json names again
    from common import storage
    from tests.crash_points import job, leftovers

    root = sweep.store.path(f"p{named[0]}-term")
    storage.delete(storage.join(root, "latest", "_manifest.json"))
    assert leftovers(root, REFRESH) == ["latest/ (a view of another run than latest.json names)"]
    done = job(sweep._args(root, sweep.new_extra), sweep.env, which=REFRESH)
    assert done.returncode == 0 and "nothing changed" in done.stdout, done.stderr[-2000:]
    assert "did not match latest.json" in done.stderr and leftovers(root, REFRESH) == []
