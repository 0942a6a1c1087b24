"""What a job does for a Flink cluster beyond Beam's FlinkRunner: the Flink job is named after the
run, and a stopped job cancels it.

Beam's FlinkRunner submits the pipeline through its Flink job server (a Java process the submitting
job starts) to the cluster, and the Flink job then runs there on its own: if the submitting job
stops (SIGTERM, Ctrl-C, a preempted pod), killing the job server does not stop it, and it would go
on decoding for a run whose claim was just released (its workers' writes are refused by then:
paracorpus.commit.Fence) until Flink gave up after its restarts. So a job submitted to a
Flink cluster is named ``paragen-<job>-<run id>`` (unless ``--job_name`` is given), and a stop
cancels the Flink jobs of that name through Flink's REST API (``PATCH /jobs/<id>?mode=cancel``), by
the address ``--flink_master`` names; the same command then continues the run. A SIGKILL leaves the
Flink job running: its workers keep writing units for the run under its claim, which the same
command takes over once its lease ran out (its workers are refused from then on).

A batch job restarts after a failed task (a lost task manager) only when the cluster's own
configuration has a restart strategy: Beam's per-job restart options do not reach batch jobs of its
Flink runner (beam_pipelines/runners.py). :func:`restarts_of` reads the cluster's setting, and the
job says at its start when a lost task manager would end the run.
"""
from __future__ import annotations

import json
import logging
import urllib.request

from common.cli import option_value

log = logging.getLogger("paragen")
MAGIC_MASTERS = ("[local]", "[auto]", "")       # Beam's embedded or automatic Flink: no REST address
_ENDED = ("FINISHED", "CANCELED", "FAILED")


def flink_rest(beam_args: list[str]) -> str | None:
    """The REST address (http://host:port) of the Flink cluster BEAM_ARGS submit to, or None when
    the runner is not Flink's or the cluster is Beam's embedded one."""
    runner = (option_value(beam_args, "--runner") or "").lower()
    master = (option_value(beam_args, "--flink_master") or "").strip()
    if "flink" not in runner or master in MAGIC_MASTERS:
        return None
    return master.rstrip("/") if master.startswith(("http://", "https://")) else f"http://{master.rstrip('/')}"


def named(beam_args: list[str], name: str) -> tuple[list[str], str]:
    """(BEAM_ARGS with --job_name NAME unless one is given, the job name)."""
    given = option_value(beam_args, "--job_name")
    return (list(beam_args), given) if given else ([*beam_args, "--job_name", name], name)


def cancel_jobs_named(rest: str, name: str, timeout: float = 10.0) -> list[str]:
    """Cancel every Flink job called NAME at REST that has not ended; their ids."""
    with urllib.request.urlopen(f"{rest}/jobs/overview", timeout=timeout) as r:
        jobs = json.load(r).get("jobs", [])
    cancelled = []
    for job in jobs:
        if job.get("name") == name and job.get("state") not in _ENDED:
            req = urllib.request.Request(f"{rest}/jobs/{job['jid']}?mode=cancel", method="PATCH")
            with urllib.request.urlopen(req, timeout=timeout):
                pass
            cancelled.append(job["jid"])
            log.info("cancelled Flink job %s (%s) at %s", job["jid"], name, rest)
    return cancelled


NO_RESTART = ("", "none", "off", "disable")


def restarts_of(rest: str, timeout: float = 10.0) -> str | None:
    """The restart strategy of the Flink cluster at REST (its ``restart-strategy.type``, or the
    legacy ``restart-strategy``), '' when it has none, None when the cluster did not say."""
    try:
        with urllib.request.urlopen(f"{rest}/jobmanager/config", timeout=timeout) as r:
            config = {e.get("key"): e.get("value") for e in json.load(r)}
    except (OSError, ValueError):
        return None
    return str(config.get("restart-strategy.type") or config.get("restart-strategy") or "").strip().lower()


def warn_if_no_restarts(rest: str) -> None:
    """One line when the cluster at REST restarts no failed batch job."""
    strategy = restarts_of(rest)
    if strategy is not None and strategy in NO_RESTART:
        log.warning("the Flink cluster at %s has no restart strategy (restart-strategy.type): a failed task, a lost "
                    "task manager, ends this run, and the same command then continues it; set "
                    "restart-strategy.type: fixed-delay in the cluster's configuration to restart instead", rest)
