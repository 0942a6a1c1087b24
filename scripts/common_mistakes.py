"""Run the common mistakes users make with the paragen commands and record what each prints.

    .venv/bin/python scripts/common_mistakes.py --models runs/example-models --write docs/common-mistakes.md

Every case must end with exit status 2, one 'error: ...' line, no traceback, and nothing written
where the command would have written. The table it writes (docs/common-mistakes.md) is generated
here, so it stays true; tests/test_common_mistakes.py runs every case. Paths in the messages are
shown as $WORK (a scratch directory) and $MODELS (the model directory given).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "cs-en.example.tsv")


@dataclass(frozen=True)
class Case:
    title: str
    module: str
    args: tuple                         # $OUT: a fresh path for this case, which must not exist afterwards
    protect: str | None = None          # a path under $WORK whose files must be unchanged afterwards
    when: str | None = None             # a machine condition ('no_gpu', 'no_bf16'); skipped otherwise
    env: tuple = ()                     # (name, value) pairs set for the command


# an S3 endpoint and a GCS emulator where nothing listens, and a short wait for them
_UNREACHABLE = (("AWS_ENDPOINT_URL", "http://127.0.0.1:9"), ("AWS_ACCESS_KEY_ID", "x"),
                ("AWS_SECRET_ACCESS_KEY", "y"), ("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9"),
                ("PARAGEN_STORAGE_TIMEOUT", "4"), ("PARAGEN_STORAGE_RETRY_SECONDS", "4"))
_NMT = ("--output", "$OUT")


def _gen(*extra, output="$OUT", fwd="$MODELS/cs-en", bwd="$MODELS/en-cs", inp="$WORK/in.tsv"):
    return ("--input", inp, "--output", output, "--forward_model", fwd, "--backward_model", bwd, *extra)


CASES = [
    Case("option misspelt", "beam_pipelines.generate", _gen("--presett", "paranmt")),
    Case("dashes instead of underscores", "beam_pipelines.generate", _gen("--num-samples", "4")),
    Case("a stray value", "beam_pipelines.generate", _gen("paranmt")),
    Case("unknown runner", "beam_pipelines.generate", _gen("--runner", "DirectRuner")),
    Case("languages the models do not translate", "beam_pipelines.generate",
         _gen("--src_lang", "de", "--tgt_lang", "fr")),
    Case("forward and backward models swapped", "beam_pipelines.generate",
         _gen(fwd="$MODELS/en-cs", bwd="$MODELS/cs-en")),
    Case("a language code with path components", "beam_pipelines.generate", _gen("--src_lang", "x/../../ESC")),
    Case("--output below a file", "beam_pipelines.generate", _gen(output="$WORK/afile/out"), protect="afile"),
    Case("--output holds a run, no --overwrite", "beam_pipelines.generate", _gen(output="$WORK/done"),
         protect="done"),
    Case("--device cuda without a GPU", "beam_pipelines.generate", _gen("--device", "cuda"), when="no_gpu"),
    Case("--precision bf16 on a CPU without bf16", "beam_pipelines.generate",
         _gen("--device", "cpu", "--precision", "bf16"), when="no_bf16"),
    Case("--precision fp16 on the CPU", "beam_pipelines.generate", _gen("--device", "cpu", "--precision", "fp16")),
    Case("no process per GPU", "beam_pipelines.generate", _gen("--processes_per_gpu", "0")),
    Case("input file missing", "beam_pipelines.generate", _gen(inp="$WORK/nope.tsv")),
    Case("Moses file without its twin", "beam_pipelines.generate", _gen(inp="$WORK/corpus.cs")),
    Case("Parquet text column of the wrong type", "beam_pipelines.generate", _gen(inp="$WORK/ints.parquet")),
    Case("a .gz input that is not gzip", "beam_pipelines.generate", _gen(inp="$WORK/notgz.tsv.gz")),
    Case("model directory missing", "beam_pipelines.generate", _gen(fwd="$WORK/no-model")),
    Case("model checkpoint carrying code in its config", "beam_pipelines.generate", _gen(fwd="$WORK/hostile-model")),
    Case("model.pt that is a pickled object", "beam_pipelines.generate", _gen(fwd="$WORK/pickled-model")),
    Case("a setting out of range", "beam_pipelines.generate", _gen("--num_samples", "0")),
    Case("filter: unknown preset", "beam_pipelines.filter",
         ("--input", "$WORK/gen", "--output", "$OUT", "--config", "paranmtt")),
    Case("filter: input is not a generation run", "beam_pipelines.filter",
         ("--input", "$WORK/afile", "--output", "$OUT")),
    Case("filter: option misspelt", "beam_pipelines.filter",
         ("--input", "$WORK/gen", "--output", "$OUT", "--encodr", "x")),
    Case("filter: --output is the run it reads", "beam_pipelines.filter",
         ("--input", "$WORK/gen", "--output", "$WORK/gen", "--config", "paranmt"), protect="gen"),
    Case("embeddings: --output inside the run it reads", "embeddings.train",
         ("--input", "$WORK/gen", "--output", "$WORK/gen/encoder"), protect="gen"),
    Case("embeddings: malformed --where", "embeddings.train",
         ("--input", "$WORK/gen", "--output", "$OUT", "--where", "rank<<2")),
    Case("embeddings: --where on a column that does not exist", "embeddings.train",
         ("--input", "$WORK/gen", "--output", "$OUT", "--where", "rnak <= 2")),
    Case("embeddings: --where comparing a number with text", "embeddings.train",
         ("--input", "$WORK/gen", "--output", "$OUT", "--where", "rank <= 'two'")),
    Case("embeddings: --output holds a model, no --overwrite", "embeddings.train",
         ("--input", "$WORK/gen", "--output", "$WORK/encoder"), protect="encoder"),
    Case("embeddings: input missing", "embeddings.train", ("--input", "$WORK/nope", "--output", "$OUT")),
    Case("sts: model directory missing", "embeddings.sts",
         ("--model", "$WORK/no-model", "--sts_dir", "$WORK/sts", "--json", "$OUT")),
    Case("sts: weights.pt that is a pickled object", "embeddings.sts",
         ("--model", "$WORK/pickled-encoder", "--sts_dir", "$WORK/sts", "--json", "$OUT")),
    Case("lexicon: --model without --min_score", "embeddings.lexicon",
         ("--input", "$WORK/gen", "--model", "$WORK/encoder", "--output", "$OUT")),
    Case("train-nmt: --tsv file missing", "models.nmt.train",
         ("--tsv", "$WORK/nope.tsv", "--output", "$OUT")),
    Case("train-nmt: --src_file without --tgt_file", "models.nmt.train",
         ("--src_file", "$WORK/corpus.cs", "--output", "$OUT")),
    # a second round of hostile use
    Case("a second --input that is an empty directory", "beam_pipelines.generate",
         _gen(inp="$WORK/in.tsv,$WORK/empty-dir")),
    Case("a second --input glob that matches nothing", "beam_pipelines.generate",
         _gen(inp="$WORK/in.tsv,$WORK/nothing-*.tsv")),
    Case("a run's paraphrases/ as --input", "beam_pipelines.generate", _gen(inp="$WORK/gen/paraphrases")),
    Case("--max_line_chars that rejects every record", "beam_pipelines.generate", _gen("--max_line_chars", "0")),
    Case("a published file size of 0 rows", "beam_pipelines.generate", _gen("--file_rows", "0")),
    Case("--rate without --dry_run", "beam_pipelines.generate", _gen("--rate", "5")),
    Case("--score_threshold nan", "beam_pipelines.generate", _gen("--score_threshold", "nan")),
    Case("--max_length_ratio below 1", "beam_pipelines.generate", _gen("--max_length_ratio", "-1")),
    Case("--previous that holds no run", "beam_pipelines.generate", _gen("--previous", "$WORK/nope")),
    Case("--previous whose manifest is not one", "beam_pipelines.generate", _gen("--previous", "$WORK/garbage-run")),
    Case("a model directory whose spm.model is garbage", "beam_pipelines.generate", _gen(fwd="$WORK/bad-spm-model")),
    Case("a model directory whose dict.cs.txt is not a dictionary", "beam_pipelines.generate",
         _gen(fwd="$WORK/bad-dict-model")),
    Case("a model.json nested 200,000 deep", "beam_pipelines.generate", _gen(fwd="$WORK/deep-json-model")),
    Case("an s3:// input whose endpoint cannot be reached", "beam_pipelines.generate",
         _gen(inp="s3://bucket/corpus/"), env=_UNREACHABLE),
    Case("an s3:// model directory whose endpoint cannot be reached", "beam_pipelines.generate",
         _gen(fwd="s3://bucket/models/cs-en"), env=_UNREACHABLE),
    Case("a gs:// output with no storage answering", "beam_pipelines.generate",
         _gen(output="gs://bucket/out"), env=_UNREACHABLE),
    Case("hdfs:// without Hadoop and Java", "beam_pipelines.generate", _gen(inp="hdfs://namenode:8020/corpus/"),
         env=(("JAVA_HOME", ""), ("HADOOP_HOME", ""), ("ARROW_LIBHDFS_DIR", ""))),
    Case("filter: --spm_model that is not a sentencepiece model", "beam_pipelines.filter",
         ("--input", "$WORK/gen", "--output", "$OUT", "--config", "$WORK/pieces.yaml", "--spm_model", "$WORK/afile")),
    Case("filter: a config nested 100,000 deep", "beam_pipelines.filter",
         ("--input", "$WORK/gen", "--output", "$OUT", "--config", "$WORK/deep.yaml")),
    Case("refresh: a filter config that does not exist", "beam_pipelines.refresh",
         ("--root", "$OUT", "--filter_args=--config $WORK/nope.yaml", "--", *_gen()[:2], *_gen()[4:])),
    Case("refresh: --keep 0", "beam_pipelines.refresh", ("--root", "$OUT", "--keep", "0", "--", *_gen()[:2])),
    Case("train-nmt: the same language on both sides", "models.nmt.train",
         ("--tsv", "$WORK/in.tsv", "--src_lang", "en", "--tgt_lang", "en", *_NMT)),
    Case("train-nmt: --vocab_size 0", "models.nmt.train", ("--tsv", "$WORK/in.tsv", "--vocab_size", "0", *_NMT)),
    Case("train-nmt: --max_epoch -1", "models.nmt.train", ("--tsv", "$WORK/in.tsv", "--max_epoch", "-1", *_NMT)),
    Case("train-nmt: an empty file", "models.nmt.train", ("--tsv", "$WORK/empty.tsv", *_NMT)),
    Case("train-nmt: a comma-separated file", "models.nmt.train", ("--tsv", "$WORK/commas.csv", *_NMT)),
    Case("import-model: a checkpoint of the other direction", "models.nmt.importing",
         ("$MODELS/cs-en/model.pt", "--data", "$MODELS/cs-en", "--src_lang", "en", "--tgt_lang", "cs", *_NMT)),
    Case("import-model: languages without dictionaries", "models.nmt.importing",
         ("$MODELS/cs-en/model.pt", "--data", "$MODELS/cs-en", "--src_lang", "de", "--tgt_lang", "en", *_NMT)),
    Case("import-model: a codes file that is not BPE codes", "models.nmt.importing",
         ("$MODELS/cs-en/model.pt", "--data", "$MODELS/cs-en", "--src_lang", "cs", "--tgt_lang", "en",
          "--bpe_codes", "$WORK/afile", *_NMT)),
    Case("import-model: a checkpoint carrying code in its config", "models.nmt.importing",
         ("$WORK/hostile-model/model.pt", "--data", "$WORK/hostile-model", "--src_lang", "cs", "--tgt_lang", "en",
          *_NMT)),
    Case("import-model: a pickled object as checkpoint", "models.nmt.importing",
         ("$WORK/pickled-model/model.pt", "--data", "$WORK/pickled-model", "--src_lang", "cs", "--tgt_lang", "en",
          *_NMT)),
    Case("import-model: --compute_type for the fairseq engine", "models.nmt.importing",
         ("$MODELS/cs-en/model.pt", "--data", "$MODELS/cs-en", "--src_lang", "cs", "--tgt_lang", "en",
          "--engine", "fairseq", "--compute_type", "int8", *_NMT)),
    Case("import-model: a transformers directory asking for its own code", "models.nmt.importing",
         ("$WORK/remote-code", "--src_lang", "cs", "--tgt_lang", "en", "--engine", "ctranslate2", *_NMT)),
    Case("import-model: language tokens for a fairseq model", "models.nmt.importing",
         ("$MODELS/cs-en/model.pt", "--data", "$MODELS/cs-en", "--src_lang", "cs", "--tgt_lang", "en",
          "--engine", "ctranslate2", "--src_lang_code", "ces_Latn", *_NMT)),
    Case("translate: --model that is not a model directory", "models.nmt.translate", ("--model", "$WORK/afile")),
    Case("translate: --beam 0", "models.nmt.translate", ("--model", "$MODELS/cs-en", "--beam", "0")),
]


def _setup(work: str, models: str) -> None:
    """The files the cases point at, made from the bundled example and MODELS."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from models.nmt.model_files.checkpoint import allow_fairseq_checkpoints

    with open(EXAMPLE, encoding="utf-8") as f:
        lines = f.readlines()[:20]
    with open(os.path.join(work, "in.tsv"), "w", encoding="utf-8") as f:
        f.writelines(lines)
    with open(os.path.join(work, "corpus.cs"), "w", encoding="utf-8") as f:
        f.writelines(line.split("\t")[0] + "\n" for line in lines)
    with open(os.path.join(work, "afile"), "w") as f:
        f.write("a file, not a directory\n")
    os.makedirs(os.path.join(work, "empty-dir"))
    open(os.path.join(work, "empty.tsv"), "w").close()
    with open(os.path.join(work, "commas.csv"), "w", encoding="utf-8") as f:
        f.writelines(line.replace("\t", ",") for line in lines)
    with open(os.path.join(work, "deep.yaml"), "w") as f:
        f.write("[" * 100_000)
    with open(os.path.join(work, "pieces.yaml"), "w") as f:
        f.write("filters:\n  - name: bag_of_pieces\n")
    os.makedirs(os.path.join(work, "remote-code"))
    with open(os.path.join(work, "remote-code", "config.json"), "w") as f:
        json.dump({"model_type": "marian", "auto_map": {"AutoModelForSeq2SeqLM": "modeling_x.Model"}}, f)
    os.makedirs(os.path.join(work, "garbage-run"))
    with open(os.path.join(work, "garbage-run", "_manifest.json"), "w") as f:
        f.write("[1, 2, 3]")
    with open(os.path.join(work, "notgz.tsv.gz"), "wb") as f:
        f.write(b"plain text pretending to be gzip\n")
    pq.write_table(pa.table({"cs": [1, 2], "en": ["a", "b"]}), os.path.join(work, "ints.parquet"))
    os.makedirs(os.path.join(work, "done", "paraphrases"))
    with open(os.path.join(work, "done", "_manifest.json"), "w") as f:
        json.dump({"run_id": "20260101T000000Z-example", "counts": {"reconciled": True}}, f)
    # a checkpoint whose config would run code if fairseq evaluated it, and a pickled one
    allow_fairseq_checkpoints()
    for name in ("hostile-model", "pickled-model", "bad-spm-model", "bad-dict-model", "deep-json-model"):
        shutil.copytree(os.path.join(models, "cs-en"), os.path.join(work, name))
    for name, content in (("bad-spm-model/spm.model", b"\x00not a sentencepiece model\n" * 8),
                          ("bad-dict-model/dict.cs.txt", b"ahoj\nsvete 3\n"),
                          ("deep-json-model/model.json", b"[" * 200_000)):
        with open(os.path.join(work, name), "wb") as f:
            f.write(content)
    state = torch.load(os.path.join(models, "cs-en", "model.pt"), map_location="cpu", weights_only=True)
    # the marker's path comes from the environment (run_case): a message shows the value cut at 80
    # characters, and a path in it would make the table depend on where the scratch folder is
    state["cfg"]["model"].adaptive_softmax_cutoff = "__import__('os').system('touch $PARAGEN_PWNED') or [1]"
    torch.save(state, os.path.join(work, "hostile-model", "model.pt"))
    torch.save({"model": _Pickled(work)}, os.path.join(work, "pickled-model", "model.pt"))
    # a committed generation run (one Parquet file) and an encoder trained on it, for the other commands
    from paracorpus.commit import attempt_id, new_run_id, publish
    from paracorpus.schema import PARAPHRASES, paraphrase_row
    from paracorpus.units import _write_table

    rows = []
    for i, line in enumerate(lines):
        src, tgt = line.rstrip("\n").split("\t")
        rows.append(paraphrase_row(
            pair_id=f"p{i}", src_lang="cs", tgt_lang="en", source=src, reference=tgt, paraphrase=tgt.lower(),
            rank=1, cluster_id=1, cluster_size=1, forward_nll=1.0, combined_score=1.0, constraint_set=[],
            constraint_set_id=-1, num_sampled=1, num_surviving=1, mode="beam", config_hash="x",
            input_shard="in.tsv", input_index=i))
    gen = os.path.join(work, "gen")
    files = _write_table(gen, PARAPHRASES, rows, "cs-en", 0, 0, attempt_id())
    publish(gen, "_manifest.json", {"run_id": new_run_id(), "counts": {"reconciled": True},
                                    "files": {"paraphrases": files, "rejects": []}}, ("paraphrases",))
    from embeddings.data import PairSource
    from embeddings.train import TrainConfig, train

    train(PairSource(os.path.join(work, "gen")), os.path.join(work, "encoder"),
          TrainConfig(dim=8, epochs=1, progress=False), log=lambda _m: None)
    shutil.copytree(os.path.join(work, "encoder"), os.path.join(work, "pickled-encoder"), ignore=shutil.ignore_patterns("checkpoints"))
    torch.save({"w": _Pickled(work)}, os.path.join(work, "pickled-encoder", "weights.pt"))
    os.makedirs(os.path.join(work, "sts", "toy"))
    with open(os.path.join(work, "sts", "toy", "dev.tsv"), "w") as f:
        f.write("5.0\ta man sits .\ta man is sitting .\n0.0\ta dog runs .\tthe sea is calm .\n")


