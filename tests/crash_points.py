"""The crash-point harness (issues 53, 57): stop a job (the generation job, the filter job, a
refresh) at one of its storage operations and check what a reader sees then and what the same
command does after, on the paths users take.

As ALICE (Pillai et al., OSDI 2014) and SQLite's crash tests do for file systems: a run is traced
once (common/crash_points.py, PARAGEN_STORAGE_TRACE: every write, rename, delete and listing of
every process, in order), then for each chosen operation the same run starts again from the same
state and stops just before it: ``N:SIG`` (the driver's Nth operation, the in-memory runner), or a
path pattern for an operation of a worker process (DirectRunner multi_processing, Dask), whose
operations interleave differently each run. SIG is KILL or TERM, or STOP: the holder paused past
its lease while the same command starts again and takes over (then SIGCONT). At that instant:

* a reader of the commit point (the manifest; a refresh: ``latest.json``) sees the state before or
  the new run, whole, never a mix; every table (paraphrases, rejects, dedup; scored and the filter
  report the manifest lists); a refresh's ``latest/`` view shows one run, or a run whose filter
  view is not there yet ("partial"), never two;
* the same command run again (no ``--overwrite`` unless the command had it) exits 0 with exactly
  the rows of an uninterrupted run (a paused holder: the one that took over does, and the paused
  one exits 75 or finds the work done);
* nothing is left that the manifest does not list: no unit files, no files of the run it replaced,
  no ``_work``, no claim, no hidden temporary file.

The state every point starts from is made by SETUP commands (none: an empty output; a committed
run of other settings that the stopped run replaces with ``--overwrite``; earlier refreshes).
Modes and their sweeps: :func:`generation_sweep`, :func:`filter_sweep`, :func:`refresh_sweep`.
Used by tests/test_crash_points.py (a sample of points) and bench/bench_crash_points.py (all).
"""
from __future__ import annotations

import os
import re
import shutil
import signal as signals
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEASE = "3"                          # PARAGEN_LEASE_SECONDS of a paused-holder point


@dataclass(frozen=True)
class Job:
    """A job the harness runs: its module, the manifest it publishes, the tables readers read."""
    module: str = "beam_pipelines.generate"
    manifest: str = "_manifest.json"
    table: str = "paraphrases"
    tables: tuple = ("paraphrases", "rejects", "dedup")


GENERATE = Job()
FILTER = Job("beam_pipelines.filter", "_filter_manifest.json", "scored", ("scored",))
# A refresh: the generation and filter runs under ROOT/runs and ROOT/filtered, published by
# latest.json (the commit point) and the latest/ view.
REFRESH = Job("beam_pipelines.refresh", "latest.json", "paraphrases", ())


def job(args: list[str], env: dict | None = None, timeout: float = 900, which: Job = GENERATE,
        wait: bool = True):
    """The job with ARGS as a process (forked from a warm interpreter: tests/warm_python.py); its
    CompletedProcess, or with WAIT False the Popen."""
    from tests import warm_python

    command = [sys.executable, "-m", which.module, *args]
    env = {**os.environ, "PYTHONPATH": ROOT, **(env or {})}
    if not wait:
        return warm_python.popen(command, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env=env, start_new_session=True)
    return warm_python.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def _table_rows(files: list[str]):
    from common import storage

    if not files:
        return []
    table = storage.parquet_dataset(files).to_table()
    return sorted(tuple((k, str(v)) for k, v in sorted(r.items())) for r in table.to_pylist())


def rows(out: str, which: Job = GENERATE):
    """What a reader of OUT's commit point sees, or None when nothing is committed: every table of
    the job's run; a filter run's report as its manifest lists it (its files' names and the
    counts report.json gives); a refresh root: the rows of the run latest.json names and of its
    filter run."""
    from common import storage
    from paracorpus.commit import committed_files, read_manifest

    if which is REFRESH:
        named = storage.join(out, "latest.json")
        if not storage.isfile(named):
            return None
        latest = storage.read_json(named)
        run_id = latest["run_id"]
        # the filter run latest names (a refresh that changed --filter_args: filtered/<run id>.<plan key>)
        filtered = storage.join(out, latest.get("filtered") or f"filtered/{run_id}")
        return rows(storage.join(out, "runs", run_id)), rows(filtered, FILTER)
    manifest = read_manifest(out, which.manifest)
    if manifest is None:
        return None
    seen = {table: _table_rows(committed_files(out, table, which.manifest)) for table in which.tables}
    if which is FILTER:
        seen["report"] = _report(out, manifest)
    return seen


