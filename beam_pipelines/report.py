"""The report phase: what a job prints when it ends, and the words it uses for rejects.

The generation job prints its counts (read = with paraphrases + rejected), the reject reasons,
counters and where the workers' time went; the filter job its kept and rejected rows by reason.
Both name the top reasons the same way, in a warning, an error line or a summary.
"""
from __future__ import annotations

import logging
import os

from common import storage

log = logging.getLogger("paragen")
# where a caller (paragen-refresh running the generation job as a command) wants to learn that the
# job found nothing to do: a small JSON file is written there (in-process callers get run()'s result)
NOOP_MARKER_ENV = "PARAGEN_NOOP_MARKER"


def top_reasons(by_reason: dict, n: int = 3) -> str:
    """'reason count, ...' of the N commonest reasons in BY_REASON."""
    top = sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return ", ".join(f"{reason} {count:,}" for reason, count in top)


def nothing_to_publish(counts: dict) -> str:
    """Why a generation run has no paraphrase row, in words."""
    if counts["records_read"] == 0:
        return "the input shards hold no records"
    return (f"every record was rejected ({counts['rejected']:,} of {counts['records_read']:,}; top reasons: "
            f"{top_reasons(counts['rejected_by_reason'])})")


def report_nothing_changed(previous_run_id: str, previous: str) -> dict:
    """A generation run that would be run PREVIOUS_RUN_ID again: said, and told to a refresh that
    runs the job as a command (NOOP_MARKER_ENV); the job's result."""
    print(f"nothing changed since run {previous_run_id} ({previous}): same input shards, same "
          "models and settings; nothing decoded, nothing published", flush=True)
    if os.environ.get(NOOP_MARKER_ENV):
        storage.write_json(os.environ[NOOP_MARKER_ENV], {"noop": True, "previous_run_id": previous_run_id})
    return {"noop": True, "run_id": previous_run_id, "previous": previous}


def report_not_continued(run_id: str, output: str) -> dict:
    """--continue_only, and the run --run_id names is not this command's (other inputs, models or
    settings, or no plan recorded): said, and told to a refresh that runs the job as a command
    (NOOP_MARKER_ENV); nothing was written."""
    print(f"run {run_id} in {output} is not this command's to continue (another plan, or none recorded); "
          "nothing decoded, nothing published", flush=True)
    if os.environ.get(NOOP_MARKER_ENV):
        storage.write_json(os.environ[NOOP_MARKER_ENV], {"noop": False, "not_continued": True, "run_id": run_id})
    return {"noop": False, "not_continued": True, "run_id": run_id}


def report_already_done(run_id: str, output: str) -> dict:
    """The same command run again on an output whose committed run has its plan: said; the result."""
    print(f"nothing to do: run {run_id} in {output} is committed with this plan (same input shards, models and "
          "settings); nothing decoded, nothing published (--overwrite makes it again)", flush=True)
    return {"noop": True, "run_id": run_id, "done": True}


def report_generation(manifest: dict, counters: dict, elapsed: float, output: str) -> None:
    """A warning for each input shard the run decoded that gave no paraphrase, then the summary."""
    warn_empty_shards(manifest["inputs"], manifest["run_id"])
    print_summary(manifest["counts"], counters, elapsed, output)


def warn_empty_shards(inputs: list[dict], run_id: str) -> None:
    """A warning for each input shard this run decoded that gave no paraphrase: a wrong column
    order or language is easier to find per shard than in the run's totals."""
    for entry in sorted(inputs, key=lambda e: e["input_shard"]):
        counts = entry["counts"]
        if entry.get("decoded_in") == run_id and counts["paraphrase_rows"] == 0:
            log.warning("input shard %s gave no paraphrase: %s", entry["input_shard"],
                        "no records" if not entry["records_read"] else
                        f"all {entry['records_read']:,} records rejected ({top_reasons(counts['rejected_by_reason'])})")


def print_summary(counts: dict, counters: dict, elapsed: float, output: str) -> None:
    """The generation run's counts, reject reasons, counters and worker time per stage."""
    lines = [f"read {counts['records_read']} records in {elapsed:.1f}s "
             f"({counts['records_read'] / max(elapsed, 1e-9):.1f} records/s)",
             f"  pairs with paraphrases: {counts['pairs_with_paraphrases']} "
             f"({counts['paraphrase_rows']} paraphrase rows)",
             f"  rejected: {counts['rejected']}"]
    lines += [f"    {reason}: {n}" for reason, n in counts["rejected_by_reason"].items()]
    lines.append(f"  reconciled (read = with paraphrases + rejected): {counts['reconciled']}")
    stages = {k[3:]: v for k, v in counters.items() if k.startswith("ms_")}
    if counters:
        lines.append("  counters: " + ", ".join(f"{k}={v}" for k, v in counters.items() if not k.startswith("ms_")))
    if stages and counts["records_read"]:
        lines.append("  worker time per record read, by stage (ms, all workers): " + ", ".join(
            f"{name} {ms / counts['records_read']:.1f}" for name, ms in sorted(stages.items(), key=lambda kv: -kv[1])))
    lines.append(f"  output: {output}")
    print("\n".join(lines), flush=True)


def print_filter_summary(manifest: dict, rows_in: int, elapsed: float) -> None:
    """The filter run's rows scored, kept and rejected by reason, and unscored rows by score."""
    print(f"scored {rows_in} rows in {elapsed:.1f}s ({manifest['rows_per_s']:.0f} rows/s): "
          f"kept {manifest['kept']}, rejected {rows_in - manifest['kept']}", flush=True)
    for reason, n in manifest["rejected_by_reason"].items():
        print(f"  {reason}: {n}")
    for score, n in manifest["unscored_by_score"].items():
        print(f"  no {score} score (rule not applied): {n}")
    print(f"  reconciled (rows in = rows out): {manifest['reconciled']}", flush=True)
