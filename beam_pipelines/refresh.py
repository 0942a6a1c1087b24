"""A scheduled corpus refresh: an incremental generation run, optionally the filter job, then
``latest`` moved and old runs pruned. Local directories and buckets alike.

    paragen-refresh --root gs://bucket/paraphrases --keep 4 \\
        --filter_args="--config paranmt --encoder gs://bucket/models/enc" \\
        -- --input gs://bucket/bitext/ --forward_model gs://bucket/models/cs-en \\
           --backward_model gs://bucket/models/en-cs --preset parabank2

Layout under ROOT::

    runs/<run id>/             one generation run per refresh (its own _manifest.json)
    filtered/<run id>/         its filter run, when --filter_args are given (beside the run, never
                               inside it: runs/<run id>/filtered/ in roots of earlier versions)
    latest/_manifest.json      the current run's manifest, its paths rewritten to open from latest/
    latest/filtered/_filter_manifest.json   the same for its filter run
    _log/<n>-latest.json       latest's versions: the newest, created last, says which run is current
    latest.json                a copy of the newest version
    logs/<run id>.log          each refresh's log (in a bucket, a continued run's later attempts: <run id>.<n>.log)
    _log/<n>-_refresh.json     the lease of the refresh running now (its versions)

A refresh passes the run ``latest`` names to the generation job as ``--previous``: shards whose
content and config did not change keep that run's output (paracorpus/incremental.py). When nothing
changed it publishes nothing and says so. ``latest`` moves only after the generation run (and the
filter run, when configured) committed; a failure leaves it where it was and exits non-zero.
Retention keeps the newest KEEP committed runs, the run ``latest`` names, every run a version of
latest written in the last RETAIN hours named (a reader may still hold its manifest), every run
whose claim is alive and every run a kept run (or the latest/ view) takes files from,
transitively; everything else in runs/ (old runs, failed runs) goes, with its log
(paracorpus/latest.py). Two refreshes never overlap: the lease (paracorpus/commit.Claim on
``_refresh.json``, renewed every 30 s, taken over only when its holder is dead or its newest
version 5 minutes old by the store's clock) refuses the second, and latest moves by creating the
version one above the one this refresh read under it, so a refresh paused past its lease finds
that number taken and cannot move ``latest`` when it resumes (exit 75).

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
from dataclasses import dataclass

from common import storage
from common.cli import (EXIT_BUSY, EXIT_EMPTY, EXIT_USAGE, JobFailed, OutputBusy, UsageError,
                        check_output_location, cli_main, configure_logging, option_value)
from beam_pipelines.report import NOOP_MARKER_ENV
from beam_pipelines.commit import Claim
from common.stopping import Stopping, at_end, not_at_end
from paracorpus.commit import claim_record, cleanup_pending, entry_path, holder, new_run_id, read_manifest
from paracorpus.latest import DEFAULT_RETAIN_HOURS, Latest, committed_plan, filter_target, prune
from paracorpus.schema import FILTER_MANIFEST, MANIFEST

log = logging.getLogger("paragen.refresh")
LEASE = "_refresh.json"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="paragen-refresh", description=__doc__, allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, metavar="DIR",
                    help="where the refreshes live (a local directory or a bucket URL) (required)")
    ap.add_argument("--keep", type=int, default=4, help="committed runs kept (default 4)")
    ap.add_argument("--retain", type=float, default=DEFAULT_RETAIN_HOURS, metavar="HOURS",
                    help="also keep every run latest named in the last HOURS, by the store's clock: a reader that "
                         f"opened it then may still be reading it (default {DEFAULT_RETAIN_HOURS:g}; 0: only --keep)")
    ap.add_argument("--filter_args", default="",
                    help="the filter job's options (without --input/--output) as one argument, written "
                         "--filter_args='--config ...' (the = keeps them from reading as this command's "
                         "options); split like a shell would, never run by one; empty: no filter job (default)")
    ap.add_argument("--job_cmd", default="",
                    help="run the generation job as this command instead of in this process, e.g. "
                         "'deploy/run_dataflow.sh' (default: in this process)")
    ap.add_argument("--filter_cmd", default="",
                    help="the same for the filter job (default: in this process)")
    ap.add_argument("--dry_run", action="store_true",
                    help="print what the refresh would re-decode (the generation job's --dry_run against the run "
                         "latest names) and exit without writing anything, not even a log")
    ap.add_argument("job_args", nargs=argparse.REMAINDER,
                    help="after --: the generation job's options, without --output and --previous")
    return ap


def _words(text: str, option: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"{option}: cannot split into words ({exc})") from None


def _run_job(module: str, cmd: list[str], args: list[str], log_file, env: dict | None = None) -> tuple[int, object]:
    """Run a job (in this process, or as CMD with ENV added to its environment) with ARGS, its
    output appended to LOG_FILE; (exit status, what the job's run() returned or None)."""
    if cmd:
        done = subprocess.run([*cmd, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, **(env or {})})
        log_file.write(done.stdout)
        return done.returncode, None
    import importlib

    job = importlib.import_module(module)
    handler = logging.StreamHandler(log_file)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    result: list = [None]

    def run_and_keep(argv):
        result[0] = job.run(argv)
        return result[0]
    try:
        with contextlib.redirect_stdout(log_file), contextlib.redirect_stderr(log_file):
            try:
                return cli_main(run_and_keep, args), result[0]
            except SystemExit as exc:
                if exc.code and not isinstance(exc.code, int):
                    print(exc.code, file=log_file)
                return (exc.code if isinstance(exc.code, int) else 1), None
            except Exception:  # noqa: BLE001: a failed job is the refresh's failure, its traceback the log's
                import traceback

                traceback.print_exc(file=log_file)
                return 1, None
    finally:
        logging.getLogger().removeHandler(handler)


def _log_text(log_file, since: int) -> str:
    """What LOG_FILE (an open file or a StringIO) received after position SINCE."""
    log_file.flush()
    if isinstance(log_file, io.StringIO):
        return log_file.getvalue()[since:]
    # through the open file, not its name: a refresh that lost its lease may find its log removed
    # by the one that took over, and must still say why its job stopped
    end = log_file.tell()
    log_file.seek(since)
    try:
        return log_file.read()
    finally:
        log_file.seek(end)


def _cause(text: str) -> str:
    """The line of a job's output that says why it failed: its last 'error:' line, else its last
    line (a traceback's exception)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["no output"])[-1].removeprefix("error:").strip()[:500]


def _failed(job: str, rc: int, log_file, since: int, log_path: str) -> "RefreshFailed":
    """The refresh's failure when JOB exited RC: its cause, and an exit status that keeps a
    usage mistake (2) and a run with nothing to publish (3) apart from other failures (1)."""
    return RefreshFailed(f"{job} job failed (exit {rc}): {_cause(_log_text(log_file, since))}; latest unchanged "
                         f"(log: {log_path})", rc if rc in (EXIT_USAGE, EXIT_EMPTY, EXIT_BUSY) else 1)


@dataclass(frozen=True)
class RefreshRequest:
    """What the check phase established: where the refreshes live and how to run each job."""
    root: str
    keep: int
    retain_seconds: float
    job_args: tuple                  # the generation job's options, without --output and --previous
    filter_args: tuple               # the filter job's options; empty: no filter job
    job_cmd: tuple                   # run the generation job as this command (empty: in this process)
    filter_cmd: tuple
    dry_run: bool


def check(argv) -> RefreshRequest:
    """The checked RefreshRequest of ARGV; the filter job's options are checked now, not after a
    whole generation run (UsageError)."""
    a = build_parser().parse_args(argv)
    job_args = [x for x in a.job_args if x != "--"] if a.job_args[:1] == ["--"] else list(a.job_args)
    if a.keep < 1:
        raise UsageError(f"--keep must be >= 1, not {a.keep}")
    if not 0 <= a.retain <= 24 * 3650:          # NaN fails this too
        raise UsageError(f"--retain must be between 0 and 87600 hours, not {a.retain}")
    for forbidden in ("--output", "--previous", "--overwrite", "--resume", "--run_id", "--continue_only"):
        if any(x == forbidden or x.startswith(forbidden + "=") for x in job_args):
            raise UsageError(f"{forbidden} is set by the refresh; leave it out of the job's options")
    filter_args = _words(a.filter_args, "--filter_args")
    job_cmd, filter_cmd = _words(a.job_cmd, "--job_cmd"), _words(a.filter_cmd, "--filter_cmd")
    if filter_args:
        from beam_pipelines.filter import check_args

        check_args(filter_args, option_value(job_args, "--forward_model"))
    root = check_output_location(a.root.rstrip("/"), "--root")      # a store never reached: said now
    return RefreshRequest(root, a.keep, a.retain * 3600, tuple(job_args), tuple(filter_args),
                          tuple(job_cmd), tuple(filter_cmd), a.dry_run)


def dry_run(req: RefreshRequest) -> dict:
    """The generation job's --dry_run against the run latest names; nothing written, not even a log."""
    from beam_pipelines.generate import run as generate

    latest = Latest(req.root) if storage.isdir(req.root) else None
    previous = latest.run_dir if latest else None
    print(f"refresh dry run: previous run {previous or 'none'}", flush=True)
    if previous and req.filter_args and committed_plan(latest.filter_path) != filter_plan_key(req, latest.run_id):
        print(f"refresh dry run: the filter run of {latest.run_id} was made with other --filter_args (or none): "
              "with no new bitext the filter job would run on it again", flush=True)
    return generate([*req.job_args, "--output", storage.join(req.root, "runs", "dry-run"), "--dry_run"]
                    + (["--previous", previous] if previous else []))


def run_id_after(names: list[str]) -> str:
    """A new run id that sorts after every one of NAMES (ROOT/runs): the time's, unless a run in
    the same second, or one of a host whose clock runs ahead, already sorts after it; then that
    run's id with a random part added. Which run is newer is read from the ids (a stopped
    refresh's run is the newest newer than latest's), so they follow the order refreshes ran in
    whatever the clocks say."""
    run_id = new_run_id()
    top = max(names, default="")
    return run_id if run_id > top else f"{top}-{new_run_id().rsplit('-', 1)[1]}"


def stopped_run(root: str, latest_id: str | None) -> str | None:
    """The run of a refresh stopped before it moved latest (the newest run newer than latest's), or
    None: the generation job is asked to continue it (--run_id, --continue_only) and decides under
    the run's claim whether it has this refresh's plan. Its holder gone (released by SIGTERM, or
    killed without a word: its process on this host ended, or its claim outlived the lease), the
    job takes its claim over. A run whose holder is alive (a --job_cmd job still running, a paused
    one within its lease) is OutputBusy (exit 75): never continued, never removed."""
    newer = [n for n in storage.listdir(storage.join(root, "runs")) if latest_id is None or n > latest_id]
    if not newer:
        return None
    candidate = max(newer)
    held = holder(storage.join(root, "runs", candidate))
    if held is not None and held[1]:
        raise OutputBusy(f"run {candidate} of an earlier refresh is still being written ({held[2]}); this refresh "
                         "neither continues nor removes it: run it again once that job has ended")
    return candidate


def _finish_filter_cleanup(folder: str) -> None:
    """The clean-up of the filter run in FOLDER that a stop cut short after it published (its _work
    or its claim left), finished under the run's own claim as the filter job's next start would."""
    from beam_pipelines.commit import finish_cleanup
    from beam_pipelines.filter import TABLES

    try:
        with Claim(folder, new_run_id()) as claim:
            finish_cleanup(folder, FILTER_MANIFEST, TABLES, claim)
    except OutputBusy as exc:            # its holder's claim not stale yet: the next refresh finishes it
        log.warning("the clean-up of %s left for the next refresh: %s", folder, exc)


def generate_run(req: RefreshRequest, run_id: str, previous: str | None, log_file, log_path: str,
                 continue_only: bool = False) -> str:
    """The generation job into ROOT/runs/RUN_ID on top of PREVIOUS: "published" (a run there),
    "noop" (nothing changed since PREVIOUS) or, with CONTINUE_ONLY (RUN_ID a stopped refresh's
    run, continued only when it has this refresh's plan), "not continued"; RefreshFailed
    otherwise."""
    out = storage.join(req.root, "runs", run_id)
    gen_args = [*req.job_args, "--output", out, "--run_id", run_id, *(["--continue_only"] if continue_only else []),
                *(["--previous", previous] if previous else [])]
    marker = storage.join(req.root, "logs", f"{run_id}.noop.json")
    since = log_file.tell()
    rc, result = _run_job("beam_pipelines.generate", list(req.job_cmd), gen_args, log_file,
                          env={NOOP_MARKER_ENV: marker})
    if rc != 0:
        raise _failed("generation", rc, log_file, since, log_path)
    said = result if isinstance(result, dict) else (storage.read_json(marker) if storage.isfile(marker) else {})
    storage.delete(marker)
    if said.get("not_continued"):
        return "not continued"
    if storage.isfile(storage.join(out, MANIFEST)):
        return "published"
    if not said.get("noop"):
        raise RefreshFailed(f"the generation job exited 0 but published no run in {out} and did not "
                            f"say that nothing changed; latest unchanged (log: {log_path})", 1)
    return "noop"


def filter_plan_key(req: RefreshRequest, run_id: str) -> str:
    """The plan key of the filter job this refresh's --filter_args make on run RUN_ID."""
    from beam_pipelines.filter import plan_key_of

    return plan_key_of(["--input", storage.join(req.root, "runs", run_id), *req.filter_args])


def filter_run(req: RefreshRequest, run_id: str, log_file, log_path: str, plan_key: str | None = None) -> str:
    """The filter job on run RUN_ID, into ROOT/filtered/RUN_ID (or, when that holds a filter run
    of other --filter_args, ROOT/filtered/RUN_ID.<plan key>): that folder; RefreshFailed when
    it fails. PLAN_KEY: filter_plan_key's, when the caller has it already."""
    output = filter_target(req.root, run_id, plan_key or filter_plan_key(req, run_id))
    since = log_file.tell()
    rc, _ = _run_job("beam_pipelines.filter", list(req.filter_cmd),
                     ["--input", storage.join(req.root, "runs", run_id), "--output", output, *req.filter_args],
                     log_file)
    if rc != 0:
        raise _failed("filter", rc, log_file, since, log_path)
    return output


def filter_state(latest: Latest, plan_key: str) -> tuple[bool, bool]:
    """(current, unfinished) of the filter run latest names, from one read of its manifest:
    whether it has PLAN_KEY (made with this refresh's --filter_args: the same input run, config and
    options), and whether a stop cut its clean-up short after it published (its claim or _work
    left). A refresh that adds or changes --filter_args with no new bitext runs the filter job on
    latest's run instead of leaving the old (or no) filter view."""
    folder = latest.filter_path
    try:
        manifest = read_manifest(folder, FILTER_MANIFEST)
    except ValueError:                         # unreadable: not this plan's
        return False, False
    if manifest is None or str(manifest.get("plan_key")) != plan_key:
        return False, False
    return True, claim_record(folder) is not None or cleanup_pending(folder, manifest)


def attempt_log_path(root: str, run_id: str) -> str:
    """Where this attempt of run RUN_ID logs: ``logs/<run id>.log``, appended to on a local disk;
    in a bucket, whose objects cannot be appended to, a continued run's later attempts get
    ``logs/<run id>.<n>.log`` (n = 2, 3, ...), so no attempt's log replaces another's."""
    logs = storage.join(root, "logs")
    if storage.is_local(logs):
        return storage.join(logs, f"{run_id}.log")
    taken = set(storage.listdir(logs))                  # [] where there is no logs/ yet
    name = f"{run_id}.log"
    n = 1
    while name in taken:
        n += 1
        name = f"{run_id}.{n}.log"
    return storage.join(logs, name)


@contextlib.contextmanager
def run_log(log_path: str):
    """The refresh's log file: a local one is written as the jobs run; a bucket's is uploaded at
    the end, and by a stop (SIGTERM, SIGINT) that ends the process before it."""
    local_log = storage.resolve(log_path)[1] if storage.is_local(log_path) else None
    if local_log:
        os.makedirs(os.path.dirname(local_log), exist_ok=True)
        with open(local_log, "a+", encoding="utf-8", errors="replace") as f:      # a+: _log_text reads it back
            yield f
        return
    buffer = io.StringIO()

    def upload():
        storage.write_bytes(log_path, buffer.getvalue().encode("utf-8"))
    at_end(upload)
    try:
        yield buffer
    finally:
        not_at_end(upload)
        upload()


def run(argv=None) -> dict:
    with storage.first_contact():                      # a store never reached is a mistake, said at once
        req = check(argv)                               # 1. check, the filter's options included
    if req.dry_run:
        return dry_run(req)
    with Stopping("the refresh") as stopping:           # SIGTERM: the jobs stop, the lease is released
        return _refresh(req, stopping)


def _refresh(req: RefreshRequest, stopping: Stopping) -> dict:
    root = req.root
    storage.makedirs(root)
    run_id = new_run_id()
    with Claim(root, run_id, name=LEASE, on_lost=lambda why: stopping.end(why, 75)) as lease:   # 2. one refresh at a time
        # named once the lease is held, so ids follow the order refreshes ran in: one that waited
        # (paused) before its lease is newer than the run it then finds, and so is its no-op log
        run_id = run_id_after(storage.listdir(storage.join(root, "runs")))
        lease.rename(run_id)
        moved: list = []                # what a stop says: latest unchanged, or where it points now
        stopping.watch(f"refresh {run_id}", lambda: (f"latest -> runs/{moved[-1]}; old runs not yet pruned"
                                                     if moved else "latest unchanged"), lease.release)
        latest = Latest(root)           # read under the lease: every write of latest is conditional on it
        previous = latest.run_dir
        latest.repair()                 # a refresh stopped while publishing: its view finished first
        stopped = stopped_run(root, latest.run_id)
        outcome, log_path = None, attempt_log_path(root, stopped or run_id)
        with contextlib.ExitStack() as logs:
            log_file = logs.enter_context(run_log(log_path))
            if stopped:                 # the same command continues it when its plan is this one's
                print(f"refresh {run_id}: run {stopped} of a refresh stopped before it moved latest: its generation "
                      f"job continues it if it has this refresh's plan (log {log_path})", flush=True)
                outcome = generate_run(req, stopped, previous, log_file, log_path, continue_only=True)
                if outcome == "not continued":              # a new run, with a log of its own
                    log_path = attempt_log_path(root, run_id)
                    log_file = logs.enter_context(run_log(log_path))
                else:                                       # its log holds this attempt's lines
                    if outcome == "published":
                        print(f"refresh {run_id}: continuing run {stopped} of a refresh stopped before it moved "
                              "latest", flush=True)
                    run_id = stopped
            out = storage.join(root, "runs", run_id)
            print(f"refresh {run_id} -> {out} (previous: {previous or 'none'}; log {log_path})", flush=True)
            if outcome in (None, "not continued"):                              # 3. the generation job
                outcome = generate_run(req, run_id, previous, log_file, log_path)
            changed = outcome == "published"
            # the filter plan of latest's run, computed once (it reads the filter's config and models)
            key = filter_plan_key(req, latest.run_id) if not changed and req.filter_args and latest.run_id else None
            refilter = False
            if key is not None:
                current, unfinished = filter_state(latest, key)
                refilter = not current
                if unfinished:                         # its job killed after it published
                    _finish_filter_cleanup(latest.filter_path)
                    latest.repair()                    # the view again, from what that clean-up repaired
            if changed or refilter:
                target = run_id if changed else latest.run_id
                if refilter:
                    print(f"refresh {run_id}: nothing new to decode, but the filter run of {target} was made "
                          "with other --filter_args (or none): filtering it again", flush=True)
                filtered = (filter_run(req, target, log_file, log_path, key if refilter else None)      # 4. filter
                            if req.filter_args else None)
                lease.check()                   # a refresh that lost its lease moves and removes nothing
                latest.publish(target, lease.fence, filtered)                  # 5. publish: latest moves
                moved.append(target)
        lease.check()
        # 6. retention, also after a no-op: it finishes the clean-up of a refresh stopped after publishing
        current = latest.run_id
        removed = prune(root, req.keep, bool(req.filter_args), current, log_of=run_id,
                        fence=latest.fence(lease.fence), retain_seconds=req.retain_seconds)
        if refilter:
            print(f"refresh {run_id} done; latest -> runs/{latest.run_id} filtered by "
                  f"{entry_path(root, latest.filter_path)}; removed {len(removed)} old run(s)", flush=True)
            return {"run_id": run_id, "noop": False, "latest": previous, "filtered": latest.filter_path,
                    "removed": removed}
        if not changed:
            print(f"refresh {run_id}: nothing changed since {previous}; nothing published, latest unchanged",
                  flush=True)
            return {"run_id": run_id, "noop": True, "latest": previous, "removed": removed}
        print(f"refresh {run_id} done; latest -> runs/{run_id}; removed {len(removed)} old run(s)", flush=True)
        return {"run_id": run_id, "noop": False, "latest": out, "removed": removed}


class RefreshFailed(JobFailed):
    """A job of the refresh failed: reported as one line with its cause, latest unchanged."""


def main(argv=None) -> int:
    configure_logging()
    return cli_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