def _report(out: str, manifest: dict):
    """The report the filter MANIFEST lists: its files' names and report.json's counts."""
    from common import storage
    from paracorpus.commit import file_location

    entries = manifest.get("files", {}).get("report", [])
    names = sorted(storage.basename(e["path"]) for e in entries)
    found = [e for e in entries if e["path"].endswith("report.json")]
    report = storage.read_json(file_location(out, found[0])) if found else {}
    return names, report.get("rows"), report.get("kept")


def view(root: str):
    """What a reader of ROOT/latest (the view) sees: (the run's rows, its filter run's rows)."""
    from common import storage

    return rows(storage.join(root, "latest")), rows(storage.join(root, "latest", "filtered"), FILTER)


def leftovers(out: str, which: Job = GENERATE) -> list[str]:
    """Files under OUT that its manifest does not list (the manifest itself apart). A refresh
    root: files of no kept run, a run without its manifest, a lease left behind, and a latest/
    view that is not the run latest.json names."""
    from common import storage
    from paracorpus.commit import _canonical, file_location, read_manifest

    if which is REFRESH:
        return _refresh_leftovers(out)
    manifest = read_manifest(out, which.manifest) or {}
    listed = {file_location(out, f) for files in manifest.get("files", {}).values() for f in files}
    return sorted(p for p in storage.list_files(out)
                  if _canonical(p) not in listed and storage.basename(p) != which.manifest
                  and not _record_version(out, p)) + _records_out_of_step(out, which.manifest)


def _record_version(folder: str, path: str) -> bool:
    """True when PATH is a version of one of FOLDER's records (common/storage/versions.py)."""
    import re

    from common import storage

    return storage.parent(path) == storage.join(folder, "_log") and bool(re.match(r"^\d{20}-", storage.basename(path)))


def _records_out_of_step(folder: str, *copies: str) -> list[str]:
    """A claim still held, or a copy that is not its record's newest version."""
    from common import storage
    from paracorpus.commit import claim_record

    left = [f"{name} (a claim still held)" for name in ("_owner.json", "_refresh.json")
            if claim_record(folder, name)]
    for name in copies:
        path = storage.join(folder, name)
        data = storage.read_versioned(path)[0]
        copy = storage.read_bytes(path) if storage.isfile(path) else None
        if copy != data:
            left.append(f"{name} (not a copy of its newest version)")
    return left


def _refresh_leftovers(root: str) -> list[str]:
    from common import storage
    from paracorpus.latest import run_of_filter_folder, run_of_log

    left, kept = [], set()
    for name in storage.listdir(storage.join(root, "runs")):
        run_dir = storage.join(root, "runs", name)
        if not storage.isfile(storage.join(run_dir, GENERATE.manifest)):
            left.append(f"runs/{name} (no manifest)")
            continue
        kept.add(name)
        left += [f"runs/{name}: {p}" for p in leftovers(run_dir)]
    for name in storage.listdir(storage.join(root, "filtered")):
        if run_of_filter_folder(name) not in kept or not storage.isfile(storage.join(root, "filtered", name,
                                                                                     FILTER.manifest)):
            left.append(f"filtered/{name} (of no kept run)")
        else:
            left += [f"filtered/{name}: {p}" for p in leftovers(storage.join(root, "filtered", name), FILTER)]
    logs = storage.listdir(storage.join(root, "logs"))
    # the newest refresh's log stays when it was a no-op (no run of its own), until the next refresh
    left += [f"logs/{n}" for n in logs if run_of_log(n) not in kept and n != max(logs)]
    extra = sorted(set(storage.listdir(root)) - {"runs", "filtered", "logs", "latest", "latest.json", "_log"})
    left += extra                                   # anything else
    left += [f"_log/{n}" for n in storage.listdir(storage.join(root, "_log")) if not _record_version(
        root, storage.join(root, "_log", n))] + _records_out_of_step(root, "latest.json")
    named = rows(root, REFRESH)
    if named is not None and view(root) != named:
        left.append("latest/ (a view of another run than latest.json names)")
    return left


