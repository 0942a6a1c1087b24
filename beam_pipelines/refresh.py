"""A scheduled corpus refresh: an incremental generation run, optionally the filter job, then
``latest`` moved and old runs pruned. Local directories and buckets alike.

    paragen-refresh --root gs://bucket/paraphrases --keep 4 \\
        --filter_args="--config paranmt --encoder gs://bucket/models/enc" \\
        -- --input gs://bucket/bitext/ --forward_model gs://bucket/models/cs-en \\
           --backward_model gs://bucket/models/en-cs --preset parabank2

Layout under ROOT::

    runs/<run id>/             one generation run per refresh (its own _manifest.json)
    runs/<run id>/filtered/    its filter run, when --filter_args are given
    latest.json                written last: which run is current (a small object, so buckets work)
    latest -> runs/<run id>    the same as a symlink, on a local disk
    logs/<run id>.log          each refresh's log
    _refresh.lock              the lease of the refresh running now

A refresh passes the run ``latest`` names to the generation job as ``--previous``: shards whose
content and config did not change keep that run's output (paracorpus/incremental.py). When nothing
changed it publishes nothing and says so. ``latest`` moves only after the generation run (and the
filter run, when configured) committed; a failure leaves it where it was and exits non-zero.
Retention keeps the newest KEEP committed runs, the run ``latest`` names and every run a kept run
still takes files from; everything else in runs/ (old runs, failed runs) goes, with its log. Two
refreshes never overlap: the lease (paracorpus/commit.Claim on ``_refresh.lock``, renewed every
30 s, taken over only when its holder is dead or silent for 5 minutes) refuses the second.

The jobs run in this process (DirectRunner, DaskRunner), or, with ``--job_cmd`` / ``--filter_cmd``,
as a command (e.g. ``deploy/run_dataflow.sh``) given the job's arguments.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import shlex
import subprocess
import sys
import time

from common import storage
from common.cli import UsageError, cli_main, configure_logging
from paracorpus.commit import Claim, new_run_id
from paracorpus.schema import FILTER_MANIFEST, MANIFEST

log = logging.getLogger("paragen.refresh")
LATEST = "latest.json"
LOCK = "_refresh.lock"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="paragen-refresh", description=__doc__, allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, metavar="DIR",
                    help="where the refreshes live (a local directory or a bucket URL) (required)")
    ap.add_argument("--keep", type=int, default=4, help="committed runs kept (default 4)")
    ap.add_argument("--filter_args", default="",
                    help="the filter job's options (without --input/--output) as one argument, written "
                         "--filter_args='--config ...' (the = keeps them from reading as this command's "
                         "options); split like a shell would, never run by one; empty: no filter job (default)")
    ap.add_argument("--job_cmd", default="",
                    help="run the generation job as this command instead of in this process, e.g. "
                         "'deploy/run_dataflow.sh' (default: in this process)")
    ap.add_argument("--filter_cmd", default="",
                    help="the same for the filter job (default: in this process)")
    ap.add_argument("job_args", nargs=argparse.REMAINDER,
                    help="after --: the generation job's options, without --output and --previous")
    return ap


def _words(text: str, option: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"{option}: cannot split into words ({exc})") from None


def latest_run(root: str) -> str | None:
    """The run directory ROOT/latest.json names, or None."""
    path = storage.join(root, LATEST)
    if not storage.isfile(path):
        return None
    return storage.join(root, "runs", storage.read_json(path)["run_id"])


def _run_job(module: str, cmd: list[str], args: list[str], log_file) -> int:
    """Run a job (in this process, or as CMD) with ARGS, its output appended to LOG_FILE."""
    if cmd:
        done = subprocess.run([*cmd, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        log_file.write(done.stdout)
        return done.returncode
    import importlib

    job = importlib.import_module(module)
    handler = logging.StreamHandler(log_file)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        with contextlib.redirect_stdout(log_file), contextlib.redirect_stderr(log_file):
            try:
                return cli_main(job.run, args)
            except SystemExit as exc:
                if exc.code and not isinstance(exc.code, int):
                    print(exc.code, file=log_file)
                return exc.code if isinstance(exc.code, int) else 1
            except Exception:  # noqa: BLE001: a failed job is the refresh's failure, its traceback the log's
                import traceback

                traceback.print_exc(file=log_file)
                return 1
    finally:
        logging.getLogger().removeHandler(handler)


def _committed(run_dir: str, with_filter: bool) -> bool:
    if not storage.isfile(storage.join(run_dir, MANIFEST)):
        return False
    return not with_filter or storage.isfile(storage.join(run_dir, "filtered", FILTER_MANIFEST))


def referenced_runs(run_dir: str) -> set[str]:
    """Names of the runs (siblings in runs/) whose files RUN_DIR's manifest takes."""
    manifest = storage.read_json(storage.join(run_dir, MANIFEST))
    return {f["root"] for files in manifest.get("files", {}).values() for f in files
            if f.get("root") and "/" not in f["root"]}


