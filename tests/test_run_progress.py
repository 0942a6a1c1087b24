"""The driver's progress line (paracorpus/run_progress.py), from unit records alone: units and
pairs committed, the rate over the last minutes by the driver's own clock, an ETA, and units an
earlier attempt committed counted as done but not into the rate. (A Dask run's driver log:
tests/test_generate_pipeline.py.)"""
from common import storage
from paracorpus.run_progress import DriverProgress, RunProgress


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _record(pairs, worker="node1:7"):
    return {"counts": {"records": pairs}, "worker": worker}


def test_units_pairs_rate_and_eta():
    clock = Clock()
    progress = RunProgress(10, expected_pairs=1000, window=300, clock=clock)
    assert progress.line() == "progress: 0 of 10 units (0%), 0 of ~1,000 pairs; no unit committed yet in this attempt"
    clock.now += 60
    progress.saw(0, _record(100))
    progress.saw(1, _record(100, "node2:9"))
    progress.tick()
    # 200 pairs in 60 s: 3.3 pairs/s; 800 left: 4 min
    assert progress.line() == ("progress: 2 of 10 units (20%), 200 of ~1,000 pairs; 3.3 pairs/s over the last 1m00s; "
                               "ETA 4m00s; workers: 2")
    assert progress.line(bar=True).startswith("progress: [####................] 2 of 10 units")


def test_the_rate_is_over_the_window_not_the_whole_run():
    clock = Clock()
    progress = RunProgress(100, clock=clock, window=300)
    for minute in range(10):                  # 10 pairs a minute for ten minutes, then 60 a minute
        clock.now += 60
        progress.saw(minute, _record(10 if minute < 5 else 60))
        progress.tick()
    line = progress.line()
    assert "1.0 pairs/s over the last 5m00s" in line, line        # the last five minutes: 300 pairs
    # no estimate of the pairs: the units left at this attempt's pairs a unit (35) and the rate
    assert "ETA 52m30s" in line, line


def test_units_of_an_earlier_attempt_are_done_but_not_this_attempts_pace():
    clock = Clock()
    progress = RunProgress(4, clock=clock)
    progress.earlier({0, 1})
    progress.saw(0, _record(500))
    progress.saw(1, _record(500))
    progress.tick()
    assert progress.line() == "progress: 2 of 4 units (50%), 1,000 pairs; no unit committed yet in this attempt"
    clock.now += 10
    progress.saw(2, _record(20))
    progress.tick()
    assert "3 of 4 units (75%), 1,020 pairs; 2.0 pairs/s over the last 10s; ETA 10s" in progress.line()


def test_the_driver_reads_new_records_once_and_skips_other_names(tmp_path):
    work = str(tmp_path / "_work" / "run")
    storage.write_json(storage.join(work, "units", "u000000.json"), _record(7))
    storage.write_bytes(storage.join(work, "units", ".u000001.json.abc.tmp"), b"{")    # being written
    watcher = DriverProgress(work, 3, None, every=3600)
    assert watcher.look().startswith("progress: 1 of 3 units (33%), 7 pairs;")
    storage.write_json(storage.join(work, "units", "u1250000.json"), _record(5))
    assert watcher.look().startswith("progress: 2 of 3 units (67%), 12 pairs;")
    assert watcher.read == {0, 1250000}


def test_a_store_that_does_not_answer_skips_a_line_not_the_run(monkeypatch, caplog):
    watcher = DriverProgress("webhdfs://127.0.0.1:1/out/_work/r", 3, None, every=3600)
    monkeypatch.setenv("PARAGEN_STORAGE_RETRY_SECONDS", "0.1")
    with watcher:
        pass                                    # its last look fails: nothing raised
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR") and r.name == "paragen.progress"]


def test_failed_attempts_are_counted_with_their_units_and_those_committed_since():
    progress = RunProgress(10, clock=Clock())
    progress.failed_attempt(3)
    progress.failed_attempt(3)
    progress.failed_attempt(1250000)
    progress.saw(3, _record(4))
    assert progress.line().endswith("; failed attempts: 3 (units 3, 1250000; 1 since committed)")


def test_the_driver_logs_a_workers_failure_record_once_with_its_unit(tmp_path, caplog):
    import logging

    from paracorpus.unit_failures import failures_dir, record_failure, unit_of_failure

    work = str(tmp_path / "_work" / "run")
    storage.write_json(storage.join(work, "units", "u000000.json"), _record(7))
    record_failure(work, 1250001, OSError(28, "No space left on device\nsecond line"), "writing")
    storage.write_bytes(storage.join(failures_dir(work), ".u000002.abc.json.x.tmp"), b"{")     # being written
    assert [unit_of_failure(n) for n in storage.listdir(failures_dir(work))] == [None, 1250001]
    watcher = DriverProgress(work, 3, None, every=3600)
    with caplog.at_level(logging.INFO, logger="paragen.progress"):
        first, again = watcher.look(), watcher.look()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and warnings[0].startswith("unit 1250001 failed on worker ")
    assert warnings[0].endswith(" while writing: OSError: [Errno 28] No space left on device; the runner may run it "
                                "again")
    assert all(line.endswith("; failed attempts: 1 (unit 1250001; 0 since committed)") for line in (first, again))


def test_a_worker_notes_no_failure_for_a_run_whose_work_is_gone(tmp_path):
    from paracorpus.unit_failures import record_failure

    work = tmp_path / "_work" / "published"
    record_failure(str(work), 4, RuntimeError("late"), "writing")
    assert not work.exists()                    # nothing made again where the run's work was removed


def test_no_failure_record_when_the_store_itself_gave_up(tmp_path):
    """Its note would be retried for as long again before the worker's error went back."""
    from common.storage import StorageError
    from paracorpus.unit_failures import failures_dir, record_failure

    work = str(tmp_path / "_work" / "run")
    storage.write_json(storage.join(work, "units", "u000000.json"), _record(7))
    record_failure(work, 3, StorageError("s3://b/x: the store at http://h:9 did not answer", transient=True), "writing")
    assert storage.listdir(failures_dir(work)) == []
    record_failure(work, 3, OSError(5, "Input/output error"), "writing")
    assert len(storage.listdir(failures_dir(work))) == 1
