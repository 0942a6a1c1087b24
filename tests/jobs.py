"""What the tests that run the generation job on the tiny models share: the job's options for a
quick run, and a committed run's rows in a stable order."""
import os
import subprocess
import sys
import time

from common import storage
from paracorpus.commit import committed_files


def quick_args(bitext, out, models, *extra) -> list[str]:
    """The generation job on BITEXT into OUT with the tiny MODELS: few samples, four pairs a unit."""
    return ["--input", bitext, "--output", str(out), "--forward_model", os.path.join(models, "cs-en"),
            "--backward_model", os.path.join(models, "en-cs"), "--num_sets", "2", "--num_samples", "4",
            "--score_threshold", "20", "--dual_xent_threshold", "20", "--num_output_shards", "2",
            "--unit_pairs", "4", "--batch_pairs", "4", "--device", "cpu", *extra]


def refresh_job_args(models) -> list[str]:
    """A refresh's generation-job options (after --, without --input) with the tiny MODELS (a
    folder or a bucket URL): few samples, four pairs a unit, bins of 2 partitions x 4 rows."""
    return ["--forward_model", storage.join(models, "cs-en"), "--backward_model", storage.join(models, "en-cs"),
            "--num_sets", "1", "--num_samples", "3", "--score_threshold", "20", "--dual_xent_threshold", "20",
            "--unit_pairs", "4", "--device", "cpu",
            # bins of 2 partitions x 4 rows: each 10-record shard fills one, so a refresh keeps its files
            "--num_output_shards", "2", "--file_rows", "4"]


def committed_rows(out, table="paraphrases") -> list[dict]:
    """The rows of TABLE that the run committed in OUT lists, sorted (pair, rank, index)."""
    files = committed_files(str(out), table)
    if not files:
        return []
    t = storage.parquet_dataset(files).to_table()
    return sorted(t.to_pylist(), key=lambda r: (r["pair_id"], r.get("rank") or 0, r["input_index"]))


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_job(args, env=None) -> subprocess.Popen:
    """The generation job with ARGS as a process of its own (its own session: a signal to it is
    for it alone), forked from a warm interpreter (tests/warm_python.py)."""
    from tests import warm_python

    return warm_python.popen([sys.executable, "-m", "beam_pipelines.generate", *args], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                             env={**os.environ, "PYTHONPATH": ROOT, **(env or {})})


def units_committed(out) -> int:
    """Completion records under OUT/_work (every run's)."""
    work = os.path.join(out, "_work")
    if not os.path.isdir(work):
        return 0
    return sum(len([n for n in os.listdir(os.path.join(work, r, "units")) if n.endswith(".json")])
               for r in os.listdir(work) if os.path.isdir(os.path.join(work, r, "units")))


def wait_for(predicate, proc, timeout=300):
    """Until PREDICATE() holds; AssertionError if PROC ends first or TIMEOUT passes."""
    deadline = time.time() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"the job ended first:\n{proc.stderr.read().decode()[-3000:]}")
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


# A filter config whose rows are scored the same on any runner (no fitted model): a length limit,
# n-gram overlap and BLEU; some rows kept and some not on the tiny models' output
FILTER_CONFIG = """filters:
  - name: length
    thresholds: {paraphrase_length: {max: 8}}
  - name: ngram_overlap
    n: [1, 2, 3]
    thresholds: {trigram_overlap: {max: 0.7}}
  - name: bleu
"""


def scored_rows(out) -> list[tuple]:
    """The filter run in OUT's scored rows as (pair, rank, keep, reasons, trigram overlap), sorted."""
    table = storage.parquet_dataset(committed_files(str(out), "scored", "_filter_manifest.json")).to_table()
    return sorted((r["pair_id"], r["rank"], r["keep"], tuple(r["reasons"] or ()), round(r["trigram_overlap"], 9))
                  for r in table.to_pylist())
