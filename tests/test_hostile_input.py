"""Hostile input and user mistakes in the generation job: refused before anything is written,
or turned into reject rows, with nothing lost."""
import gzip
import json
import os
import random
import string
import subprocess
import sys

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from beam_pipelines.generate import run
from beam_pipelines.generation.devices import resolve_device
from common.cli import UsageError
from common.names import check_lang_code, check_path_component, check_run_id
from common.shards import ShardError, check_shard, discover_shards, read_shard

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _toy_lines(n, seed):
    from tests.toydata import toy_bitext

    return [f"{s}\t{t}" for s, t in toy_bitext(n, seed=seed)]


def _args(inputs, out, models, *extra):
    return ["--input", ",".join(map(str, inputs)), "--output", str(out),
            "--forward_model", os.path.join(models, "cs-en"), "--backward_model", os.path.join(models, "en-cs"),
            "--preset", "parabank2-cpu", "--num_sets", "1", "--num_samples", "3", "--score_threshold", "20",
            "--dual_xent_threshold", "20", "--num_output_shards", "2", "--device", "cpu", *extra]


def _table(out, name):
    return ds.dataset(os.path.join(out, name), format="parquet").to_table().to_pylist()


# ------------------------------------------------------------------ names that become paths
@pytest.mark.parametrize("code", ["x/../../../../ESC", "..", "cs-en", "C S", "", "cs\n", "ces_" + "x" * 20])
def test_language_codes_that_are_not_codes_are_refused(code):
    with pytest.raises(ValueError, match="not a language code"):
        check_lang_code(code)


def test_path_components_and_run_ids():
    assert check_path_component("part-1.tsv.gz") == "part-1.tsv.gz"
    for bad in ("..", "a/b", ".hidden", "a\x1bb", "a\u202eb", "x" * 300, ""):
        with pytest.raises(ValueError):
            check_path_component(bad)
    assert check_run_id("2026-11-23T10.00_ab12") == "2026-11-23T10.00_ab12"
    for bad in ("../x", "-rf", ".x", "a b", "x" * 101):
        with pytest.raises(ValueError):
            check_run_id(bad)


