"""What a run does about its SLURM worker jobs, decided from what squeue says of them. Plain code
with no SLURM in it (beam_pipelines/slurm.py asks squeue, submits and cancels), so that every
rule can be tried on made-up observations:

- a job that ended is forgotten and replaced; one that ended before any of its Dask workers joined
  the run (a failed start: a bad node, a wrong interface, a Python the node cannot run) counts
  towards a back-off (the next submission waits 30 s, doubled each time, up to 10 minutes) and a
  cap (five failed starts in a row end the run, naming the jobs and their logs); a start that
  joins resets both;
- a node on which two jobs failed to start is excluded from the next submissions;
- jobs pending for long are reported with SLURM's reason (a QOS or GPU limit, a partition down);
- a running job near its lifetime (Dask's --lifetime, a few minutes before its time limit) gets
  a spare submitted ahead of it, so that the fleet does not empty while its replacement queues:
  ahead by a fifth of its lifetime (at most 30 minutes), or by one and a half times the longest
  wait in the queue seen lately, whichever is more.
"""
from __future__ import annotations

import dataclasses

ALIVE = {"PD", "R", "CF", "RQ", "RS", "RH", "S", "ST", "SI", "SO", "RD", "RF"}  # squeue's short states
MAX_FAILED_STARTS = 5            # failed starts in a row that end the run
BACKOFF_FIRST_S, BACKOFF_MAX_S = 30.0, 600.0
NODE_FAILURES = 2                # failed starts on one node that exclude it
SPARE_LEAD_MAX_S = 1800.0        # a spare is submitted at most this long before a worker's earliest end
REASONS = {                      # squeue's pending reasons a user may not know
    "Resources": "waiting for free nodes",
    "Priority": "other jobs are ahead in the queue",
    "PartitionDown": "the partition is down",
    "PartitionNodeLimit": "the partition allows fewer nodes",
    "PartitionTimeLimit": "the time limit exceeds the partition's",
    "ReqNodeNotAvail": "the nodes asked for are unavailable (down, drained or reserved)",
    "QOSMaxGRESPerUser": "the QOS's limit of GPUs per user",
    "QOSMaxJobsPerUserLimit": "the QOS's limit of jobs per user",
    "QOSMaxSubmitJobPerUserLimit": "the QOS's limit of submitted jobs per user",
    "QOSGrpGRES": "the QOS's group GPU limit",
    "AssocGrpGRES": "the account's GPU limit",
    "AssocMaxJobsLimit": "the account's job limit",
    "JobHeldUser": "held by the user (scontrol release)",
    "JobHeldAdmin": "held by an administrator",
    "BeginTime": "its start time is in the future",
}


@dataclasses.dataclass
class Row:
    """One squeue row of a worker job: its state (short form), pending reason and node(s)."""
    state: str
    reason: str = ""
    node: str = ""


@dataclasses.dataclass
class Job:
    spec: str                    # the Dask cluster's name of the job (its workers' names start with it)
    job_id: str
    submitted: float
    running_since: float | None = None
    pending_since: float | None = None
    node: str = ""
    reason: str = ""
    joined: bool = False
    ended_at: float | None = None

    def ran_s(self, now: float) -> float:
        """Seconds it ran (as the looks at the queue saw it: to within one look)."""
        if self.running_since is None:
            return 0.0
        return max(0.0, (self.ended_at if self.ended_at is not None else now) - self.running_since)


@dataclasses.dataclass
class Step:
    """What to do after a look at the queue."""
    ended: list = dataclasses.field(default_factory=list)       # Jobs that ended (forget them)
    exclude: list = dataclasses.field(default_factory=list)     # nodes to exclude from now on
    want: int = 0                                               # jobs to have submitted (never fewer)
    report: str | None = None                                   # pending jobs, said now
    give_up: str | None = None                                  # why the run must end


