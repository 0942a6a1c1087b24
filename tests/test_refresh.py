"""Scheduled refreshes (beam_pipelines/refresh.py through deploy/refresh.sh) with the real jobs:
incremental runs, latest moved only after every job committed, no-op refreshes, failures in each
stage, retention, overlapping refreshes, a bucket as the root, and the systemd failure hook."""
import json
import os
import subprocess
import sys
import time

import pytest

from beam_pipelines.refresh import LEASE, run as refresh
from common import processes
from tests.claims import claim_record, take_over
from paracorpus.latest import LATEST
from common import storage
from common.cli import JobFailed, OutputBusy, UsageError
from paracorpus.commit import committed_files
from tests.jobs import refresh_job_args
from tests.object_stores import s3_store  # noqa: F401  (fixture)
from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILTER = "filters:\n  - name: ngram_overlap\n    thresholds: {trigram_overlap: {max: 0.9}}\n"


def _lines(start, n):
    from tests.toydata import toy_bitext

    return "".join(f"{s}\t{t}\n" for s, t in toy_bitext(400, seed=51)[start:start + n])


def _job(inp, models):
    return ["--input", inp, *refresh_job_args(models)]


def _latest(root):
    return storage.read_json(storage.join(root, LATEST))["run_id"]


def _readable(root, run_id):
    """The run is whole: its manifest's files (its own and the earlier runs' it reuses) all open."""
    run_dir = storage.join(root, "runs", run_id)
    files = committed_files(run_dir, "paraphrases") + committed_files(storage.join(root, "filtered", run_id),
                                                                       "scored", "_filter_manifest.json")
    return files and all(storage.parquet_file(f).metadata.num_rows >= 0 for f in files)


@pytest.mark.slow
def test_refreshes_on_a_local_disk(tmp_path, tiny_nmt_models):
    inp, root, cfg = tmp_path / "in", str(tmp_path / "root"), tmp_path / "f.yaml"
    inp.mkdir()
    cfg.write_text(FILTER)
    (inp / "a.tsv").write_text(_lines(0, 10))
    filt = [f"--filter_args=--config {cfg} --no_report"]
    r1 = refresh(["--root", root, "--keep", "1", *filt, "--", *_job(str(inp), tiny_nmt_models)])
    assert _latest(root) == r1["run_id"]
    assert json.load(open(os.path.join(root, "latest", "_manifest.json")))["run_id"] == r1["run_id"]
    assert _readable(root, r1["run_id"])

    (inp / "b.tsv").write_text(_lines(10, 10))
    r2 = refresh(["--root", root, "--keep", "1", *filt, "--", *_job(str(inp), tiny_nmt_models)])
    m2 = json.load(open(os.path.join(root, "runs", r2["run_id"], "_manifest.json")))
    assert [e["input_shard"] for e in m2["inputs"] if e["decoded_in"] == r2["run_id"]] == ["b.tsv"]
    assert _latest(root) == r2["run_id"] and _readable(root, r2["run_id"])
    # KEEP=1, but r2 takes a.tsv's files from r1: retention keeps r1
    assert sorted(os.listdir(os.path.join(root, "runs"))) == sorted([r1["run_id"], r2["run_id"]])

    noop = refresh(["--root", root, *filt, "--", *_job(str(inp), tiny_nmt_models)])
    assert noop["noop"] and _latest(root) == r2["run_id"]
    assert not os.path.exists(os.path.join(root, "runs", noop["run_id"]))

    # a failure in each stage: latest stays on a whole, readable run; the failed run is pruned later
    (inp / "c.tsv").write_text(_lines(20, 6))
    with pytest.raises(JobFailed, match=r"filter job failed \(exit 1\)"):
        refresh(["--root", root, *filt, "--filter_cmd", "false", "--", *_job(str(inp), tiny_nmt_models)])
    bad_models = _job(str(inp), tiny_nmt_models)
    bad_models[bad_models.index("--forward_model") + 1] = str(tmp_path / "no-model")
    with pytest.raises(JobFailed, match=r"generation job failed \(exit 2\): --forward_model: .*no-model") as info:
        refresh(["--root", root, *filt, "--", *bad_models])
    assert info.value.code == 2
    assert _latest(root) == r2["run_id"] and _readable(root, r2["run_id"])
    logs = os.listdir(os.path.join(root, "logs"))
    assert any("no-model" in open(os.path.join(root, "logs", f)).read() for f in logs)

    r3 = refresh(["--root", root, "--keep", "1", *filt, "--", *_job(str(inp), tiny_nmt_models)])
    assert _latest(root) == r3["run_id"] and _readable(root, r3["run_id"])
    runs = sorted(os.listdir(os.path.join(root, "runs")))
    assert runs == sorted([r1["run_id"], r2["run_id"], r3["run_id"]])        # failed runs gone, references kept
    assert sorted(f[:-4] for f in os.listdir(os.path.join(root, "logs"))) == runs


