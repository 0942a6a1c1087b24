"""What a generation run's manifest says of how it ran comes from the records its workers wrote
(the same on every runner: Beam's Dask runner reports no metrics), and rows decoded in two
precisions are recorded and said, never mixed silently: write_unit -> compact_group ->
record_counters / run_setups -> the manifest's precision."""
from collections import Counter

from beam_pipelines.generation.outcome import precisions_of
from paracorpus.cleaning import pair_id
from paracorpus.compaction import FileTarget, compact_group
from paracorpus.schema import reject_row
from paracorpus.units import UnitResult, record_counters, run_setups, summarize_run, write_unit


def _unit(shard: str, unit: int, precision: str) -> UnitResult:
    item = {"pair_id": pair_id(shard, unit, f"věta {unit}", f"sentence {unit}"), "input_shard": shard,
            "input_index": unit, "source": f"věta {unit}", "reference": f"sentence {unit}"}
    return UnitResult(rejects=[reject_row(item, "generate", "no_paraphrase", None, "h")],
                      counters=Counter(ms_sample=5, generate_pairs_in=1, **({"ms_warm_up": 700} if unit == 0 else {})),
                      setup={"device": "cuda", "precision": precision, "decode_step": "fixed"})


def test_counters_and_precisions_are_summed_from_the_unit_records(tmp_path):
    out, work = str(tmp_path / "out"), str(tmp_path / "out" / "_work" / "r1")
    # an A100 worker (auto: tf32) took units 0-2 of a.tsv, a V100 (auto: fp32) 3 of a.tsv and b.tsv's 4
    plan = [("a.tsv", 0, "tf32"), ("a.tsv", 1, "tf32"), ("a.tsv", 2, "tf32"), ("a.tsv", 3, "fp32"), ("b.tsv", 4, "fp32")]
    records = [write_unit(out, work, unit, 0, "cs-en", _unit(shard, unit, precision), 1.0, shard)
               for shard, unit, precision in plan]
    group = compact_group(out, work, "cs-en", "b0", 0, records, [], FileTarget())
    reads = [{"input_shard": "a.tsv", "records_read": 4}, {"input_shard": "b.tsv", "records_read": 1}]
    counts, _files, _units, shards = summarize_run([group], reads)

    counters = record_counters([group], counts)
    assert counters["ms_sample"] == 25 and counters["generate_pairs_in"] == 5 and counters["ms_warm_up"] == 700
    assert counters["records_read"] == 5 and counters["rejected_no_paraphrase"] == 5

    setups = run_setups([group])
    assert setups["units"] == {"fp32": 2, "tf32": 3} and setups["decode_steps"] == {"fixed": 1}
    assert setups["workers"] == {"cuda_fp32": 1, "cuda_tf32": 1}         # one process here wrote all five
    assert setups["per_shard"] == {"a.tsv": {"fp32": 1, "tf32": 3}, "b.tsv": {"fp32": 1}}
    entries = {name: {"precision": p} for name, p in setups["per_shard"].items()}
    assert precisions_of(entries) == {"fp32", "tf32"}
    # a shard reused from an earlier run keeps what its entry said; entries of code before setups none
    assert precisions_of({"old.tsv": {}, "b.tsv": {"precision": {"fp32": 1}}}) == {"fp32"}


def test_records_of_code_before_setups_count_no_precision(tmp_path):
    out, work = str(tmp_path / "out"), str(tmp_path / "out" / "_work" / "r1")
    result = _unit("a.tsv", 0, "fp32")
    result.setup = {}
    group = compact_group(out, work, "cs-en", "b0", 0, [write_unit(out, work, 0, 0, "cs-en", result, 1.0, "a.tsv")],
                          [], FileTarget())
    assert run_setups([group]) == {"workers": {}, "decode_steps": {}, "units": {}, "per_shard": {}, "gpu_workers": {}}


