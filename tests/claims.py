"""What tests do to a claim (paracorpus/commit.Claim) from outside: read it, and take it over as
another writer would (the next version of its record, created with put-if-absent)."""
import json

from common import storage
from paracorpus import commit
from paracorpus.commit import OWNER


def take_over(output, changes: dict, name: str = OWNER) -> dict:
    """Another writer's claim on OUTPUT: the next version of its record, the current one's fields
    with CHANGES (a run id, a token, a pid); the record written."""
    path = storage.join(str(output), name)
    raw, version = storage.read_versioned(path)
    record = {**(json.loads(raw) if raw else {}), **changes}
    storage.write_if(path, json.dumps(record).encode(), version, copy=False)
    return record


def claim_record(output, name: str = OWNER) -> dict | None:
    """The claim on OUTPUT (a path or URL) now, or None when nobody holds it."""
    return commit.claim_record(str(output), name)


def holder_token(output, name: str = OWNER) -> str | None:
    """The token of the claim on OUTPUT now, or None when nobody holds it."""
    record = claim_record(str(output), name)
    return record.get("token") if record else None


__all__ = ["claim_record", "holder_token", "take_over"]


def run_files(folder) -> list[str]:
    """The files under FOLDER, relative to it, sorted, without the versions of its records
    (``_log/``: the claim's and the manifest's, common/storage/versions.py)."""
    import os

    found = (os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs)
    return sorted(p for p in found if not p.startswith("_log/"))
