"""The crash-point harness (issue 53): stop a job (the generation job, the filter job) at its Nth
storage operation and check what a reader sees then and what the same command does after.

As ALICE (Pillai et al., OSDI 2014) and SQLite's crash tests do for file systems: a run is traced
once (common/crash_points.py, PARAGEN_STORAGE_TRACE: every write, delete and listing, in order),
then for each chosen N the same run starts again from the same state and stops just before its
Nth operation (PARAGEN_CRASH_AT=N:KILL, or TERM for a preemption). At that instant:

* a reader (committed_files: what the manifest lists) sees the run committed before or the new
  one, whole, never a mix;
* the same command run again exits 0 with exactly the rows of an uninterrupted run;
* and nothing is left that the manifest does not list: no unit files, no files of the run it
  replaced, no _work, no _owner.json.

The state every point starts from is a committed run of other settings in the output, which the
run under test replaces (--overwrite): so that "the previous run or the new one" has two answers.
The job runs in one process (the in-memory runner), so its operations have one order.
Used by tests/test_crash_points.py (a sample of points) and bench/bench_crash_points.py (all).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Job:
    """A job the harness runs: its module, the manifest it publishes and the table readers read;
    REPLACES: the option that lets a run replace a committed one."""
    module: str = "beam_pipelines.generate"
    manifest: str = "_manifest.json"
    table: str = "paraphrases"
    replaces: tuple = ("--overwrite",)


GENERATE = Job()
FILTER = Job("beam_pipelines.filter", "_filter_manifest.json", "scored")
# A refresh: the generation and filter runs under ROOT/runs and ROOT/filtered, published by
# latest.json (the commit point) and the latest/ view; each refresh is a new run, nothing to replace.
REFRESH = Job("beam_pipelines.refresh", "latest.json", "paraphrases", replaces=())


def job(args: list[str], env: dict | None = None, timeout: float = 600,
        which: Job = GENERATE) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", which.module, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": ROOT, **(env or {})})


def rows(out: str, which: Job = GENERATE):
    """The committed rows of the job's table in OUT as sorted tuples, or None when nothing is
    committed. A refresh root: what a reader of latest.json sees, the generation run's rows and
    its filter run's."""
    from common import storage
    from paracorpus.commit import committed_files

    if which is REFRESH:
        named = storage.join(out, "latest.json")
        if not storage.isfile(named):
            return None
        run_id = storage.read_json(named)["run_id"]
        return rows(storage.join(out, "runs", run_id)), rows(storage.join(out, "filtered", run_id), FILTER)

    try:
        files = committed_files(out, which.table, which.manifest)
    except FileNotFoundError:
        return None
    if not files:
        return []
    table_ = storage.parquet_dataset(files).to_table()
    return sorted(tuple((k, str(v)) for k, v in sorted(r.items())) for r in table_.to_pylist())


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
                  if _canonical(p) not in listed and storage.basename(p) != which.manifest)


def _refresh_leftovers(root: str) -> list[str]:
    from common import storage

    left, kept = [], set()
    for name in storage.listdir(storage.join(root, "runs")):
        run_dir = storage.join(root, "runs", name)
        if not storage.isfile(storage.join(run_dir, GENERATE.manifest)):
            left.append(f"runs/{name} (no manifest)")
            continue
        kept.add(name)
        left += [f"runs/{name}: {p}" for p in leftovers(run_dir)]
    for name in storage.listdir(storage.join(root, "filtered")):
        if name not in kept or not storage.isfile(storage.join(root, "filtered", name, FILTER.manifest)):
            left.append(f"filtered/{name} (of no kept run)")
        else:
            left += [f"filtered/{name}: {p}" for p in leftovers(storage.join(root, "filtered", name), FILTER)]
    logs = storage.listdir(storage.join(root, "logs"))
    # the newest refresh's log stays when it was a no-op (no run of its own), until the next refresh
    left += [f"logs/{n}" for n in logs if n.removesuffix(".log") not in kept and n != max(logs)]
    extra = sorted(set(storage.listdir(root)) - {"runs", "filtered", "logs", "latest", "latest.json"})
    left += extra                                   # _refresh.lock, or anything else
    named = rows(root, REFRESH)
    view = (rows(storage.join(root, "latest")), rows(storage.join(root, "latest", "filtered"), FILTER))
    if named is not None and view != named:
        left.append("latest/ (a view of another run than latest.json names)")
    return left