def prune(root: str, keep: int, with_filter: bool, current: str | None) -> list[str]:
    """Remove from ROOT/runs every run but the newest KEEP committed ones, CURRENT (latest's
    target) and the runs those take files from; and the logs of what was removed."""
    runs_dir = storage.join(root, "runs")
    names = storage.listdir(runs_dir)
    committed = [n for n in names if _committed(storage.join(runs_dir, n), with_filter)]
    kept = set(sorted(committed)[-keep:]) | ({current} if current else set())
    for name in list(kept):
        if name in committed:
            kept |= referenced_runs(storage.join(runs_dir, name))
    removed = [n for n in names if n not in kept]
    for name in removed:
        storage.delete_tree(storage.join(runs_dir, name))
    for log_name in storage.listdir(storage.join(root, "logs")):      # logs of runs gone, of no-op refreshes
        if log_name.removesuffix(".log") not in kept:
            storage.delete(storage.join(root, "logs", log_name))
    return removed


def publish_latest(root: str, run_id: str) -> None:
    """Point latest.json (and, on a local disk, the latest symlink) at RUN_ID, atomically."""
    storage.write_json(storage.join(root, LATEST), {"run_id": run_id, "path": f"runs/{run_id}",
                                                    "published_at": time.time()})
    if storage.is_local(root):
        base = storage.resolve(root)[1]
        tmp = os.path.join(base, f".latest.{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        os.symlink(os.path.join("runs", run_id), tmp)
        os.replace(tmp, os.path.join(base, "latest"))


def run(argv=None) -> dict:
    a = build_parser().parse_args(argv)
    job_args = [x for x in a.job_args if x != "--"] if a.job_args[:1] == ["--"] else list(a.job_args)
    if a.keep < 1:
        raise UsageError(f"--keep must be >= 1, not {a.keep}")
    for forbidden in ("--output", "--previous", "--overwrite", "--resume", "--run_id"):
        if any(x == forbidden or x.startswith(forbidden + "=") for x in job_args):
            raise UsageError(f"{forbidden} is set by the refresh; leave it out of the job's options")
    filter_args = _words(a.filter_args, "--filter_args")
    job_cmd, filter_cmd = _words(a.job_cmd, "--job_cmd"), _words(a.filter_cmd, "--filter_cmd")
    root = storage.absolute(a.root.rstrip("/"))
    storage.makedirs(root)
    run_id = new_run_id()
    with Claim(root, run_id, name=LOCK):
        previous = latest_run(root)
        out = storage.join(root, "runs", run_id)
        log_path = storage.join(root, "logs", f"{run_id}.log")
        print(f"refresh {run_id} -> {out} (previous: {previous or 'none'}; log {log_path})", flush=True)
        # a local log is written as the jobs run; a bucket's is uploaded at the end
        local_log = storage.resolve(log_path)[1] if storage.is_local(log_path) else None
        if local_log:
            os.makedirs(os.path.dirname(local_log), exist_ok=True)
        buffer = open(local_log, "a", encoding="utf-8") if local_log else io.StringIO()
        try:
            gen_args = [*job_args, "--output", out, "--run_id", run_id] + (["--previous", previous] if previous else [])
            rc = _run_job("beam_pipelines.generate", job_cmd, gen_args, buffer)
            noop = rc == 0 and not storage.isfile(storage.join(out, MANIFEST))
            if rc != 0:
                raise RefreshFailed(f"generation job failed (exit {rc}); latest unchanged")
            if noop:
                print(f"refresh {run_id}: nothing changed since {previous}; nothing published, latest unchanged",
                      flush=True)
                return {"run_id": run_id, "noop": True, "latest": previous}
            if filter_args:
                rc = _run_job("beam_pipelines.filter", filter_cmd,
                              ["--input", out, "--output", storage.join(out, "filtered"), *filter_args], buffer)
                if rc != 0:
                    raise RefreshFailed(f"filter job failed (exit {rc}); latest unchanged")
            publish_latest(root, run_id)
            removed = prune(root, a.keep, bool(filter_args), run_id)
            print(f"refresh {run_id} done; latest -> runs/{run_id}; removed {len(removed)} old run(s)", flush=True)
            return {"run_id": run_id, "noop": False, "latest": out, "removed": removed}
        finally:
            if local_log:
                buffer.close()
            else:
                storage.write_bytes(log_path, buffer.getvalue().encode("utf-8"))


class RefreshFailed(UsageError):
    """A job of the refresh failed: reported as one line, exit status 2, latest unchanged."""


def main(argv=None) -> int:
    configure_logging()
    return cli_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
