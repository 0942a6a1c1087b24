"""Count host<->device round trips during a piece of decoding: a proxy, on any machine, for what
leaves a GPU idle.

On a GPU, building a tensor from Python data (``torch.tensor``, ``as_tensor``, ``from_numpy``)
copies from the host, and reading one back (``.item()``, ``.tolist()``, ``.cpu()``, ``.numpy()``,
``bool()``/``int()``/``float()`` of a tensor) waits for every queued kernel to finish: the device
idles while Python catches up. On a CPU these calls are cheap, but they are made just as often, so
counting them on a CPU says how a decoding loop will behave on a GPU. A loop that calls them once
per row or per phrase slows down with the batch; one that calls them a constant number of times
per step does not. (Syncs inside torch, such as ``nonzero`` or boolean-mask indexing on a GPU,
are not seen here: ``torch.cuda.set_sync_debug_mode`` reports those on a real GPU.)

    with count_round_trips() as trips, count_decoder_steps() as steps:
        engine.sample(requests)
    trips.total, trips.by_kind, steps.total
"""
from __future__ import annotations

import contextlib
import threading
from collections import Counter

import torch

_FACTORIES = ("tensor", "as_tensor", "from_numpy")
_READS = ("tolist", "item", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
_LOCK = threading.Lock()


class RoundTrips:
    def __init__(self):
        self.by_kind: Counter = Counter()

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())


@contextlib.contextmanager
def count_round_trips():
    """Count, in this process, the calls that move data between Python and tensors while the
    block runs (every thread; not re-entrant)."""
    trips = RoundTrips()
    saved = []
    with _LOCK:
        for name in _FACTORIES:
            saved.append((torch, name, getattr(torch, name)))
        for name in _READS:
            saved.append((torch.Tensor, name, getattr(torch.Tensor, name)))
        for owner, name, original in saved:
            setattr(owner, name, _counting(original, name, trips))
    try:
        yield trips
    finally:
        with _LOCK:
            for owner, name, original in saved:
                setattr(owner, name, original)


def _counting(original, name: str, trips: RoundTrips):
    def wrapper(*args, **kwargs):
        trips.by_kind[name] += 1
        return original(*args, **kwargs)
    wrapper.__name__ = getattr(original, "__name__", name)
    return wrapper


@contextlib.contextmanager
def count_decoder_steps():
    """Count the samplers' decoder steps (EnsembleDecoder.step calls of the tree loop, CompiledStep
    calls of the fixed-shape one) while the block runs."""
    from models.nmt.decoding import ensemble, fixed_sampler

    steps = RoundTrips()
    saved = [(ensemble.EnsembleDecoder, "step"), (fixed_sampler.CompiledStep, "__call__")]
    originals = [getattr(owner, name) for owner, name in saved]

    def counting(original):
        def step(self, *args, **kwargs):
            steps.by_kind["step"] += 1
            return original(self, *args, **kwargs)
        return step
    for (owner, name), original in zip(saved, originals):
        setattr(owner, name, counting(original))
    try:
        yield steps
    finally:
        for (owner, name), original in zip(saved, originals):
            setattr(owner, name, original)


@contextlib.contextmanager
def count_device_ops(enabled: bool = True):
    """Count the tensor operations torch dispatches in this thread while the block runs, by name
    (aten ops that compute; views, which launch nothing, apart under "(views)"). On a GPU each
    is at least one kernel launch, ~5-10 microseconds of host time: when a decoding step is
    host-bound, ops per step is what its time scales with, and this counts them on any machine."""
    from torch.utils._python_dispatch import TorchDispatchMode

    ops = RoundTrips()
    if not enabled:                 # a compiled function refuses to run under a dispatch mode
        yield ops
        return

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.by_kind["(views)" if func.is_view else func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    with Counting():
        yield ops


def computing_ops(ops: RoundTrips) -> int:
    """count_device_ops' total without the views."""
    return ops.total - ops.by_kind["(views)"]


__all__ = ["RoundTrips", "computing_ops", "count_decoder_steps", "count_device_ops", "count_round_trips"]