class _Pickled:
    """A pickled call of eval() that would create $WORK/pwned if it were ever unpickled: stands
    for any Python object a model file must not carry."""

    def __init__(self, work: str):
        self.work = work

    def __reduce__(self):
        return (eval, (f"__import__('pathlib').Path({self.work!r}, 'pwned').touch()",))


def _skip(case: Case) -> str | None:
    import torch

    from models.nmt.engines.fairseq_engine import cpu_has_native_bf16

    if case.when == "no_gpu" and torch.cuda.is_available():
        return "this machine has a GPU"
    if case.when == "no_bf16" and cpu_has_native_bf16() is not False:
        return "this CPU has bf16"
    return None


def _tree(path: str) -> list:
    """Every file under PATH with its size and modification time (a file: itself)."""
    if os.path.isfile(path):
        return [(path, os.path.getsize(path), os.path.getmtime(path))]
    return sorted((os.path.join(d, f), os.path.getsize(os.path.join(d, f)), os.path.getmtime(os.path.join(d, f)))
                  for d, _, fs in os.walk(path) for f in fs)


def run_case(index: int, case: Case, work: str, models: str, launch=subprocess.run) -> dict:
    out = os.path.join(work, f"out-{index}")
    args = [a.replace("$OUT", out).replace("$WORK", work).replace("$MODELS", models) for a in case.args]
    before = _tree(os.path.join(work, case.protect)) if case.protect else None
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PARAGEN_PWNED": os.path.join(work, "pwned")}
    for name, value in case.env:
        if value:
            env[name] = value
        else:
            env.pop(name, None)
    done = launch([sys.executable, "-m", case.module, *args], cwd=ROOT, capture_output=True, text=True,
                  stdin=subprocess.DEVNULL, timeout=600, env=env)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:") or ": error:" in line]
    message = errors[-1] if errors else (done.stderr.strip().splitlines() or [""])[-1]
    for real, shown in ((out, "$OUT"), (work, "$WORK"), (models, "$MODELS")):
        message = message.replace(real, shown)
    wrote = os.path.exists(out) or (case.protect is not None and _tree(os.path.join(work, case.protect)) != before)
    shown_env = " ".join(f"{k}={v}" for k, v in case.env if k.startswith(("AWS_ENDPOINT", "STORAGE_EMULATOR")))
    return {"title": case.title, "command": " ".join(filter(None, (shown_env, _command(case.module), *case.args))),
            "exit": done.returncode, "message": message, "traceback": "Traceback" in done.stderr,
            "wrote": wrote, "code_ran": os.path.exists(os.path.join(work, "pwned"))}


