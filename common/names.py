"""Names that become parts of paths: language codes, input shard names, run ids.

Each is checked once, where it enters (command-line options, file discovery), so that no value
from a user or an input file can add a path component (``x/../../y``), hide a file (a leading
``.``), or carry control characters into file names and logs.
"""
from __future__ import annotations

import re
import unicodedata

from common.cli import UsageError

# ISO 639-1/-3 codes, optionally with a script or region after an underscore (pt_BR, zh_Hant).
# No '-': the two codes are joined with '-' in the lang_pair partition (<src>-<tgt>).
_LANG_CODE = re.compile(r"[a-z]{2,3}(?:_[A-Za-z0-9]{2,8})?")
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
MAX_NAME_BYTES = 200


def check_lang_code(code: str, option: str = "language code") -> str:
    """CODE if it is a plain language code (cs, en, ces, pt_BR), else UsageError (a ValueError)."""
    if not isinstance(code, str) or not _LANG_CODE.fullmatch(code):
        raise UsageError(f"{option} {code!r} is not a language code (2-3 lower-case letters, "
                         "optionally _REGION, e.g. cs, en, pt_BR)")
    return code


def check_run_id(run_id: str) -> str:
    """RUN_ID if it is letters, digits, '.', '_' or '-' (not starting with '.'), at most 100 long."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise UsageError(f"run id {run_id!r} must be letters, digits, '.', '_' or '-', not starting "
                         "with '.' or '-', at most 100 characters")
    return run_id


def check_path_component(name: str, what: str = "name") -> str:
    """NAME if it is usable as one file name: not empty, not '.'/'..', no '/' or '\\', no leading
    '.', no control or format characters, at most MAX_NAME_BYTES in UTF-8."""
    problem = None
    if not name or name in (".", ".."):
        problem = "is empty or a relative directory"
    elif "/" in name or "\\" in name:
        problem = "contains a path separator"
    elif name.startswith("."):
        problem = "starts with '.'"
    elif any(unicodedata.category(ch)[0] == "C" for ch in name):
        bad = next(ch for ch in name if unicodedata.category(ch)[0] == "C")
        problem = f"contains the control or format character U+{ord(bad):04X}"
    elif len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        problem = f"is longer than {MAX_NAME_BYTES} bytes"
    if problem:
        raise UsageError(f"{what} {name!r} {problem}")
    return name