@pytest.mark.slow
def test_traversal_through_src_lang_writes_nothing(tmp_path, tiny_nmt_models):
    inp = tmp_path / "in.tsv"
    inp.write_text("\n".join(_toy_lines(5, 1)) + "\n")
    out = tmp_path / "a" / "b" / "out"
    with pytest.raises(UsageError, match="not a language code"):
        run(_args([inp], out, tiny_nmt_models, "--src_lang", "x/../../../../ESC"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.tsv"]


def test_shard_names_with_control_characters_are_refused(tmp_path):
    bad = tmp_path / "evil\x1b[31m.tsv"
    bad.write_text("a\tb\n")
    with pytest.raises(ValueError, match="control or format character"):
        discover_shards([str(bad)], "cs", "en")


# ------------------------------------------------------------------ corrupt shards
def _truncated_gz(path, lines):
    data = gzip.compress(("\n".join(lines) + "\n").encode())
    path.write_bytes(data[: len(data) * 2 // 3])         # cut inside the deflate stream


def test_a_read_error_mid_shard_keeps_the_records_read_and_says_why(tmp_path):
    lines = _toy_lines(400, 2)
    path = tmp_path / "bad.tsv.gz"
    _truncated_gz(path, lines)
    [spec] = discover_shards([str(path)], "cs", "en")
    check_shard(spec)                                    # the head is fine: the driver cannot tell
    records = list(read_shard(spec))
    good, last = records[:-1], records[-1]
    assert 0 < len(good) < 400 and all(r.error is None for r in good)
    assert [f"{r.source}\t{r.reference}" for r in good] == lines[:len(good)]
    assert last.error == "read_error" and last.index == len(good) and "EOFError" in last.detail


def test_shards_that_cannot_be_read_at_all_are_refused_on_the_driver(tmp_path):
    notgz = tmp_path / "x.tsv.gz"
    notgz.write_bytes(b"this is not gzip\n")
    with pytest.raises(ShardError, match="cannot be read"):
        check_shard(discover_shards([str(notgz)], "cs", "en")[0])
    wrong = tmp_path / "wrong.parquet"
    pq.write_table(pa.table({"cs": [1, 2], "en": ["a", "b"]}), wrong)
    with pytest.raises(ShardError, match="'cs' is int64, not text"):
        check_shard(discover_shards([str(wrong)], "cs", "en")[0], "cs", "en")


@pytest.mark.slow
def test_truncated_gz_beside_a_good_shard_loses_nothing(tmp_path, tiny_nmt_models):
    good = tmp_path / "good.tsv"
    good.write_text("\n".join(_toy_lines(12, 3)) + "\n")
    _truncated_gz(tmp_path / "bad.tsv.gz", _toy_lines(300, 4))
    out = tmp_path / "out"
    manifest = run(_args([good, tmp_path / "bad.tsv.gz"], out, tiny_nmt_models, "--keep", "2"))
    counts = manifest["counts"]
    assert counts["reconciled"]
    per_shard = counts["records_read_per_shard"]
    assert per_shard["good.tsv"] == 12 and 1 < per_shard["bad.tsv.gz"] < 300
    rejects = _table(out, "rejects")
    read_errors = [r for r in rejects if r["reason"] == "read_error"]
    assert len(read_errors) == 1 and read_errors[0]["input_shard"] == "bad.tsv.gz"
    assert read_errors[0]["input_index"] == per_shard["bad.tsv.gz"] - 1
    paraphrased = {(r["input_shard"], r["input_index"]) for r in _table(out, "paraphrases")}
    rejected = {(r["input_shard"], r["input_index"]) for r in rejects}
    for shard, n in per_shard.items():               # every record read: a paraphrase or a reject
        assert {(shard, i) for i in range(n)} == {k for k in paraphrased | rejected if k[0] == shard}
    assert any(k[0] == "good.tsv" for k in paraphrased) and any(k[0] == "bad.tsv.gz" for k in paraphrased)


@pytest.mark.slow
def test_a_parquet_shard_of_the_wrong_type_fails_before_anything_is_written(tmp_path, tiny_nmt_models):
    wrong = tmp_path / "wrong.parquet"
    pq.write_table(pa.table({"cs": [1, 2], "en": ["a", "b"]}), wrong)
    with pytest.raises(UsageError, match="not text"):
        run(_args([wrong], tmp_path / "out", tiny_nmt_models))
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ one record's cost
def _hostile_line(seed=0, chars=19_000):
    rng = random.Random(seed)
    word = "".join(rng.choice(string.ascii_letters) for _ in range(chars))
    return f"{word}\t{word}"


_RSS_SCRIPT = r"""
import json, os, resource, sys
sys.path.insert(0, os.environ["ROOT"])
from models.nmt.engines.fairseq_engine import load_translator
from paracorpus.cleaning import CleanPair
from paracorpus.paraphrasing import piece_limits
from paracorpus.steps import DualXentStep, PieceLimitStep
models, bound, lines = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
fwd = load_translator(os.path.join(models, "cs-en"), device="cpu")
bwd = load_translator(os.path.join(models, "en-cs"), device="cpu")
pairs = [CleanPair(str(i), "s", i, *line.split("\t")) for i, line in enumerate(lines)]
limits = piece_limits(fwd, bwd, bound) if bound else (10 ** 9, 10 ** 9)
result = PieceLimitStep(fwd, limits).apply(pairs)
DualXentStep(fwd, bwd, 10.0).score(result.kept)
print(json.dumps({"maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "rejects": [(r.reason, r.detail) for r in result.rejects], "kept": len(result.kept)}))
"""


def _peaks(models, *runs):
    """The peak memory of each (bound, lines) in RUNS, each in a process of its own, all at once
    (a process's peak is its own whatever runs beside it)."""
    procs = [subprocess.Popen([sys.executable, "-c", _RSS_SCRIPT, models, str(bound), json.dumps(lines)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "ROOT": ROOT, "OMP_NUM_THREADS": "1"}) for bound, lines in runs]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-2000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


@pytest.mark.slow
def test_piece_bound_rejects_the_hostile_line_with_bounded_memory(tiny_nmt_models):
    normal = _toy_lines(20, 5)
    base, hostile, unbounded = _peaks(tiny_nmt_models, (250, normal), (250, normal + [_hostile_line()]),
                                      (0, normal + [_hostile_line()]))
    assert hostile["kept"] == 20 and len(hostile["rejects"]) == 1
    reason, detail = hostile["rejects"][0]
    assert reason == "too_many_pieces_src" and int(detail.split()[0]) > 5000
    assert hostile["maxrss_kb"] < 1.2 * base["maxrss_kb"]
    # the control: without the bound the same line costs far more memory
    assert unbounded["kept"] == 21 and unbounded["maxrss_kb"] > 1.5 * base["maxrss_kb"]


# ------------------------------------------------------------------ mistakes refused before writing
def _refused(tmp_path, tiny_nmt_models, *extra, match):
    inp = tmp_path / "in.tsv"
    inp.write_text("\n".join(_toy_lines(5, 1)) + "\n")
    out = tmp_path / "out"
    with pytest.raises(UsageError, match=match):
        run(_args([inp], out, tiny_nmt_models, *extra))
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("extra,match", [
    (("--presett", "paranmt"), r"unknown option\(s\): --presett \(did you mean --preset\?\)"),
    (("--num-samples", "4"), r"--num-samples \(did you mean --num_samples\?\)"),
    (("stray",), "a value without an option"),
    (("--runner", "NoSuchRunner"), "NoSuchRunner"),
    (("--src_lang", "de", "--tgt_lang", "fr"), "translates cs->en, but this run needs de->fr"),
    (("--torch_threads", "-1"), "torch_threads"),
    (("--num_samples", "0"), "num_samples must be >= 1"),
    (("--encodings", "en=nope"), "unknown charset"),
])
def test_mistakes_are_refused_before_anything_is_written(tmp_path, tiny_nmt_models, extra, match):
    _refused(tmp_path, tiny_nmt_models, *extra, match=match)


@pytest.mark.slow
def test_swapped_models_are_detected(tmp_path, tiny_nmt_models):
    inp = tmp_path / "in.tsv"
    inp.write_text("\n".join(_toy_lines(5, 1)) + "\n")
    args = _args([inp], tmp_path / "out", tiny_nmt_models)
    f, b = args.index("--forward_model") + 1, args.index("--backward_model") + 1
    args[f], args[b] = args[b], args[f]
    with pytest.raises(UsageError, match="swapped"):
        run(args + ["--src_lang", "cs", "--tgt_lang", "en"])
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_swapped_models_are_detected_with_the_default_languages(tmp_path, tiny_nmt_models):
    from beam_pipelines.generation.model_checks import check_models

    with pytest.raises(UsageError, match="swapped"):
        check_models(os.path.join(tiny_nmt_models, "en-cs"), os.path.join(tiny_nmt_models, "cs-en"), "cs", "en")
    with pytest.raises(UsageError, match="backward model must translate en->cs"):
        check_models(os.path.join(tiny_nmt_models, "cs-en"), os.path.join(tiny_nmt_models, "cs-en"), "cs", "en")


@pytest.mark.slow
def test_output_below_a_file_is_refused(tmp_path, tiny_nmt_models):
    (tmp_path / "afile").write_text("x")
    inp = tmp_path / "in.tsv"
    inp.write_text("\n".join(_toy_lines(5, 1)) + "\n")
    with pytest.raises(UsageError, match="is a file, not a directory"):
        run(_args([inp], tmp_path / "afile" / "out", tiny_nmt_models))


def test_device_and_precision_are_checked_for_local_workers(monkeypatch):
    import torch

    import models.nmt.engines.fairseq_engine

    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="no CUDA GPU"):
            resolve_device("cuda", "auto", "DirectRunner")
    assert resolve_device("cpu", "auto", "DirectRunner") == ("cpu", "fp32")
    with pytest.raises(UsageError, match="fp16 decoding needs a GPU"):
        resolve_device("cpu", "fp16", "DirectRunner")
    with pytest.raises(UsageError, match="tf32 is a GPU's"):
        resolve_device("cpu", "tf32", "DirectRunner")
    # the CPU's bf16 support decides; simulate both kinds of CPU
    monkeypatch.setattr(models.nmt.engines.fairseq_engine, "cpu_has_native_bf16", lambda: False)
    with pytest.raises(UsageError, match="AVX512-BF16"):
        resolve_device("cpu", "bf16", "DirectRunner")
    monkeypatch.setattr(models.nmt.engines.fairseq_engine, "cpu_has_native_bf16", lambda: True)
    assert resolve_device("cpu", "bf16", "DirectRunner") == ("cpu", "bf16")
    # remote workers resolve for themselves
    assert resolve_device(None, "bf16", "DataflowRunner") == (None, "bf16")


def test_this_cpus_bf16_answer_matches_its_flags():
    from models.nmt.engines.fairseq_engine import cpu_has_native_bf16

    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else None
    if flags is None:
        pytest.skip("no /proc/cpuinfo to compare with")
    assert cpu_has_native_bf16() == ("avx512_bf16" in flags or "amx_bf16" in flags)


# ------------------------------------------------------------------ a run with nothing to publish
@pytest.mark.slow
def test_a_run_that_rejects_every_record_publishes_nothing_and_exits_3(tmp_path, tiny_nmt_models, capsys):
    from beam_pipelines.generate import main

    good = tmp_path / "good.tsv"
    good.write_text("\n".join(_toy_lines(12, 5)) + "\n")
    out = tmp_path / "out"
    assert main(_args([good], out, tiny_nmt_models)) == 0
    before = json.load(open(out / "_manifest.json"))
    bad = tmp_path / "bad.tsv"                         # the columns joined by commas: no record has a tab
    bad.write_text("\n".join(line.replace("\t", ",") for line in _toy_lines(12, 6)) + "\n")
    capsys.readouterr()
    rc = main(_args([bad], out, tiny_nmt_models, "--overwrite"))
    err = capsys.readouterr().err
    assert rc == 3, err
    error = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "every record was rejected (12 of 12; top reasons: missing_column 12)" in error[0]
    assert "input shard bad.tsv gave no paraphrase" in err
    # the committed run is untouched, its files all there; the refused run's manifest is kept aside
    assert json.load(open(out / "_manifest.json")) == before
    assert all(os.path.exists(os.path.join(out, e["path"])) for t in before["files"].values() for e in t)
    aside = [d for d in os.listdir(out / "_work") if os.path.exists(out / "_work" / d / "manifest.json")]
    assert len(aside) == 1
    # published on request
    assert main(_args([bad], out, tiny_nmt_models, "--overwrite", "--allow_empty")) == 0
    assert json.load(open(out / "_manifest.json"))["counts"]["rejected_by_reason"] == {"missing_column": 12}


@pytest.mark.slow
def test_a_run_that_reads_no_record_exits_3(tmp_path, tiny_nmt_models, capsys):
    from beam_pipelines.generate import main

    empty = tmp_path / "empty.tsv"
    empty.write_text("")
    rc = main(_args([empty], tmp_path / "out", tiny_nmt_models))
    assert rc == 3
    assert "the input shards hold no records" in capsys.readouterr().err
    assert not (tmp_path / "out" / "_manifest.json").exists()