def _command(module: str) -> str:
    return {"beam_pipelines.generate": "paragen-generate", "beam_pipelines.filter": "paragen-filter",
            "embeddings.train": "paragen-train-embeddings", "embeddings.sts": "paragen-sts",
            "embeddings.lexicon": "paragen-lexicon", "models.nmt.train": "paragen-train-nmt",
            "beam_pipelines.refresh": "paragen-refresh", "models.nmt.importing": "paragen-import-model",
            "models.nmt.translate": "paragen-translate"}[module]


def run_all(models: str, jobs: int = 2, launch=subprocess.run) -> list[dict]:
    """Every case's result. LAUNCH: subprocess.run, or a function like it (the suite's forks a
    warm interpreter: tests/warm_python.py)."""
    models = os.path.abspath(models)
    with tempfile.TemporaryDirectory(prefix="paragen-mistakes-") as work:
        _setup(work, models)
        cases = [(i, c) for i, c in enumerate(CASES) if not _skip(c)]
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            results = list(pool.map(lambda ic: run_case(ic[0], ic[1], work, models, launch), cases))
        skipped = [{"title": c.title, "skipped": _skip(c)} for c in CASES if _skip(c)]
    return results + skipped


def ok(result: dict) -> bool:
    """A mistake handled well: exit 2, an error line, no traceback, nothing written, no code run."""
    return result.get("skipped") is not None or (
        result["exit"] == 2 and result["message"].startswith(("error:", "paragen-")) and not result["traceback"]
        and not result["wrote"] and not result["code_ran"])