@dataclass
class Store:
    """Where the runs go: a local folder or a bucket prefix, and how to copy a state."""
    root: str
    env: dict = field(default_factory=dict)

    def path(self, name: str) -> str:
        from common import storage

        return storage.join(self.root, name)

    def copy(self, src: str, dst: str) -> None:
        from common import storage

        if not storage.is_url(src):
            shutil.copytree(src, dst)
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
    seen: str = ""            # "previous", "new", "MIXED" or "none" at the instant of the stop
    rerun_status: int = 0
    rows_right: bool = False
    left: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.seen in ("previous", "new") and self.rerun_status == 0 and self.rows_right and not self.left


class Sweep:
    """One job's crash points in one store: BASE_ARGS(out) are the run's options without
    --output... given OUT; PREVIOUS_EXTRA the options of the committed run it replaces."""

    def __init__(self, store: Store, base_args, previous_extra: list[str], new_extra: list[str], workdir: str,
                 which: Job = GENERATE):
        self.store, self.base_args = store, base_args
        self.previous_extra, self.new_extra = previous_extra, new_extra
        self.workdir, self.which = workdir, which
        self.env = {**store.env, "PARAGEN_STORAGE_RETRY_SECONDS": "5"}

    def _args(self, out: str, extra: list[str]) -> list[str]:
        return [*self.base_args(out), *extra]

    def prepare(self) -> list[tuple[int, str, str]]:
        """The committed state every point starts from, the rows of the run before and after, and
        the uninterrupted run's operations (n, kind, path)."""
        os.environ.update(self.store.env)
        which = self.which
        self.start = self.store.path("start")
        done = job(self._args(self.start, self.previous_extra), self.env, which=which)
        assert done.returncode == 0, done.stderr[-3000:]
        self.previous_rows = rows(self.start, which)
        whole = self.store.path("whole")
        self.store.copy(self.start, whole)
        trace = os.path.join(self.workdir, "trace.txt")
        done = job(self._args(whole, self.new_extra + list(which.replaces)),
                   {**self.env, "PARAGEN_STORAGE_TRACE": trace}, which=which)
        assert done.returncode == 0, done.stderr[-3000:]
        self.new_rows = rows(whole, which)
        assert self.new_rows != self.previous_rows and not leftovers(whole, which), leftovers(whole, which)
        ops = []
        with open(trace, encoding="utf-8") as f:
            for line in f:
                n, kind, path = line.rstrip("\n").split(" ", 2)
                ops.append((int(n), kind, path))
        return ops

    def point(self, n: int, kind: str, path: str, signal: str) -> Point:
        """The run stopped by SIGNAL just before its Nth operation, checked, then run again."""
        started = time.monotonic()
        out = self.store.path(f"p{n}-{signal.lower()}")
        self.store.copy(self.start, out)
        which = self.which
        args = self._args(out, self.new_extra + list(which.replaces))
        stopped = job(args, {**self.env, "PARAGEN_CRASH_AT": f"{n}:{signal}"}, which=which)
        p = Point(n, kind, path, signal, stopped.returncode)
        seen = rows(out, which)
        p.seen = ("previous" if seen == self.previous_rows else "new" if seen == self.new_rows
                  else "none" if seen is None else "MIXED")
        again = job(args, self.env, which=which)
        p.rerun_status = again.returncode
        p.rows_right = rows(out, which) == self.new_rows
        p.left = leftovers(out, which)
        p.seconds = time.monotonic() - started
        return p


def chosen(ops: list[tuple[int, str, str]], count: int) -> list[tuple[int, str, str]]:
    """COUNT operations spread over the run, each kind of step among them: the first operation,
    the first write of a unit and of its record, the first compaction write, the manifest, the
    first delete after it, and evenly spaced others."""
    marks = [ops[0]]
    for test in (lambda o: o[1] == "write" and "/part-u" in o[2],
                 lambda o: o[1] == "write" and "/units/" in o[2],
                 lambda o: o[1] == "write" and "/part-s" in o[2],
                 lambda o: o[2].endswith("_manifest.json"),
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
