"""``import fairseq`` without the scikit-learn and scipy.stats imports it makes for code this
project never runs.

fairseq's package init imports every criterion and task module, and two of them import
scikit-learn (``tasks/audio_classification``, ``criterions/sentence_prediction``) and scipy.stats
at import time: with pandas, which scikit-learn brings, about 1 s of CPU of fairseq's 2.5-3 s
in every process that loads a model (each job, each worker, each refusal that reads a
dictionary). :func:`import_fairseq` imports fairseq with those three modules stood in for by
placeholders whose functions import the real module when first called, then removes the
placeholders from ``sys.modules``: fairseq's own code keeps working if it ever calls them, and
an ``import sklearn`` anywhere later gets the real package. Call it before the first
``from fairseq... import``; it does nothing once fairseq is imported. The stand-ins are in
``sys.modules`` only while fairseq's import runs (a model's first load, before any decoding): a
thread importing one of the three in that window would get a stand-in (its functions work, its
classes and constants do not); nothing in the jobs does.
"""
from __future__ import annotations

import importlib
import sys
import types

DEFERRED = ("sklearn", "sklearn.metrics", "scipy.stats")


class _Deferred(types.ModuleType):
    """A stand-in for module NAME: a name looked up on it is a submodule's stand-in or a function
    that calls the real module's function of that name."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        sub = f"{self.__name__}.{name}"
        if sub in DEFERRED:
            return _Deferred(sub)
        module = self.__name__

        def call(*args, **kwargs):
            return getattr(importlib.import_module(module), name)(*args, **kwargs)

        call.__name__ = call.__qualname__ = name
        return call


def import_fairseq():
    """The fairseq package, imported (once) without loading scikit-learn, pandas and scipy.stats."""
    if "fairseq" in sys.modules:
        return sys.modules["fairseq"]
    placed = [name for name in DEFERRED if name not in sys.modules]
    for name in placed:
        sys.modules[name] = _Deferred(name)
    try:
        import fairseq
    finally:
        for name in placed:
            if isinstance(sys.modules.get(name), _Deferred):
                del sys.modules[name]
    return fairseq
