"""The generation job on the paths users take (issue 57): what it decides is decided under its
claim, and the same command finishes whatever a stop left, with nothing left over. Each stop is a
real signal at a chosen storage operation (common/crash_points.py: ``~SUFFIX@K+M:SIG``)."""
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from tests.crash_points import job, leftovers, rows
from tests.jobs import ROOT, quick_args
from tests import warm_python

pytestmark = pytest.mark.slow          # each test runs the job two or three times


@pytest.fixture
def bitext(tmp_path):
    from tests.toydata import toy_bitext

    lines = [f"{s}\t{t}\n" for s, t in toy_bitext(400, seed=31)[:12]]
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.tsv").write_text("".join(lines[:8]))
    (folder / "b.tsv").write_text("".join(lines[8:]))
    return folder


def _stopped(proc, timeout=600):
    from tests.test_fencing import _stopped as wait

    wait(proc, timeout)


def test_a_start_that_planned_before_another_published_does_not_replace_it(tmp_path, bitext, tiny_nmt_models):
    """A (no --overwrite, an empty output) is paused at its first step on the output; B (other
    settings) publishes meanwhile; A resumes: everything A decides (new run, nothing to replace)
    is decided under its claim, after B, so it refuses to replace B's run without --overwrite
    (the old code had planned before claiming and published over B)."""
    out = tmp_path / "out"
    args = quick_args(str(bitext), out, tiny_nmt_models)
    a = warm_python.popen([sys.executable, "-m", "beam_pipelines.generate", *args], cwd=ROOT, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env={**os.environ, "PYTHONPATH": ROOT, "PARAGEN_CRASH_AT": "~-_owner.json:STOP"})
    try:
        _stopped(a)
        b = job([*args, "--num_samples", "2"])
        assert b.returncode == 0, b.stderr[-3000:]
        published = rows(str(out))
    finally:
        a.send_signal(signal.SIGCONT)
    _out, err = a.communicate(timeout=600)
    assert a.returncode == 2 and "already holds a committed run" in err and "--overwrite" in err, err[-3000:]
    assert rows(str(out)) == published and not leftovers(str(out))


def test_previous_output_itself_stopped_after_its_manifest_is_finished_by_the_same_command(tmp_path, bitext,
                                                                                        tiny_nmt_models):
    """``--previous OUT --output OUT`` with a shard added, stopped by SIGTERM just after its
    manifest: the same command finds nothing changed since OUT (its own run), and finishes the
    clean-up first (it used to return 'nothing changed' and leave the unit files and _work)."""
    out = tmp_path / "out"
    shutil.copy(bitext / "a.tsv", tmp_path / "first.tsv")
    first = job(quick_args(str(tmp_path / "first.tsv"), out, tiny_nmt_models))
    assert first.returncode == 0, first.stderr[-3000:]
    command = [*quick_args(str(bitext), out, tiny_nmt_models), "--previous", str(out), "--overwrite"]
    stopped = job(command, {"PARAGEN_CRASH_AT": "~/_manifest.json@2+1:TERM"})
    assert stopped.returncode == 143 and "is published" in stopped.stderr, stopped.stderr[-3000:]
    published = rows(str(out))
    assert leftovers(str(out))
    again = job(command)
    assert again.returncode == 0 and "finished the clean-up" in again.stdout, again.stderr[-3000:]
    assert "nothing changed" in again.stdout
    assert rows(str(out)) == published and not leftovers(str(out))


def test_a_kill_between_a_manifests_sync_and_its_rename_leaves_no_hidden_file(tmp_path, bitext, tiny_nmt_models):
    """SIGKILL after the manifest's version was written under its hidden temporary name and
    synced, before its link: nothing is published, and the same command publishes and leaves
    nothing behind (the temporary file stayed for good once)."""
    out = tmp_path / "out"
    args = quick_args(str(bitext), out, tiny_nmt_models)
    stopped = job(args, {"PARAGEN_CRASH_AT": "~-_manifest.json@2:KILL"})
    assert stopped.returncode == -9 and rows(str(out)) is None
    assert any(n.endswith("-_manifest.json." + n.rsplit(".", 2)[-2] + ".tmp") for n in os.listdir(out / "_log"))
    again = job(args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert rows(str(out)) and not leftovers(str(out)), leftovers(str(out))


def test_a_clean_up_cut_inside_the_runs_work_folder_is_finished_not_fatal(tmp_path, bitext, tiny_nmt_models):
    """A run published, then killed while its _work was being removed: the clean-up had removed
    the files the manifest does not list (its unit files among them) and, inside _work, groups/
    (a removal goes child by child), leaving the plan and the unit records. Rerun with --overwrite
    (the command that made it) used to continue that run, whose unit records name removed files,
    and fail in compaction every time; it finishes the clean-up, then makes the run again."""
    from paracorpus.commit import file_location

    out = tmp_path / "out"
    args = quick_args(str(bitext), out, tiny_nmt_models)
    assert job([*args, "--num_samples", "2"]).returncode == 0
    command = [*args, "--overwrite"]
    stopped = job(command, {"PARAGEN_CRASH_AT": "~/_manifest.json@2+1:KILL"})
    assert stopped.returncode == -9
    published = rows(str(out))
    manifest = json.load(open(out / "_manifest.json"))
    listed = {file_location(str(out), f) for files in manifest["files"].values() for f in files}
    for table in ("paraphrases", "rejects", "dedup"):          # the clean-up's first part, done
        for path in (out / table).rglob("*.parquet"):
            if str(path) not in listed:
                path.unlink()
    (run_id,) = os.listdir(out / "_work")
    shutil.rmtree(out / "_work" / run_id / "groups")           # and the start of _work's removal
    assert (out / "_work" / run_id / "plan.json").exists() and (out / "_work" / run_id / "units").exists()
    again = job(command)
    assert again.returncode == 0, again.stderr[-3000:]
    assert rows(str(out)) == published and not leftovers(str(out))