# Not mistakes: what a run prints when something outside it fails (the one-line errors of
# common/stopping.py, common/storage.py and transforms/units.py; tests/test_faults.py and
# bench/bench_faults.py cause each for real). Written here, not run: the faults need a real run.
FAULTS = """
## When something outside the job fails

Not mistakes: a run that met a fault ends in one line, keeps every committed work unit, and
continues when **the same command** is run again ([operations.md](operations.md#faults-what-survives-what);
`tests/test_faults.py` causes each of these).

| fault | exit status | prints (R: the run id, OUT: --output) |
|---|---|---|
| SIGTERM (preemption, drain) or SIGINT | 143 / 130 | `error: generation run R stopped by SIGTERM; 35 of 60 work units committed in OUT; 2 worker process(es) stopped (1.1s); run the same command again to continue` |
| a worker process killed | 1 | `error: a worker process ended while decoding (exit status 137: SIGKILL; killed, out of memory, or a device error: see the system log); 38 of 60 work units committed in OUT; traceback in OUT/_work/R/error.log; ...; run the same command again to continue` |
| the disk is full | 1 | `error: OUT: No space left on device (ENOSPC) [while running Decode/Units/WriteUnit]; 7 of 18 work units committed in OUT; run the same command again to continue` |
| the store stayed away past the retry budget | 1 | `error: s3://bucket/run/...: the store at http://host:port did not answer or refused (...AWS Error NETWORK_CONNECTION...); timeout 60s (PARAGEN_STORAGE_TIMEOUT); retried for 300s (PARAGEN_STORAGE_RETRY_SECONDS); ...` |
| the store refuses (403, no such bucket) | 2 before the run, 1 during it | `error: s3://bucket/a: the store at http://host:port refused (...AWS Error ACCESS_DENIED...)` |
| a device error other than out-of-memory | 70 | `error: the device of worker process P failed while decoding unit U (AcceleratorError: CUDA error: an illegal memory access was encountered); this process ends (exit status 70) so that its work is done again in a fresh one` |
| the same command after the run committed | 0 | `nothing to do: run R in OUT is committed with this plan (same input shards, models and settings); nothing decoded, nothing published (--overwrite makes it again)` |
"""