class Fleet:
    """The worker jobs of one run: TARGET kept submitted; LIFETIME_S, STAGGER_S: Dask's --lifetime
    and --lifetime-stagger of a worker (None: no spares); CHECK_S: seconds between looks."""

    def __init__(self, target: int, lifetime_s: float | None = None, stagger_s: float = 0.0, check_s: float = 30.0,
                 max_failed_starts: int = MAX_FAILED_STARTS, backoff_s: tuple[float, float] = (BACKOFF_FIRST_S,
                                                                                          BACKOFF_MAX_S)):
        self.target, self.check_s = target, check_s
        self.max_failed_starts, self.backoff_s = max_failed_starts, backoff_s
        self.jobs: dict[str, Job] = {}           # by job id
        self.finished: list[Job] = []            # the jobs that ended, in order
        self.failed_in_a_row: list[Job] = []
        self.last_failure = 0.0
        self.node_failures: dict[str, int] = {}
        self.excluded: list[str] = []
        self.report_every_s = 10 * check_s
        self.last_report = None
        self.earliest_end_s = max(1.0, lifetime_s - stagger_s) if lifetime_s else None  # the soonest a worker leaves
        self.waits: list[float] = []             # the last jobs' seconds in the queue

    def submitted(self, spec: str, job_id: str, now: float) -> None:
        if job_id not in self.jobs:
            self.jobs[job_id] = Job(spec, job_id, now)

    def joined(self, spec: str) -> None:
        """A Dask worker of the job SPEC connected to the scheduler: it started well."""
        for job in self.jobs.values():
            if job.spec == spec and not job.joined:
                job.joined = True
                self.failed_in_a_row.clear()

    def backoff_until(self) -> float:
        """When the next submission may go (0: now)."""
        if not self.failed_in_a_row:
            return 0.0
        first, most = self.backoff_s
        return self.last_failure + min(most, first * 2 ** (len(self.failed_in_a_row) - 1))

    def look(self, rows: dict[str, Row], now: float, in_flight: int = 0) -> Step:
        """ROWS: squeue's rows of this run's jobs by id (finished jobs may be missing); IN_FLIGHT:
        submissions without a job id yet."""
        step = Step()
        for job in list(self.jobs.values()):
            row = rows.get(job.job_id)
            if row is not None and row.state in ALIVE:
                if row.node and row.state != "PD":
                    job.node = row.node
                if row.state == "PD":
                    if job.pending_since is None:
                        job.pending_since = now
                    job.reason = row.reason
                else:
                    job.pending_since = None
                    if job.running_since is None:
                        job.running_since = now
                        self.waits = [*self.waits[-4:], now - job.submitted]
                continue
            if row is not None and row.node and row.node not in ("(null)", "None"):
                job.node = row.node
            del self.jobs[job.job_id]
            job.ended_at = now
            self.finished.append(job)
            step.ended.append(job)
            if not job.joined:
                self.failed_in_a_row.append(job)
                self.last_failure = now
                if job.node and "," not in job.node:
                    self.node_failures[job.node] = self.node_failures.get(job.node, 0) + 1
                    if self.node_failures[job.node] == NODE_FAILURES and job.node not in self.excluded:
                        self.excluded.append(job.node)
                        step.exclude.append(job.node)
        if len(self.failed_in_a_row) >= self.max_failed_starts:
            ids = [j.job_id for j in self.failed_in_a_row]
            step.give_up = (f"{len(ids)} SLURM worker jobs in a row ended before any of their workers joined the run "
                            f"(jobs {', '.join(ids)})")
        step.report = self._pending_report(now)
        alive = len(self.jobs) + in_flight
        # TARGET jobs kept that are not near their end: each job near its end has a spare, a spare
        # near its own end too (with lifetimes short next to the queue's wait, two may overlap)
        spare_at = self.spare_at_s()
        leaving = sum(1 for j in self.jobs.values()
                      if spare_at is not None and j.running_since is not None and now - j.running_since >= spare_at)
        wanted = self.target + leaving
        step.want = alive if now < self.backoff_until() else max(alive, wanted)
        return step

    def spare_at_s(self) -> float | None:
        """Seconds after a job started running when its spare is submitted (None: no spares)."""
        if self.earliest_end_s is None:
            return None
        lead = max(3 * self.check_s, min(SPARE_LEAD_MAX_S, self.earliest_end_s / 5),
                   1.5 * max(self.waits, default=0.0) + self.check_s)
        return max(0.0, self.earliest_end_s - lead)

    def usage(self, now: float, gpus_per_job: int) -> dict:
        """What the run's worker jobs cost so far: the manifest's "slurm" entry."""
        every = [*self.finished, *self.jobs.values()]
        seconds = sum(j.ran_s(now) for j in every)
        return {"worker_jobs": [j.job_id for j in every], "jobs_that_ran": sum(1 for j in every if j.running_since),
                "failed_starts": sum(1 for j in self.finished if not j.joined), "excluded_nodes": list(self.excluded),
                "worker_job_hours": round(seconds / 3600, 4), "gpu_hours": round(seconds * gpus_per_job / 3600, 4)}

    def _pending_report(self, now: float) -> str | None:
        pending = [j for j in self.jobs.values() if j.pending_since is not None
                   and now - j.pending_since >= self.report_every_s]
        if not pending or (self.last_report is not None and now - self.last_report < self.report_every_s):
            return None
        self.last_report = now
        reasons: dict[str, int] = {}
        for j in pending:
            reasons[j.reason or "None"] = reasons.get(j.reason or "None", 0) + 1
        said = ", ".join(f"{r} ({REASONS[r]}): {n}" if r in REASONS else f"{r}: {n}"
                         for r, n in sorted(reasons.items()))
        longest = max(now - j.pending_since for j in pending)
        since = f"{longest:.0f} s" if longest < 120 else f"{longest / 60:.0f} min"
        return f"{len(pending)} worker job(s) pending, the longest for {since}; SLURM's reason: {said}"
