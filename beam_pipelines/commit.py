"""The phases the jobs share around their pipelines: claim the output, commit (or hold back) and
publish. The protocol itself (owner record, manifests written last, no renames) is
paracorpus/commit.py; this is how a job uses it.

    refuse_to_replace(...)       before anything is written: a committed run stays unless asked
    with Claim(output, run_id):  one writer at a time (a heartbeat; a dead holder is taken over)
        ... the job's pipeline ...
        commit(...)              publish the manifest, or hold it back in _work/ and say why
"""
from __future__ import annotations

import contextlib
import logging

from common import storage
from common.cli import JobFailed, UsageError
from paracorpus.commit import WORK, Claim, publish, read_manifest, remove_unlisted

log = logging.getLogger("paragen")

__all__ = ["Claim", "refuse_to_replace", "commit", "finish_cleanup"]


def refuse_to_replace(output: str, manifest_name: str, what: str, allowed: bool) -> None:
    """UsageError when OUTPUT already holds a committed run (its MANIFEST_NAME) and replacing it
    is not ALLOWED (--overwrite); WHAT names it in the message."""
    committed = read_manifest(output, manifest_name)
    if committed is not None and not allowed:
        raise UsageError(f"{output} already holds {what} ({committed.get('run_id')}); pass --overwrite "
                         "to replace it (it stays readable until the new run commits)")


def commit(output: str, manifest_name: str, manifest: dict, tables: tuple[str, ...], work: str,
           problem: JobFailed | None = None, guard=contextlib.nullcontext, claim: Claim | None = None) -> list[str]:
    """Publish MANIFEST as OUTPUT/MANIFEST_NAME (the files it does not list under TABLES, and the
    run's _work, are removed after); the removed files. With a PROBLEM (counts that do not
    reconcile, nothing to publish) nothing is published: the manifest is kept as WORK/manifest.json
    for a person to read, and PROBLEM is raised. Either way the run committed before stays whole
    until this one's manifest replaces it. GUARD (stopping.Stopping.critical) keeps a signal from
    cutting the manifest's write in half; CLAIM, this run's, is checked before the manifest and
    before any delete (a run that lost it stops, exit 75, touching nothing)."""
    if claim is not None:
        claim.check()
    if problem is not None:
        storage.write_json(storage.join(work, "manifest.json"), manifest)
        raise problem
    removed = publish(output, manifest_name, manifest, tables, guard, claim.check if claim is not None else None)
    log.info("published run %s: %d files; removed %d files of earlier runs and attempts", manifest.get("run_id"),
             sum(len(v) for v in manifest.get("files", {}).values()), len(removed))
    return removed


def finish_cleanup(output: str, manifest_name: str, tables: tuple[str, ...]) -> list[str] | None:
    """The clean-up of OUTPUT's committed run, finished: a run stopped after its manifest was
    written (its unit files, the files of the run it replaced, its _work are still there) is
    cleaned up by the next start of the same command, under the claim. The removed files, or None
    when there was nothing to finish (no _work)."""
    manifest = read_manifest(output, manifest_name)
    if manifest is None or not storage.exists(storage.join(output, WORK)):
        return None
    with Claim(output, manifest["run_id"]) as claim:
        claim.check()
        removed = remove_unlisted(output, manifest, tables)
    print(f"finished the clean-up of run {manifest['run_id']} (stopped after it was published): removed "
          f"{len(removed)} files it does not list, and its _work", flush=True)
    return removed