@pytest.mark.slow
def test_new_or_changed_filter_args_filter_latest_with_no_new_bitext(tmp_path, tiny_nmt_models, capsys):
    """--filter_args added, then changed, with the same bitext: the filter job runs on latest's
    run (no decoding), into a folder of its own when the run has a filter run of other arguments,
    and latest names it; the same arguments again are a no-op. A reader of the old filter view
    keeps every file it opened."""
    from paracorpus.schema import FILTER_MANIFEST

    inp, root = tmp_path / "in", str(tmp_path / "root")
    inp.mkdir()
    (inp / "a.tsv").write_text(_lines(0, 10))
    configs = {}
    for name, most in (("a", 0.9), ("b", 0.95)):
        configs[name] = tmp_path / f"{name}.yaml"
        configs[name].write_text(FILTER.replace("max: 0.9", f"max: {most}"))
    job = _job(str(inp), tiny_nmt_models)

    def filtered(name):
        return [f"--filter_args=--config {configs[name]} --no_report"]

    def view_filter():
        return json.load(open(os.path.join(root, "latest", "filtered", FILTER_MANIFEST)))

    r1 = refresh(["--root", root, "--", *job])["run_id"]
    assert not os.path.exists(os.path.join(root, "latest", "filtered"))
    refresh(["--root", root, "--dry_run", *filtered("a"), "--", *job])
    assert "with no new bitext the filter job would run on it again" in capsys.readouterr().out
    added = refresh(["--root", root, *filtered("a"), "--", *job])
    assert not added["noop"] and _latest(root) == r1 and not os.path.exists(os.path.join(root, "runs", added["run_id"]))
    assert storage.read_json(os.path.join(root, LATEST))["filtered"] == f"filtered/{r1}"
    first = view_filter()
    assert first["input"].endswith(f"runs/{r1}")
    assert refresh(["--root", root, *filtered("a"), "--", *job])["noop"]            # the same arguments: nothing

    changed = refresh(["--root", root, *filtered("b"), "--", *job])
    assert not changed["noop"] and _latest(root) == r1
    named = storage.read_json(os.path.join(root, LATEST))["filtered"]
    assert named.startswith(f"filtered/{r1}.") and view_filter()["plan_key"] != first["plan_key"]
    assert named == f"filtered/{r1}.{view_filter()['plan_key']}"
    old_files = committed_files(os.path.join(root, "filtered", r1), "scored", FILTER_MANIFEST)
    assert old_files and all(os.path.isfile(f) for f in old_files)       # the old view's files stay
    back = refresh(["--root", root, *filtered("a"), "--", *job])              # back: the first filter run again
    assert not back["noop"] and storage.read_json(os.path.join(root, LATEST))["filtered"] == f"filtered/{r1}"
    assert view_filter()["run_id"] == first["run_id"]


@pytest.mark.slow
def test_overlapping_refreshes_are_refused(tmp_path, tiny_nmt_models):
    root = tmp_path / "root"
    root.mkdir()
    take_over(root, {"run_id": "20260101T000000Z-other", **processes.identity(), "heartbeat": time.time(),
                     "started": time.time()}, name=LEASE)
    with pytest.raises(OutputBusy, match="is being written by run 20260101T000000Z-other"):
        refresh(["--root", str(root), "--", *_job(str(tmp_path), tiny_nmt_models)])
    assert not (root / "runs").exists()


def test_refresh_refuses_options_it_sets(tmp_path):
    for opt in ("--output", "--previous", "--overwrite", "--resume", "--run_id", "--continue_only"):
        with pytest.raises(UsageError, match=f"{opt} is set by the refresh"):
            refresh(["--root", str(tmp_path), "--", "--input", "x", opt, "y"])


def _bucket(s3_store, models, tmp_path, monkeypatch) -> str:
    """A new bucket (its URL) holding the tiny MODELS and in/a.tsv (8 records); the environment
    points at the S3 server."""
    for k, v in s3_store.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("PARAGEN_CACHE", str(tmp_path / "cache"))
    bucket = f"s3://{s3_store.make_bucket()}"
    for name in ("cs-en", "en-cs"):
        for f in os.listdir(os.path.join(models, name)):
            storage.copy_file(os.path.join(models, name, f), f"{bucket}/models/{name}/{f}")
    storage.write_bytes(f"{bucket}/in/a.tsv", _lines(0, 8).encode())
    return bucket