def markdown(results: list[dict]) -> str:
    lines = ["# Common mistakes and what they print", "",
             "Generated by `scripts/common_mistakes.py` (each command is run; `$WORK` is a scratch directory, "
             "`$MODELS` the example models of `scripts/quickstart.sh`). Every one exits with status 2 before "
             "writing anything.", "",
             "| mistake | command | prints |", "|---|---|---|"]
    for r in results:
        if r.get("skipped"):
            continue
        msg = r["message"].replace("|", "\\|")
        cmd = r["command"].replace("|", "\\|")
        lines.append(f"| {r['title']} | `{cmd}` | `{msg}` |")
    return "\n".join(lines) + "\n" + FAULTS


def main(argv=None) -> int:
    sys.path.insert(0, ROOT)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=os.path.join(ROOT, "runs", "example-models"),
                    help="directory with cs-en/ and en-cs/ models (default runs/example-models, from quickstart.sh)")
    ap.add_argument("--write", metavar="FILE", help="write the Markdown table here (default: print it)")
    ap.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    a = ap.parse_args(argv)
    if not os.path.isfile(os.path.join(a.models, "cs-en", "model.pt")):
        print(f"error: {a.models}/cs-en/model.pt not found (run scripts/quickstart.sh, or pass --models)",
              file=sys.stderr)
        return 2
    results = run_all(a.models, a.jobs)
    bad = [r for r in results if not ok(r)]
    for r in bad:
        print(f"NOT HANDLED: {json.dumps(r)}", file=sys.stderr)
    table = markdown(results)
    if a.write:
        from common.atomic import write_text

        write_text(a.write, table)
    else:
        print(table)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