@dataclass
class Store:
    """Where the runs go: a local folder or a bucket prefix, and how to copy a state."""
    root: str
    env: dict = field(default_factory=dict)
    name: str = "local"

    def path(self, name: str) -> str:
        from common import storage

        return storage.join(self.root, name)

    def copy(self, src: str, dst: str) -> None:
        from common import storage

        if not storage.is_url(src):
            if os.path.isdir(src):
                shutil.copytree(src, dst, symlinks=True)
            return
        for path in storage.list_files(src):
            storage.write_bytes(dst + path[len(src):], storage.read_bytes(path))


@dataclass
class Point:
    n: int
    kind: str
    path: str
    signal: str
    exit_status: int = 0
    seen: str = ""            # "previous", "new", "none" (nothing committed) or "MIXED", at the stop
    seen_view: str = ""       # a refresh's latest/: also "partial" (its filter view not there yet)
    rerun_status: int = 0     # the same command after the stop (a paused holder: the one that took over)
    rows_right: bool = False
    left: list = field(default_factory=list)
    seconds: float = 0.0
    fresh: bool = False       # the state before was an empty output: "none" is the state before
    log: str = ""             # the last lines of the stopped and the second command's stderr, to explain a failure

    @property
    def ok(self) -> bool:
        allowed = ("previous", "new", "none") if self.fresh else ("previous", "new")
        paused_ok = self.signal != "STOP" or self.exit_status in (0, 75)
        return (self.seen in allowed and self.seen_view != "MIXED" and self.rerun_status == 0 and self.rows_right
                and not self.left and paused_ok)


def _classify(seen, before, after) -> str:
    if seen == after:
        return "new"
    if seen == before:
        return "previous" if before is not None else "none"
    return "none" if seen is None else "MIXED"


def _classify_view(seen, before, after) -> str:
    """A refresh's view: the run before or the new one, or one of them with no filter view yet."""
    if seen in (before, after):
        return _classify(seen, before, after)
    if seen[1] is None and any(seen[0] == whole[0] for whole in (before, after) if whole is not None):
        return "partial"
    return "none" if seen == (None, None) else "MIXED"


