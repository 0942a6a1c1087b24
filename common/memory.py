"""Giving a worker's freed memory back to the system between work units.

A worker decodes hundreds of units. Each allocates and frees many short-lived buffers (tensors of
varying shapes, token lists, Arrow tables); glibc's allocator keeps the freed pages in its heaps,
fragmented, and the process's resident memory grows with every unit, far above what it uses
(docs/benchmarks.md, "50 million pairs"). ``malloc_trim(0)`` returns those pages; with the
garbage collection before it, it costs tens of milliseconds per unit (decoding one takes minutes).

A full collection walks every object the process holds: with torch, fairseq, Beam and the models
loaded that is over 400,000 objects and 0.2-0.3 s, most of a small unit's cost. What is alive
after the first collection (modules, the models, Beam's workers) lives as long as the process, so
it is frozen once (``gc.freeze``): later collections walk only what units made since.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys

_TRIM = None
_FROZEN = False


def _malloc_trim():
    global _TRIM
    if _TRIM is None:
        _TRIM = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                _TRIM = libc.malloc_trim if hasattr(libc, "malloc_trim") else False
            except OSError:
                _TRIM = False
    return _TRIM


def release_memory() -> bool:
    """Collect garbage and hand freed heap pages back to the system (glibc's malloc_trim; a
    no-op elsewhere). True when the trim ran."""
    global _FROZEN
    gc.collect()
    if not _FROZEN:
        # Once, not after every unit: an object frozen is never collected, so what a later unit
        # leaves alive (and frees in a cycle after) would pile up.
        gc.freeze()
        _FROZEN = True
    trim = _malloc_trim()
    if trim:
        trim(0)
        return True
    return False