def test_gpu_sharing_is_what_the_workers_recorded(tmp_path):
    """On Dask or SLURM the launcher runs the MPS daemon, not the job: the driver's own state says
    "cpu" (it started none), so the manifest takes whether MPS was on from the workers' records."""
    from beam_pipelines.generation.outcome import gpu_sharing_of

    out, work = str(tmp_path / "out"), str(tmp_path / "out" / "_work" / "r1")
    result = _unit("a.tsv", 0, "fp32")
    result.setup["mps"] = True
    group = compact_group(out, work, "cs-en", "b0", 0, [write_unit(out, work, 0, 0, "cs-en", result, 1.0, "a.tsv")],
                          [], FileTarget())
    gpu = run_setups([group])["gpu_workers"]
    assert gpu == {"mps": 1, "no_mps": 0}
    driver = {"processes_per_gpu": 2, "mps": {"on": False, "how": "cpu"}}
    on_cluster = gpu_sharing_of(driver, gpu, False, 2)
    assert on_cluster["mps"] == {"on": True, "how": "the workers' launcher"} and on_cluster["workers"] == gpu
    assert gpu_sharing_of(driver, gpu, True, 2)["mps"] == driver["mps"]        # this machine: the job's daemon
    assert gpu_sharing_of(None, gpu, False, 3) == {"processes_per_gpu": 3, "workers": gpu,
                                                   "mps": {"on": True, "how": "the workers' launcher"}}
    assert gpu_sharing_of(None, {}, False, 1) is None                          # nothing decoded on a GPU
    result.setup["mps"] = None                                                 # a CPU worker: not counted
    result.setup["device"] = "cpu"
    group = compact_group(out, str(tmp_path / "w2"), "cs-en", "b0", 0,
                          [write_unit(out, str(tmp_path / "w2"), 0, 0, "cs-en", result, 1.0, "a.tsv")], [], FileTarget())
    assert run_setups([group])["gpu_workers"] == {}


def test_a_unit_whose_run_lost_its_output_while_its_files_were_written_leaves_none(tmp_path):
    """A worker that passed the fence before its unit's files and finds its claim gone at the look
    before the record (paused past a takeover in between: the new holder's clean-up ran before
    the files existed) removes them before it raises: no file no run lists, no record."""
    import os

    import pytest

    from common.cli import OutputBusy
    from paracorpus.units import unit_record_path

    from common import storage

    out, work = str(tmp_path / "out"), str(tmp_path / "out" / "_work" / "r1")
    looks = []

    def fence():
        looks.append(len(looks))
        if len(looks) == 2:
            assert list((tmp_path / "out").rglob("*.parquet"))        # written between the two looks
            raise OutputBusy(f"{out}: lost its claim")

    def writes_fence():      # the process's own fence on OUTPUT (a driver's), refusing from then on too
        if len(looks) >= 2:
            raise OutputBusy(f"{out}: lost its claim")

    storage.fence_writes(out, writes_fence)
    try:
        with pytest.raises(OutputBusy, match="lost its claim"):
            write_unit(out, work, 0, 0, "cs-en", _unit("a.tsv", 0, "fp32"), 1.0, "a.tsv", fence=fence)
    finally:
        storage.unfence_writes(out)
    assert len(looks) == 2
    assert not list((tmp_path / "out").rglob("*.parquet"))
    assert not os.path.exists(unit_record_path(work, 0))


def test_a_unit_refused_by_its_processs_write_fence_at_a_later_file_leaves_none(tmp_path, monkeypatch):
    """The process's own write fence on OUTPUT (a driver that runs units in-process) refusing at a
    unit's second file, its claim lost after the first was written: the write refused takes back
    its own file, and the unit the files it wrote before; no record."""
    import os

    import pytest

    import paracorpus.units
    from common import storage
    from common.cli import OutputBusy
    from paracorpus.units import unit_record_path

    monkeypatch.setattr(paracorpus.units, "MAX_FILE_ROWS", 1)        # two rejects: two files
    out, work = str(tmp_path / "out"), str(tmp_path / "out" / "_work" / "r1")
    result = _unit("a.tsv", 0, "fp32")
    item = {"pair_id": pair_id("a.tsv", 1, "věta 1", "sentence 1"), "input_shard": "a.tsv", "input_index": 1,
            "source": "věta 1", "reference": "sentence 1"}
    result.rejects.append(reject_row(item, "generate", "no_paraphrase", None, "h"))
    looks = []

    def writes_fence():      # a look before and after each file: the third is the second file's first
        looks.append(len(looks))
        if len(looks) >= 3:
            assert list((tmp_path / "out").rglob("*.parquet"))        # the first file was written
            raise OutputBusy(f"{out}: lost its claim")

    storage.fence_writes(out, writes_fence)
    try:
        with pytest.raises(OutputBusy, match="lost its claim"):
            write_unit(out, work, 0, 0, "cs-en", result, 1.0, "a.tsv")
    finally:
        storage.unfence_writes(out)
    assert len(looks) == 3
    assert not list((tmp_path / "out").rglob("*.parquet"))
    assert not os.path.exists(unit_record_path(work, 0))
