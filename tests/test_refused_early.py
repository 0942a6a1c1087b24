"""Mistakes refused with one line before anything is written (a second round of hostile use):
inputs that yield nothing, settings that would reject every record, unparseable configs and model
files, a training run with nothing to train on."""
import gzip
import json
import os
import subprocess
import sys

import pytest

from common.cli import UsageError, cli_main
from common.shards import check_shard, discover_shards, read_shard

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tsv(path, n=5):
    path.write_text("".join(f"ahoj {i}\thello {i}\n" for i in range(n)))
    return str(path)


# ------------------------------------------------------------------ inputs that yield nothing
@pytest.mark.parametrize("make", ["empty_dir", "glob", "run_table_dir"])
def test_a_second_input_that_yields_nothing_is_refused_like_a_first(tmp_path, make):
    good = _tsv(tmp_path / "good.tsv")
    if make == "empty_dir":
        (tmp_path / "empty").mkdir()
        bad = str(tmp_path / "empty")
    elif make == "glob":
        bad = str(tmp_path / "nothing-*.tsv")
    else:                                    # a run's paraphrases/: partitions below, no shard in it
        part = tmp_path / "run" / "paraphrases" / "cs-en" / "00000"
        part.mkdir(parents=True)
        (part / "part-u000000-abc.parquet").write_bytes(b"PAR1")
        bad = str(tmp_path / "run" / "paraphrases")
    for inputs in ([bad], [good, bad], [bad, good]):
        with pytest.raises(FileNotFoundError, match="no (file|input shard)"):
            discover_shards(inputs, "cs", "en")


# ------------------------------------------------------------------ settings that reject every record
def _generate_args(tmp_path, *extra):
    inp = _tsv(tmp_path / "in.tsv")
    return ["--input", inp, "--output", str(tmp_path / "out"), "--forward_model", str(tmp_path / "no-model"),
            *extra]


@pytest.mark.parametrize("extra, message", [
    (("--max_line_chars", "0"), "--max_line_chars must be >= 3"),
    (("--score_threshold", "nan"), "score_threshold must be a number"),
    (("--dual_xent_threshold", "nan"), "dual_xent_threshold must be a number"),
    (("--max_length_ratio", "-1"), "--max_length_ratio must be >= 1"),
    (("--max_length_ratio", "nan"), "--max_length_ratio must be >= 1"),
    (("--max_tokens", "0"), "--max_tokens must be >= 1"),
    (("--file_rows", "0"), "--file_rows/--file_mb: file target must be >= 1 row"),
    (("--file_mb", "nan"), "--file_rows/--file_mb: file target must be >= 1 row and > 0 MB"),
    (("--dry_run", "--rate", "0"), "--rate is a dry run's decoding speed"),
    (("--rate", "5"), "without --dry_run"),
])
def test_values_that_would_reject_every_record_are_refused_before_models_load(tmp_path, extra, message):
    from beam_pipelines.generate import run

    # the model directory does not exist: the setting is refused first, and nothing is written
    with pytest.raises(UsageError, match=message):
        run(_generate_args(tmp_path, *extra))
    assert not (tmp_path / "out").exists()


def test_bitext_thresholds_must_be_numbers():
    from paracorpus.steps import BitextFilterConfig

    with pytest.raises(ValueError, match="must be a number"):
        BitextFilterConfig(encoder="/x", min_similarity=float("nan")).check()


# ------------------------------------------------------------------ paragen-train-nmt
@pytest.mark.parametrize("extra, content, message", [
    (("--src_lang", "en", "--tgt_lang", "en"), None, "both 'en'"),
    (("--vocab_size", "0"), None, "--vocab_size must be >= 1"),
    (("--max_epoch", "-1"), None, "--max_epoch must be >= 1"),
    (("--dim", "100", "--heads", "3"), None, "not a multiple of --heads"),
    (("--lr", "0"), None, "--lr must be > 0"),
    ((), "", "no training pairs"),
    ((), "ahoj,hello\nnazdar,hi\n", "no training pairs"),
])
def test_train_nmt_refuses_before_creating_its_output(tmp_path, extra, content, message):
    from models.nmt.train import run

    data = tmp_path / "train.tsv"
    data.write_text("ahoj\thello\nnazdar\thi\n" if content is None else content)
    out = tmp_path / "models"
    with pytest.raises(UsageError, match=message):
        run(["--tsv", str(data), "--output", str(out), *extra])
    assert not out.exists()