@pytest.mark.slow
def test_refreshes_on_a_bucket(tmp_path, monkeypatch, tiny_nmt_models, s3_store):
    bucket = _bucket(s3_store, tiny_nmt_models, tmp_path, monkeypatch)
    root = f"{bucket}/corpus"
    r1 = refresh(["--root", root, "--", *_job(f"{bucket}/in", f"{bucket}/models")])
    storage.write_bytes(f"{bucket}/in/b.tsv", _lines(8, 8).encode())
    r2 = refresh(["--root", root, "--", *_job(f"{bucket}/in", f"{bucket}/models")])
    assert _latest(root) == r2["run_id"]
    m2 = storage.read_json(f"{root}/runs/{r2['run_id']}/_manifest.json")
    assert [e["input_shard"] for e in m2["inputs"] if e["decoded_in"] == r2["run_id"]] == ["b.tsv"]
    assert {storage.basename(p) for p in committed_files(f"{root}/runs/{r2['run_id']}", "paraphrases")} >= \
        {storage.basename(p) for p in committed_files(f"{root}/runs/{r1['run_id']}", "paraphrases")}
    assert storage.isfile(f"{root}/logs/{r2['run_id']}.log") and not claim_record(root, LEASE)
    assert refresh(["--root", root, "--", *_job(f"{bucket}/in", f"{bucket}/models")])["noop"]


@pytest.mark.slow
def test_a_stopped_refresh_on_a_bucket_keeps_each_attempts_log(tmp_path, monkeypatch, tiny_nmt_models, s3_store):
    """A bucket's objects cannot be appended to: the stop uploads the attempt's log, and the same
    command, continuing the run, logs to <run id>.2.log beside it, replacing nothing."""
    bucket = _bucket(s3_store, tiny_nmt_models, tmp_path, monkeypatch)
    root = f"{bucket}/corpus"
    command = [sys.executable, "-m", "beam_pipelines.refresh", "--root", root, "--",
               *_job(f"{bucket}/in", f"{bucket}/models")]
    env = {**os.environ, "PYTHONPATH": ROOT}
    # SIGTERM while the second of its two units is written: the first is committed
    stopped = warm_python.run(command, env={**env, "PARAGEN_CRASH_AT": "*part-u000001-:TERM"}, cwd=ROOT,
                              capture_output=True, text=True, timeout=900)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    logs = storage.listdir(f"{root}/logs")
    assert len(logs) == 1 and logs[0].endswith(".log"), logs
    run_id = logs[0][:-len(".log")]
    first = storage.read_bytes(f"{root}/logs/{run_id}.log")
    assert b"generation" in first, first[-2000:]
    again = warm_python.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0 and f"continuing run {run_id}" in again.stdout, again.stderr[-3000:]
    assert _latest(root) == run_id
    assert [n for n in storage.listdir(f"{root}/logs") if n.endswith(".log")] == [f"{run_id}.2.log", f"{run_id}.log"]
    assert storage.read_bytes(f"{root}/logs/{run_id}.log") == first       # the first attempt's, kept


