"""What the tests that run the generation job on the tiny models share: the job's options for a
quick run, and a committed run's rows in a stable order."""
import os

from common import storage
from paracorpus.commit import committed_files


def quick_args(bitext, out, models, *extra) -> list[str]:
    """The generation job on BITEXT into OUT with the tiny MODELS: few samples, four pairs a unit."""
    return ["--input", bitext, "--output", str(out), "--forward_model", os.path.join(models, "cs-en"),
            "--backward_model", os.path.join(models, "en-cs"), "--num_sets", "2", "--num_samples", "4",
            "--score_threshold", "20", "--dual_xent_threshold", "20", "--num_output_shards", "2",
            "--unit_pairs", "4", "--batch_pairs", "4", "--device", "cpu", *extra]


def committed_rows(out, table="paraphrases") -> list[dict]:
    """The rows of TABLE that the run committed in OUT lists, sorted (pair, rank, index)."""
    files = committed_files(str(out), table)
    if not files:
        return []
    t = storage.parquet_dataset(files).to_table()
    return sorted(t.to_pylist(), key=lambda r: (r["pair_id"], r.get("rank") or 0, r["input_index"]))
