"""Disk faults caused for real, for the tests and bench/bench_faults.py: a small tmpfs that fills
up (ENOSPC), and EIO from write() on the files under one directory (tests/eio_shim.c, an
LD_PRELOAD library compiled here with the machine's C compiler; what Debian's fiu-run does, but
scoped to one directory so that the rest of the process, its pipes and sockets, keep working)."""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))


class Unavailable(RuntimeError):
    """The fault cannot be caused on this machine (no compiler, no right to mount)."""


def eio_shim(directory: str) -> str:
    """The path of the EIO library, built into DIRECTORY."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise Unavailable("no C compiler to build tests/eio_shim.c")
    out = os.path.join(directory, "eio_shim.so")
    done = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", out, os.path.join(HERE, "eio_shim.c"), "-ldl"],
                          capture_output=True, text=True)
    if done.returncode:
        raise Unavailable(f"cannot build tests/eio_shim.c: {done.stderr.strip()[:300]}")
    return out


def eio_env(shim: str, under: str, after: int) -> dict:
    """Environment for a process whose writes under UNDER fail with EIO after AFTER succeeded."""
    return {"LD_PRELOAD": shim, "EIO_UNDER": os.path.realpath(under), "EIO_AFTER": str(after)}


@contextlib.contextmanager
def small_disk(mount: str, size: str):
    """A tmpfs of SIZE (e.g. '400k') mounted on MOUNT while the block runs (needs the right to
    mount: root, in a container that allows it)."""
    os.makedirs(mount, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", mount], capture_output=True,
                          text=True)
    if done.returncode:
        raise Unavailable(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", mount], capture_output=True)


def grow(mount: str, size: str) -> None:
    """Give the tmpfs on MOUNT room (space freed, as an operator would)."""
    subprocess.run(["mount", "-o", f"remount,size={size}", mount], check=True)