# ------------------------------------------------------------------ configs and model files that do not parse
def test_a_filter_config_nested_too_deeply_is_one_line(tmp_path):
    from filtering.config import load_config

    deep = tmp_path / "deep.yaml"
    deep.write_text("[" * 100_000)
    with pytest.raises(ValueError, match="nested too deeply|not valid YAML"):
        load_config(str(deep))
    deep_json = tmp_path / "deep.json"
    deep_json.write_text("[" * 100_000)
    with pytest.raises(ValueError, match="nested too deeply"):
        load_config(str(deep_json))


def test_a_model_json_nested_too_deeply_is_one_line(tmp_path):
    from models.safety import UnsafeModelError
    from models.nmt.model_files.model_dir import read_model_meta

    for name in ("model.pt", "spm.model"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "model.json").write_text("[" * 200_000)
    with pytest.raises(UnsafeModelError, match="nested too deeply"):
        read_model_meta(str(tmp_path))


def test_garbage_sentencepiece_and_dictionary_files_are_named(tmp_path):
    from common.text import load_sentencepiece
    from models.nmt.model_files.model_dir import dictionary_size

    garbage = tmp_path / "spm.model"
    garbage.write_bytes(b"\x00not a model" * 10)
    with pytest.raises(ValueError, match="spm.model: not a sentencepiece model"):
        load_sentencepiece(str(garbage))
    bad_dict = tmp_path / "dict.en.txt"
    bad_dict.write_text("hello\nworld 3\n")
    with pytest.raises(UsageError, match="not a fairseq dictionary"):
        dictionary_size(str(bad_dict))
    good = tmp_path / "dict.cs.txt"
    good.write_text("ahoj 3\nsvete 2\n")
    assert dictionary_size(str(good)) == 6           # two symbols and fairseq's four


def test_filter_spm_model_that_is_not_one_is_one_line(tmp_path, capsys):
    from beam_pipelines.filter import main
    from tests.toydata import paraphrase_rows, toy_paraphrases, write_generation_run

    run_dir = write_generation_run(tmp_path / "gen", paraphrase_rows(toy_paraphrases(20, seed=1)))
    garbage = tmp_path / "garbage.model"
    garbage.write_bytes(b"\x00" * 64)
    rc = main(["--input", run_dir, "--output", str(tmp_path / "f"), "--spm_model", str(garbage),
               "--config", str(_config_with_pieces(tmp_path))])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "not a sentencepiece model" in err[0], err
    assert not (tmp_path / "f").exists()


def _config_with_pieces(tmp_path):
    cfg = tmp_path / "pieces.yaml"
    cfg.write_text("filters:\n  - name: bag_of_pieces\n")
    return cfg


def test_a_garbage_previous_manifest_is_one_line(tmp_path):
    from paracorpus.incremental import plan_reuse
    from paracorpus.schema import CONTRACT_VERSION

    prev = tmp_path / "prev"
    prev.mkdir()
    for content, message in (("[1, 2]", "not an object"), ('{"run_id": "x"}', "lacks"), ("{{{", "not valid JSON")):
        (prev / "_manifest.json").write_text(content)
        with pytest.raises(UsageError, match=message):
            plan_reuse(str(prev), [], "hash", 1)
    with pytest.raises(UsageError, match="no _manifest.json"):
        plan_reuse(str(tmp_path / "nowhere"), [], "hash", 1)
    # a file entry whose bin no input names (or without its partition) would be dropped silently
    inputs = [{"input_shard": "a.tsv", "bin": "b1", "counts": {}, "records_read": 1, "sha256": ["x"]}]
    for entry in ({"path": "p.parquet", "rows": 1, "bytes": 1, "bin": "b2", "shard": 0},
                  {"path": "p.parquet", "rows": 1, "bytes": 1, "bin": "b1"}):
        (prev / "_manifest.json").write_text(json.dumps(
            {"contract_version": CONTRACT_VERSION, "run_id": "r", "config_hash": "hash", "inputs": inputs,
             "files": {"paraphrases": [entry]}}))
        with pytest.raises(UsageError, match="lists a paraphrases file that no input shard's bin holds"):
            plan_reuse(str(prev), [], "hash", 1)


