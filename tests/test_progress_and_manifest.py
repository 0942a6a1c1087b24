"""What a user sees while the job runs (progress lines on stderr, in the default in-memory
DirectRunner too) and what the manifest records about the run."""
import json
import os
import re
import sys

import pytest
from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_progress_lines_show_in_the_terminal_and_the_manifest_records_the_run(tmp_path, tiny_nmt_models):
    inp = tmp_path / "example.tsv"
    with open(os.path.join(ROOT, "examples", "cs-en.example.tsv"), encoding="utf-8") as f:
        inp.write_text("".join(f.readlines()[:30]), encoding="utf-8")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "beam_pipelines.generate", "--input", str(inp), "--output", str(out),
           "--forward_model", os.path.join(tiny_nmt_models, "cs-en"),
           "--backward_model", os.path.join(tiny_nmt_models, "en-cs"),
           "--num_sets", "2", "--num_samples", "10", "--dual_xent_threshold", "-1", "--score_threshold", "-1"]
    done = warm_python.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                           env={**os.environ, "PARAGEN_PROGRESS_SECONDS": "0.1"})
    assert done.returncode == 0, done.stderr[-3000:]
    err = done.stderr
    # inside a unit, lines say which and how far (the heartbeat: a long batch is not silence)
    assert re.search(r"\[generate\] .*\| unit \d+: \d+ of \d+ pairs, \d+s", err), err[-3000:]
    assert re.search(r"generation run \S+: 1 shard\(s\) to decode \(30 records, \d+ work units\)", err)              # the pre-count
    assert re.search(r"\[read\] pairs_read=\d+", err)
    line = re.search(r"\[generate\] .*generate_pairs_in=(\d+).*\| ([\d.]+) pairs/s", err)
    assert line and int(line.group(1)) > 0, err[-3000:]
    assert "counters: " in done.stdout and "reconciled (read = with paraphrases + rejected): True" in done.stdout
    # the engines' first calls happen before any unit, said and counted apart from the units' stages
    assert re.search(r"engines warmed up on cpu in [\d.]+ s", err), err[-3000:]

    manifest = json.load(open(out / "_manifest.json"))
    assert manifest["command"][1:3] == ["--input", str(inp)]
    assert {"paragen", "beam", "torch", "fairseq"} <= set(manifest["versions"]) and manifest["versions"]["fairseq"]
    units = manifest["units"]["written"]
    assert manifest["precision"] == {"requested": "auto", "resolved": "fp32", "workers": {"cpu_fp32": 1},
                                     "units": {"fp32": units}, "mixed": False}
    assert manifest["decode_step"]["workers"] == {"tree": 1}
    assert [entry["precision"] for entry in manifest["inputs"]] == [{"fp32": units}]
    counters = manifest["counters"]
    rejected = {k: v for k, v in counters.items() if k.startswith("rejected_")}
    assert sum(rejected.values()) == manifest["counts"]["rejected"]
    at_generation = {"rejected_dual_xent", "rejected_too_many_pieces_src", "rejected_too_many_pieces_tgt",
                     "rejected_no_candidates", "rejected_no_paraphrase"}
    before = sum(v for k, v in rejected.items() if k not in at_generation)
    assert counters["generate_pairs_in"] + before == manifest["counts"]["records_read"] == 30
    assert counters["ms_warm_up"] > 0 and counters["ms_sample"] > 0


def test_progress_line_has_rate_share_and_eta():
    from transforms.progress import Progress, format_seconds

    p = Progress("generate", rate_of="pairs", expected=1000)
    p._start -= 10.0                        # as if it had run for ten seconds
    p.add("pairs", 250)
    p.add("rejected_x", 3)
    line = p.line()
    assert line.startswith("[generate] pairs=250 rejected_x=3 | ")
    assert "25.0 pairs/s" in line and "~25% of ~1,000" in line and "ETA 30s" in line
    assert format_seconds(3725) == "1h02m" and format_seconds(75) == "1m15s"


def test_a_long_piece_of_work_is_not_silence(caplog):
    """While a worker is inside one unit (or file), the heartbeat logs a line every few seconds even
    though no count changes; none once it is idle."""
    import logging
    import time

    from transforms.progress import Progress

    def heartbeat():       # this logger's lines only: an earlier test's Dask client may still log
        return [r.getMessage() for r in caplog.records if r.name == "paragen.progress"]

    p = Progress("generate", every_seconds=0.2, rate_of="pairs")
    with caplog.at_level(logging.INFO, logger="paragen.progress"):
        p.working("unit 3: 0 of 500 pairs")
        time.sleep(1.0)
        busy = heartbeat()
        p.idle()
        time.sleep(0.6)
    assert len(busy) >= 2 and all("unit 3: 0 of 500 pairs" in m for m in busy), busy
    assert len(heartbeat()) - len(busy) <= 1             # at most one line that was being written


def test_progress_interval_follows_the_environment(monkeypatch):
    from transforms.progress import progress_seconds

    monkeypatch.setenv("PARAGEN_PROGRESS_SECONDS", "2.5")
    assert progress_seconds() == 2.5
    monkeypatch.delenv("PARAGEN_PROGRESS_SECONDS")
    assert progress_seconds() in (5.0, 30.0)


def test_the_filter_job_reports_progress_while_it_scores_a_file(tmp_path, monkeypatch, caplog):
    import logging
    import time

    from beam_pipelines.filter import run
    from tests.toydata import paraphrase_rows, toy_paraphrases, write_generation_run

    gen = write_generation_run(tmp_path / "gen", paraphrase_rows(toy_paraphrases(9000, seed=2)), shards=1)
    cfg = tmp_path / "f.yaml"
    cfg.write_text("filters:\n  - name: ngram_overlap\n    thresholds: {trigram_overlap: {max: 0.9}}\n")
    monkeypatch.setenv("PARAGEN_PROGRESS_SECONDS", "0.1")
    # scoring made slower (the real scores, half a second more per batch), as a big file would be
    import filtering.scoring as scoring

    real = scoring.score_table

    def slow_score_table(*args, **kwargs):
        time.sleep(0.5)
        return real(*args, **kwargs)
    monkeypatch.setattr(scoring, "score_table", slow_score_table)
    with caplog.at_level(logging.INFO, logger="paragen.progress"):
        run(["--input", gen, "--output", str(tmp_path / "f"), "--config", str(cfg), "--no_report"])
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[filter]")]
    assert any(re.search(r"rows=\d+ .*\| cs-en/00000/part-\S+\.parquet: [\d,]+ rows", m) for m in lines), lines