class Sweep:
    """One job's crash points in one store and mode. BASE_ARGS(out): the options every command
    shares, given OUT; SETUP: the extra options of each command that makes the starting state
    (in order; none: an empty output); COMMAND: the stopped command's. '{out}' in an option is
    replaced by the output."""

    def __init__(self, store: Store, base_args, setup: list[list[str]], command: list[str], workdir: str,
                 which: Job = GENERATE, mode: str = "", env: dict | None = None):
        self.store, self.base_args, self.setup, self.command = store, base_args, setup, command
        self.workdir, self.which, self.mode = workdir, which, mode
        self.env = {**store.env, "PARAGEN_STORAGE_RETRY_SECONDS": "5", **(env or {})}
        # where prepare() traces the run (worker processes started elsewhere, Dask's, write here too)
        self.trace = os.path.join(workdir, f"trace-{os.getpid()}-{time.monotonic_ns()}.txt")

    def args(self, out: str, extra: list[str]) -> list[str]:
        return [a.replace("{out}", out) for a in (*self.base_args(out), *extra)]

    def prepare(self) -> list[tuple[int, str, str, int]]:
        """The starting state, the rows before and after, and the uninterrupted run's operations
        (n, kind, path, pid), the driver's first."""
        os.environ.update(self.store.env)
        self.start = self.store.path("start")
        for extra in self.setup:
            done = job(self.args(self.start, extra), self.env, which=self.which)
            assert done.returncode == 0, done.stderr[-3000:]
        self.previous_rows = rows(self.start, self.which)
        self.previous_view = view(self.start) if self.which is REFRESH else None
        whole = self.store.path("whole")
        self.store.copy(self.start, whole)
        trace = self.trace
        done = job(self.args(whole, self.command), {**self.env, "PARAGEN_STORAGE_TRACE": trace}, which=self.which)
        assert done.returncode == 0, done.stderr[-3000:]
        self.new_rows = rows(whole, self.which)
        self.new_view = view(whole) if self.which is REFRESH else None
        assert not leftovers(whole, self.which), leftovers(whole, self.which)
        ops = []
        with open(trace, encoding="utf-8") as f:
            for line in f:
                n, kind, pid, path = line.rstrip("\n").split(" ", 3)
                ops.append((int(n), kind, path, int(pid)))
        self.driver = ops[0][3]
        return ops

    def point(self, n: int, kind: str, path: str, signal: str, crash: str | None = None) -> Point:
        """The run stopped by SIGNAL just before its operation (CRASH: a PARAGEN_CRASH_AT spec;
        default the driver's Nth operation), checked, then the same command run again."""
        started = time.monotonic()
        out = self.store.path(f"p{n}-{signal.lower()}-{time.monotonic_ns() % 10**6}")
        self.store.copy(self.start, out)
        which, args = self.which, self.args(out, self.command)
        spec = f"{crash or n}:{signal}"
        p = Point(n, kind, path, signal, fresh=self.previous_rows is None)
        if signal == "STOP":
            return self._paused(p, out, args, spec, started)
        stopped = job(args, {**self.env, "PARAGEN_CRASH_AT": spec}, which=which)
        p.exit_status = stopped.returncode
        self._seen(p, out)
        again = job(args, self.env, which=which)
        p.rerun_status = again.returncode
        p.log = _tails(stopped=stopped.stderr, rerun=again.stderr)
        return self._after(p, out, started)

    def _seen(self, p: Point, out: str) -> None:
        try:
            p.seen = _classify(rows(out, self.which), self.previous_rows, self.new_rows)
            if self.which is REFRESH:
                p.seen_view = _classify_view(view(out), self.previous_view, self.new_view)
        except OSError as exc:             # a file the manifest lists is gone: not readable at all
            p.seen = f"MIXED (unreadable: {str(exc)[:120]})"

    def _after(self, p: Point, out: str, started: float) -> Point:
        try:
            p.rows_right = rows(out, self.which) == self.new_rows
        except OSError:
            p.rows_right = False
        p.left = leftovers(out, self.which)
        p.seconds = time.monotonic() - started
        return p

    def _paused(self, p: Point, out: str, args: list[str], spec: str, started: float) -> Point:
        """The holder paused at the operation past its lease; the same command started meanwhile
        (it takes over); the paused one resumed."""
        env = {**self.env, "PARAGEN_LEASE_SECONDS": LEASE}
        paused = job(args, {**env, "PARAGEN_CRASH_AT": spec}, which=self.which, wait=False)
        try:
            if not _until_stopped(paused):
                p.exit_status = paused.wait(600)
                p.seen, p.rerun_status = "op not reached", -1
                return self._after(p, out, started)
            self._seen(p, out)
            time.sleep(float(LEASE) + 1)
            other = job(args, env, which=self.which)
            p.rerun_status = other.returncode
        finally:
            paused.send_signal(signals.SIGCONT)
        _, err = paused.communicate(timeout=600)
        p.exit_status = paused.returncode
        p.log = _tails(paused=err, taker=other.stderr)
        return self._after(p, out, started)


def _tails(**stderrs: str) -> str:
    return "\n".join(f"  [{name}] {line}" for name, text in stderrs.items()
                     for line in (text or "").strip().splitlines()[-6:])