# ------------------------------------------------------------------ truncated compressed shards
@pytest.mark.parametrize("lines", [20, 200])
@pytest.mark.parametrize("suffix", [".gz", ".zst", ".bz2", ".xz"])
def test_a_truncated_compressed_shard_keeps_what_it_can_read_whatever_its_size(tmp_path, lines, suffix):
    import bz2
    import lzma

    import zstandard

    compress = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress,
                ".zst": zstandard.ZstdCompressor().compress}[suffix]
    data = compress("".join(f"ahoj svete {i}\thello world {i}\n" for i in range(lines)).encode())
    path = tmp_path / f"cut.tsv{suffix}"
    path.write_bytes(data[: len(data) * 2 // 3])
    spec = discover_shards([str(path)], "cs", "en")[0]
    check_shard(spec)                                   # not refused up front, however short
    records = list(read_shard(spec))
    assert records[-1].error == "read_error"
    assert all(r.error is None for r in records[:-1])
    assert [r.index for r in records] == list(range(len(records)))


# ------------------------------------------------------------------ Beam's import noise
def test_commands_do_not_print_beams_apitools_warning():
    done = subprocess.run([sys.executable, "-m", "beam_pipelines.generate", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "apitools" not in done.stderr, done.stderr


def test_cli_main_reports_job_failures_with_their_status(capsys):
    from common.cli import EXIT_EMPTY, JobFailed

    def fails(_argv):
        raise JobFailed("every record was rejected", EXIT_EMPTY)
    assert cli_main(fails, []) == 3
    assert capsys.readouterr().err.strip() == "error: every record was rejected"


# ------------------------------------------------------------------ an output inside the input
def _generation_run(root):
    from tests.toydata import paraphrase_rows, toy_paraphrases, write_generation_run

    write_generation_run(root, paraphrase_rows(toy_paraphrases(12, seed=2)))
    return root


@pytest.mark.parametrize("where", ["same", "inside", "around", "same_through_a_symlink"])
def test_filter_and_embedding_jobs_refuse_an_output_inside_or_around_their_input(tmp_path, where):
    from beam_pipelines.filter import run as filter_run
    from embeddings.train import run as train_run

    run_dir = _generation_run(tmp_path / "runs" / "gen")
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    output = {"same": run_dir, "inside": run_dir / "filtered", "around": tmp_path / "runs",
              "same_through_a_symlink": tmp_path / "link"}[where]
    if where == "same_through_a_symlink":
        os.symlink(run_dir, output)
        before.append("link")
    with pytest.raises(UsageError, match="the data this job reads"):
        filter_run(["--input", str(run_dir), "--output", str(output), "--config", "paranmt", "--no_report"])
    with pytest.raises(UsageError, match="the data this job reads"):
        train_run(["--input", str(run_dir), "--output", str(output), "--encoder", "word", "--epochs", "1"])
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == sorted(before)   # nothing written


def test_an_output_beside_the_input_is_fine():
    from common.cli import check_apart

    check_apart("/data/runs/gen-filtered", "/data/runs/gen")          # a common prefix is not a parent
    check_apart("s3://b/runs/gen-filtered", "s3://b/runs/gen")
    with pytest.raises(UsageError, match="is inside"):
        check_apart("s3://b/runs/gen/filtered", "s3://b/runs/gen/")
    with pytest.raises(UsageError, match="contains"):
        check_apart("gs://b/runs", "gs://b/runs/gen")


def test_input_takes_what_a_shell_glob_gives(tmp_path):
    """`--input corpus/part-*.tsv.gz` with two or more shards: the shell passes several values after
    one --input (it used to be refused: 'a value without an option')."""
    from beam_pipelines.generation.options import build_parser
    from beam_pipelines.options import check_beam_args

    parser = build_parser()
    opts, rest = parser.parse_known_args(["--input", "a.tsv.gz", "b.tsv.gz", "c.tsv.gz", "--output", "o",
                                          "--forward_model", "m", "--input", "d.tsv"])
    assert opts.input == ["a.tsv.gz", "b.tsv.gz", "c.tsv.gz", "d.tsv"] and check_beam_args(rest, parser) == []


@pytest.mark.parametrize("job, extra", [
    ("generate", ("--direct_num_workers", "abc")),
    ("generate", ("--slurm_workers", "2", "--slurm_gpus_per_worker", "two")),
    ("filter", ("--dask_task_retries", "many")),
])
def test_a_bad_value_of_a_beam_or_slurm_option_is_one_line(tmp_path, job, extra):
    args = _generate_args(tmp_path, *extra) if job == "generate" else ["--input", str(tmp_path / "run"), "--output",
                                                                         str(tmp_path / "out"), *extra]
    done = subprocess.run([sys.executable, "-m", f"beam_pipelines.{job}", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: argument {extra[-2]}"), done.stderr
    assert not (tmp_path / "out").exists()
