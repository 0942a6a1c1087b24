"""The phases the jobs share around their pipelines: claim the output, decide under the claim,
commit (or hold back) and publish. The protocol itself (owner record, manifests written last and
conditionally, no renames) is paracorpus/commit.py; this is how a job uses it.

    with Claim(output, run_id):  one writer at a time (a heartbeat; a dead holder is taken over)
        finish_cleanup(...)      a run stopped during its clean-up: finished first
        manifest, version = read_manifest_versioned(...)   what the run plans on, read under the claim
        refuse_to_replace(...)   a committed run stays unless asked (--overwrite)
        ... the job's pipeline ...
        commit(..., expected=version)   publish only over that version, or hold it back and say why
"""
from __future__ import annotations

import contextlib
import logging

from common import storage
from common.cli import JobFailed, OutputBusy, UsageError
from paracorpus.commit import (Claim, Fence, cleanup_pending, publish, read_manifest, read_manifest_versioned,
                               remove_unlisted)

log = logging.getLogger("paragen")

__all__ = ["Claim", "refuse_to_replace", "commit", "finish_cleanup"]


def refuse_to_replace(output: str, manifest_name: str, what: str, allowed: bool,
                      committed: dict | None = None) -> None:
    """UsageError when OUTPUT already holds a committed run (its MANIFEST_NAME, or COMMITTED when
    the caller read it under its claim) and replacing it is not ALLOWED (--overwrite); WHAT
    names it in the message."""
    committed = committed if committed is not None else read_manifest(output, manifest_name)
    if committed is not None and not allowed:
        raise UsageError(f"{output} already holds {what} ({committed.get('run_id')}); pass --overwrite "
                         "to replace it (it stays readable until the new run commits)")


def commit(output: str, manifest_name: str, manifest: dict, tables: tuple[str, ...], work: str,
           problem: JobFailed | None = None, guard=contextlib.nullcontext, claim: Claim | None = None,
           expected: storage.Version | None = None, watch=()) -> list[str]:
    """Publish MANIFEST as OUTPUT/MANIFEST_NAME, only over version EXPECTED (the manifest the run
    planned on, read under its claim; a run that another published over meanwhile fails, exit
    75); the files it does not list under TABLES, and the runs' _work, are removed after. With a
    PROBLEM (counts that do not reconcile, nothing to publish) nothing is published: the manifest
    is kept as WORK/manifest.json for a person to read, and PROBLEM is raised. Either way the run
    committed before stays whole until this one's manifest replaces it. GUARD
    (stopping.Stopping.critical) keeps a signal from cutting the manifest's write in half. The
    fence (CLAIM's, watching each (path, version, what) of WATCH too: a manifest this run builds
    on, e.g. the run --previous names, so that a run never publishes references into files
    another run's clean-up may have removed) runs before the manifest and, watching the manifest
    too, before each delete: a run that lost any stops, exit 75, touching nothing."""
    fence = claim.fence if claim is not None else Fence(output, "")
    for path, version, what in watch:
        if path != storage.join(output, manifest_name):     # the output's own: its next version is the publish
            fence = fence.watching(path, version, what)
    fence(force=True)
    if problem is not None:
        storage.write_json(storage.join(work, "manifest.json"), manifest)
        raise problem
    removed = publish(output, manifest_name, manifest, tables, expected, guard, fence)
    log.info("published run %s: %d files; removed %d files of earlier runs and attempts", manifest.get("run_id"),
             sum(len(v) for v in manifest.get("files", {}).values()), len(removed))
    return removed


def finish_cleanup(output: str, manifest_name: str, tables: tuple[str, ...], claim: Claim) -> list[str] | None:
    """Under CLAIM: the clean-up of OUTPUT's committed run, finished when a stop cut it short
    (its ``_work/<run id>`` is still there: removed last): its unit files, the files of the run it
    replaced, the hidden files of killed writes and the runs' _work go, as its own clean-up would
    have done. The removed files, or None when there was nothing to finish."""
    manifest, version = read_manifest_versioned(output, manifest_name)
    if not cleanup_pending(output, manifest):
        return None
    path = storage.join(output, manifest_name)
    storage.versions.repair_copy(path)      # a stop between the manifest's version and its copy
    removed = remove_unlisted(output, manifest, tables, claim.fence.watching(path, version, "the run's manifest"))
    print(f"finished the clean-up of run {manifest['run_id']} (stopped after it was published): removed "
          f"{len(removed)} files it does not list, and its _work", flush=True)
    return removed