def _until_stopped(proc: subprocess.Popen, timeout: float = 600) -> bool:
    """Until PROC stopped itself (its crash point, SIGSTOP): True; False if it ended first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with open(f"/proc/{proc.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "T":
                    return True
        except FileNotFoundError:
            return False
        time.sleep(0.02)
    raise AssertionError("the job did not reach its crash point")


ATTEMPT = re.compile(r"-[0-9a-f]{8}(-\d{3})?\.parquet$")
WORK_RUN = re.compile(r"/_work/[^/]+/")


def worker_crash(path: str, ops: list) -> str | None:
    """The PARAGEN_CRASH_AT pattern (without the signal) that stops whichever process makes the
    operation on PATH, in every run: a unit's or group's file by its name before the attempt id
    (``*``: contains), a record under _work by its name after the run id (``~``: ends with); None
    when the pattern would not be unique in the run (OPS)."""
    found = WORK_RUN.search(path)
    if found:
        pattern, test = "~" + path[found.end() - 1:], lambda p, s=path[found.end() - 1:]: p.endswith(s)
    elif ATTEMPT.search(path):
        stem = path[:ATTEMPT.search(path).start() + 1]
        pattern, test = "*" + stem, lambda p, s=stem: s in p
    else:
        return None
    writes = [o for o in ops if o[1] == "write" and test(o[2])]
    return pattern if len(writes) == 1 else None


def chosen(ops: list, count: int) -> list:
    """COUNT operations spread over the run, each kind of step among them: the first operation,
    the first write of a unit and of its record, the first compaction write, the manifest, the
    first delete after it, and evenly spaced others."""
    marks = [ops[0]]
    for test in (lambda o: o[1] == "write" and "/part-u" in o[2],
                 lambda o: o[1] == "write" and "/units/" in o[2],
                 lambda o: o[1] == "write" and "/part-s" in o[2],
                 lambda o: o[2].endswith(("_manifest.json", "latest.json")),
                 lambda o: o[1] in ("delete", "delete_tree")):
        hit = next((o for o in ops if test(o)), None)
        if hit and hit not in marks:
            marks.append(hit)
    step = max(1, len(ops) // max(1, count - len(marks)))
    for o in ops[::step]:
        if len(marks) >= count:
            break
        if o not in marks:
            marks.append(o)
    return sorted(marks)


def temporary_store(base: str | None = None) -> tuple[Store, str]:
    """A local Store under BASE (a fresh temporary folder when None: the caller removes it)."""
    work = base or tempfile.mkdtemp(prefix="paragen-crash-")
    return Store(os.path.join(work, "runs")), work


# ---- the sweeps: one job, one mode ---------------------------------------------------------------

def _write_lines(path: str, lines: list[str]) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(lines)
    return path


def generation_sweep(store: Store, work: str, models: str, mode: str = "overwrite", pairs: int = 12,
                     extra: tuple = ()) -> Sweep:
    """The generation job on PAIRS toy pairs in two shards. MODE:

    - ``overwrite``: replaces a committed run of other settings (``--overwrite``);
    - ``same``: an empty output, the command without ``--overwrite`` (what a scheduler reruns);
    - ``previous``: ``--previous OUT --output OUT --overwrite`` with a shard added to a committed run.
    EXTRA: options of every command (``--direct_running_mode multi_processing``, a Dask runner)."""
    from tests.jobs import quick_args
    from tests.toydata import toy_bitext

    lines = [f"{s}\t{t}\n" for s, t in toy_bitext(400, seed=31)[:pairs]]
    folder = os.path.join(work, "in")
    os.makedirs(folder, exist_ok=True)
    first = _write_lines(os.path.join(folder, "a.tsv"), lines[:pairs * 2 // 3])
    _write_lines(os.path.join(folder, "b.tsv"), lines[pairs * 2 // 3:])
    only_first = os.path.join(work, "in-a")
    os.makedirs(only_first, exist_ok=True)
    shutil.copy(first, only_first)

    def base(out):                           # quick_args less its leading --input: each mode gives its own
        return quick_args(folder, out, models, *extra)[2:]

    both = ["--input", folder]
    setups = {"overwrite": ([[*both, "--num_samples", "2"]], [*both, "--overwrite"]),
              "same": ([], both),
              "previous": ([["--input", only_first]], [*both, "--previous", "{out}", "--overwrite"])}
    setup, command = setups[mode]
    return Sweep(store, base, setup, command, work, GENERATE, mode)


def filter_sweep(work: str, store: Store | None = None, mode: str = "overwrite", report: bool = True) -> Sweep:
    """The filter job over a synthetic generation run (two partitions), with its report (or
    ``--no_report``). MODE ``overwrite``: replacing a committed filter run of another threshold;
    ``same``: an empty output, no ``--overwrite``."""
    from tests.toydata import paraphrase_rows, toy_paraphrases, write_generation_run

    gen = os.path.join(work, "gen")
    if not os.path.isdir(gen):
        write_generation_run(gen, paraphrase_rows(toy_paraphrases(600, seed=2)), shards=2)
    configs = []
    for name, top in (("a", 0.9), ("b", 0.5)):
        configs.append(_write_lines(os.path.join(work, f"{name}.yaml"), [
            f"filters:\n  - name: ngram_overlap\n    thresholds: {{trigram_overlap: {{max: {top}}}}}\n"]))
    store = store or temporary_store(work)[0]
    base = ["--input", gen] + ([] if report else ["--no_report"])
    setups = {"overwrite": ([["--config", configs[0]]], ["--config", configs[1], "--overwrite"]),
              "same": ([], ["--config", configs[1]])}
    setup, command = setups[mode]
    return Sweep(store, lambda out: [*base, "--output", out], setup, command, work, FILTER, mode)


def refresh_sweep(work: str, models: str, store: Store | None = None, mode: str = "filtered") -> Sweep:
    """A refresh after committed refreshes (a shard changed or added each time). MODE:

    - ``filtered``: with the filter job, ``--keep 1``: it prunes the run before;
    - ``keep2``: with the filter job, ``--keep 2``, after two refreshes whose second takes files
      from the first: the new one takes files from both, so retention keeps them by reference;
    - ``filter_on``: refreshes without the filter job, then one with ``--filter_args`` that finds
      nothing new: it filters latest's run and publishes that filter run (retention must keep
      every file ``latest`` reads);
    - ``filter_off``: refreshes with the filter job, then one without, a shard added."""
    from tests.jobs import refresh_job_args
    from tests.toydata import toy_bitext

    lines = [f"{s}\t{t}\n" for s, t in toy_bitext(400, seed=51)[:30]]
    inputs = {}
    for name, shards in (("one", {"a.tsv": lines[:10]}), ("two", {"a.tsv": lines[:10], "b.tsv": lines[10:20]}),
                         ("three", {"a.tsv": lines[:10], "b.tsv": lines[10:20], "c.tsv": lines[20:30]}),
                         ("changed", {"a.tsv": lines[:8], "b.tsv": lines[8:12]})):
        folder = os.path.join(work, f"in-{name}")
        os.makedirs(folder, exist_ok=True)
        for shard, text in shards.items():
            _write_lines(os.path.join(folder, shard), text)
        inputs[name] = folder
    config = _write_lines(os.path.join(work, "filter.yaml"),
                          ["filters:\n  - name: ngram_overlap\n    thresholds: {trigram_overlap: {max: 0.7}}\n"])
    filtered = [f"--filter_args=--config {config}"]

    def run(keep, with_filter, folder):
        # --retain 0: retention by --keep and by reference alone, so that every sweep walks its deletes
        return ["--keep", keep, "--retain", "0", *(filtered if with_filter else []), "--", *refresh_job_args(models),
                "--input", inputs[folder]]
    modes = {"filtered": ([run("1", True, "one")], run("1", True, "changed")),
             "keep2": ([run("2", True, "one"), run("2", True, "two")], run("2", True, "three")),
             "filter_on": ([run("2", False, "one"), run("2", False, "two")], run("2", True, "two")),
             "filter_off": ([run("2", True, "one"), run("2", True, "two")], run("2", False, "three"))}
    setup, command = modes[mode]
    store = store or temporary_store(work)[0]
    return Sweep(store, lambda root: ["--root", root], setup, command, work, REFRESH, mode)
