"""The filter job on the paths users take (issue 57): its report appears with its manifest or not
at all, and the same command finishes a run stopped after its manifest. Each stop is a real
signal at a chosen storage operation (common/crash_points.py)."""
import json
import os

from tests.crash_points import FILTER, job, leftovers, rows


def _setup(tmp_path):
    """A synthetic generation run (two partitions) and two filter configs of other thresholds."""
    from tests.toydata import paraphrase_rows, toy_paraphrases, write_generation_run

    gen = write_generation_run(str(tmp_path / "gen"), paraphrase_rows(toy_paraphrases(600, seed=2)), shards=2)
    configs = []
    for name, top in (("a", 0.9), ("b", 0.5)):
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"filters:\n  - name: ngram_overlap\n    thresholds: {{trigram_overlap: {{max: {top}}}}}\n")
        configs.append(str(path))
    return gen, configs


def _report_as_listed(out: str) -> dict:
    """What a reader of OUT's report sees: the report.json its manifest lists, and the manifest."""
    manifest = json.load(open(os.path.join(out, "_filter_manifest.json")))
    listed = [e["path"] for e in manifest["files"]["report"]]
    report = next(p for p in listed if p.endswith("report.json"))
    assert all(os.path.isfile(os.path.join(out, p)) for p in listed), listed
    return {"manifest": manifest, "report": json.load(open(os.path.join(out, report)))}


def test_a_filter_run_stopped_at_its_manifest_leaves_the_published_report_whole(tmp_path):
    """Run A published (trigram_overlap <= 0.9); run B (<= 0.5, --overwrite) is killed just
    before its manifest: the report the manifest lists is still A's, every file of it (the old
    job copied B's report.md, report.json and plots over A's names first)."""
    gen, (a, b) = _setup(tmp_path)
    out = str(tmp_path / "out")
    done = job(["--input", gen, "--output", out, "--config", a], which=FILTER)
    assert done.returncode == 0, done.stderr[-3000:]
    before = _report_as_listed(out)
    files_before = {p: open(os.path.join(out, p), "rb").read() for p in
                    (e["path"] for e in before["manifest"]["files"]["report"])}
    stopped = job(["--input", gen, "--output", out, "--config", b, "--overwrite"],
                  {"PARAGEN_CRASH_AT": "~_filter_manifest.json:KILL"}, which=FILTER)
    assert stopped.returncode == -9, stopped.stderr[-3000:]
    seen = _report_as_listed(out)
    assert seen["manifest"]["run_id"] == before["manifest"]["run_id"]
    assert seen["report"]["kept"] == seen["manifest"]["kept"] == before["manifest"]["kept"]
    assert {p: open(os.path.join(out, p), "rb").read() for p in files_before} == files_before
    again = job(["--input", gen, "--output", out, "--config", b, "--overwrite"], which=FILTER)
    assert again.returncode == 0, again.stderr[-3000:]
    after = _report_as_listed(out)
    assert after["report"]["kept"] == after["manifest"]["kept"] != before["manifest"]["kept"]
    assert not leftovers(out, FILTER)


def test_the_same_filter_command_finishes_a_run_stopped_after_its_manifest(tmp_path):
    """Stopped by SIGTERM at the first delete of its clean-up (published, the stop line says
    'run the same command again to finish it'): the same command, without --overwrite, finishes
    the clean-up and exits 0 (it used to exit 2, 'already holds a filter run')."""
    gen, (a, b) = _setup(tmp_path)
    out = str(tmp_path / "out")
    assert job(["--input", gen, "--output", out, "--config", a], which=FILTER).returncode == 0
    command = ["--input", gen, "--output", str(tmp_path / "out2"), "--config", b]
    stopped = job(command, {"PARAGEN_CRASH_AT": "~/_filter_manifest.json@2+1:TERM"}, which=FILTER)   # after its rename
    assert stopped.returncode == 143 and "run the same command again to finish it" in stopped.stderr, \
        stopped.stderr[-3000:]
    published = rows(str(tmp_path / "out2"), FILTER)
    assert published and leftovers(str(tmp_path / "out2"), FILTER)
    again = job(command, which=FILTER)
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stderr[-3000:]
    assert rows(str(tmp_path / "out2"), FILTER) == published and not leftovers(str(tmp_path / "out2"), FILTER)
    other = job([*command[:-1], a], which=FILTER)                 # another config: refused without --overwrite
    assert other.returncode == 2 and "--overwrite" in other.stderr
