"""Files that readers see whole or not at all.

Every output (Parquet partition, manifest, model weights, report) is written under a temporary
name in its final directory and renamed into place: a rename within one filesystem is atomic, so
a reader or a crashed rerun finds the previous file or the new one, never half of one. The
temporary name starts with "." so pyarrow's dataset discovery skips it.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid


def staged_name(path: str) -> str:
    """A hidden name beside PATH that no other writer uses, ``.NAME.<32 hex>.tmp``: where a file is
    written before its rename (a local path, a URL or a store's inner path alike;
    paracorpus.commit.STAGED_LEFTOVER matches these names)."""
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")


@contextlib.contextmanager
def replacing(path: str):
    """Yield a temporary path beside PATH; if the block succeeds, rename it onto PATH. The
    temporary file is removed whatever happens."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = staged_name(os.path.join(directory, os.path.basename(path)))
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_text(path: str, text: str) -> str:
    with replacing(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    return path


def write_json(path: str, obj, indent: int | None = 2, **dump_kw) -> str:
    return write_text(path, json.dumps(obj, indent=indent, **dump_kw))


def copy_file(src: str, dst: str) -> str:
    with replacing(dst) as tmp:
        shutil.copy2(src, tmp)
    return dst