def test_refresh_sh_hands_everything_to_paragen_refresh_without_a_shell(tmp_path):
    """FILTER_ARGS and the job commands reach paragen-refresh as single arguments (it splits them
    into words, never runs them through a shell)."""
    fake = tmp_path / "fakepython"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    env = {**os.environ, "OUT_ROOT": "gs://b/corpus", "KEEP": "3", "PYTHON": str(fake),
           "FILTER_ARGS": "--config x; touch /tmp/pwned", "PARAGEN_JOB_CMD": "deploy/run_dataflow.sh $(id)"}
    done = subprocess.run(["bash", os.path.join(ROOT, "deploy", "refresh.sh"), "--input", "gs://b/in"],
                          env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["-m", "beam_pipelines.refresh", "--root", "gs://b/corpus", "--keep", "3",
                                       "--filter_args=--config x; touch /tmp/pwned",
                                       "--job_cmd=deploy/run_dataflow.sh $(id)", "--", "--input", "gs://b/in"]


@pytest.mark.slow
def test_filter_args_are_words_not_shell_code(tmp_path):
    """A ';' in --filter_args becomes part of an argument of the filter job, which refuses it."""
    marker = tmp_path / "pwned"
    ok_job = ("python3 -c \"import sys,os,json; o=sys.argv[sys.argv.index('--output')+1]; os.makedirs(o); "
              "json.dump({'files': {}}, open(o+'/_manifest.json','w'))\"")
    rec_filter = ("python3 -c \"import sys,os,json; a=sys.argv[1:]; o=a[a.index('--output')+1]; os.makedirs(o); "
                  "json.dump(a, open(o+'/args.json','w')); sys.exit(2 if any(';' in x for x in a) else 0)\"")
    # the words are the filter job's options: checked before anything runs, 'touch' and the path
    # are refused as stray values, and nothing was run by a shell
    with pytest.raises(UsageError, match=f"unknown option.*'touch'.*'{marker}'"):
        refresh(["--root", str(tmp_path / "root"), "--job_cmd", ok_job, "--filter_cmd", rec_filter,
                 f"--filter_args=--config x; touch {marker}", "--", "--input", "in"])
    assert not marker.exists() and not (tmp_path / "root").exists()
    # a ';' inside one word (a config file so named) reaches the filter job as part of that word
    odd = tmp_path / "f; touch pwned.yaml"
    odd.write_text(FILTER)
    with pytest.raises(JobFailed, match="filter job failed"):
        refresh(["--root", str(tmp_path / "root"), "--job_cmd", ok_job, "--filter_cmd", rec_filter,
                 f"--filter_args=--config '{odd}'", "--", "--input", "in"])
    assert not os.path.exists("pwned") and not (tmp_path / "root" / LATEST).exists()
    run_id = next((tmp_path / "root" / "runs").iterdir()).name
    assert str(odd) in json.load(open(tmp_path / "root" / "filtered" / run_id / "args.json"))


def test_a_root_of_an_earlier_version_keeps_its_filter_runs_inside_the_runs(tmp_path):
    """Earlier refreshes wrote a run's filter run inside it (runs/<id>/filtered); they are still
    found, published and pruned with their run, and new filter runs go beside: filtered/<id>."""
    from paracorpus.latest import filter_dir, prune, publish_latest
    from paracorpus.schema import FILTER_MANIFEST, MANIFEST

    root = tmp_path / "root"
    for run_id, legacy in (("r1", True), ("r2", False), ("r3", False)):
        (root / "runs" / run_id).mkdir(parents=True)
        (root / "runs" / run_id / MANIFEST).write_text(json.dumps({"files": {}}))
        where = root / "runs" / run_id / "filtered" if legacy else root / "filtered" / run_id
        where.mkdir(parents=True)
        (where / FILTER_MANIFEST).write_text(json.dumps({"files": {}, "run": run_id}))
        assert filter_dir(str(root), run_id) == str(where)
    assert filter_dir(str(root), "r9") == str(root / "filtered" / "r9")
    for later in ("r2.0123456789abcdef", "r3.0123456789abcdef"):     # filter runs of changed --filter_args
        (root / "filtered" / later).mkdir()
    publish_latest(str(root), "r1")
    assert json.load(open(root / "latest" / "filtered" / FILTER_MANIFEST))["run"] == "r1"
    assert prune(str(root), 1, True, "r1") == ["r2"]                # keeps the newest (r3) and latest (r1)
    assert not (root / "filtered" / "r2").exists() and (root / "filtered" / "r3").exists()
    assert sorted(os.listdir(root / "filtered")) == ["r3", "r3.0123456789abcdef"]       # r2's went with it
    assert (root / "runs" / "r1" / "filtered" / FILTER_MANIFEST).exists()


def test_a_refresh_names_its_run_after_every_run_there_whatever_the_clock():
    """Run ids tell which run is newer (a stopped refresh's run is the newest newer than latest's):
    a run of the same second with a larger random part, or of a host whose clock ran ahead, must
    not sort after the next refresh's."""
    from beam_pipelines.refresh import run_id_after
    from common.names import check_run_id

    ahead = "29991231T235959Z-ffffff"                       # a host whose clock was far ahead
    after = run_id_after(["20260101T000000Z-000000", ahead])
    assert after > ahead and check_run_id(after) == after
    again = run_id_after([ahead, after])
    assert again > after and check_run_id(again) == again
    now = run_id_after(["20260101T000000Z-000000"])          # the usual case: the time's own id
    assert "20260101T000000Z-000000" < now < ahead and now.count("-") == 1


def test_a_refresh_whose_log_was_removed_still_says_why_its_job_stopped(tmp_path):
    """A refresh paused past its lease finds, once resumed, its log removed by the refresh that took
    over (retention of its run); its job stops (exit 75) and the refresh must still say why, from
    the open file (before: FileNotFoundError on the log's name, exit 2)."""
    from beam_pipelines.refresh import _failed, run_log

    path = str(tmp_path / "logs" / "r1.log")
    with run_log(path) as log_file:
        log_file.write("earlier lines\n")
        since = log_file.tell()
        os.remove(path)                              # the other refresh's retention
        log_file.write("error: OUT: this run lost its claim (run r2 holds it now)\n")
        failed = _failed("generation", 75, log_file, since, path)
        log_file.write("the refresh's next line\n")
    assert failed.code == 75
    assert str(failed).startswith("generation job failed (exit 75): OUT: this run lost its claim"), str(failed)
