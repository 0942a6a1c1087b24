"""What keeps a worker's memory flat over hundreds of units (the figures are bench/bench_scale.py's):
on Dask, whose runner makes a DoFn per partition, the partitions of a worker process share one
loaded model and one progress heartbeat thread, and each unit is written as soon as it is decoded;
the memory a unit frees goes back to the system."""
import dataclasses
import os
import pickle
import threading

from paracorpus.cleaning import pair_id
from paracorpus.config import PRESETS
from paracorpus.units import PAIR, unit_record_path
from transforms.progress import Progress
from transforms.units import UnitTranslatorHandler, WriteUnit, _PlainInference


class _CountingHandler(UnitTranslatorHandler):
    loads = 0

    def load_model(self):
        type(self).loads += 1
        return super().load_model()


def _handler(models):
    cfg = dataclasses.replace(PRESETS["parabank2-cpu"], num_sets=1, num_samples=2, score_threshold=None,
                              dual_xent_threshold=None)
    return _CountingHandler(os.path.join(models, "cs-en"), os.path.join(models, "en-cs"), "cpu", "fp32", 1, {},
                            cfg, "test-hash")


def _elements(unit, n=3):
    return [(PAIR, {"pair_id": pair_id("s.tsv", unit * n + i, f"věta {i} číslo {unit}", f"sentence {i} number {unit}"),
                    "input_shard": "s.tsv", "input_index": unit * n + i,
                    "source": f"věta {i} číslo {unit}", "reference": f"sentence {i} number {unit}"}) for i in range(n)]


def test_dask_partitions_share_one_model_and_write_each_unit_as_it_is_decoded(tiny_nmt_models, tmp_path):
    out, work = str(tmp_path / "out"), str(tmp_path / "out" / "_work" / "r1")
    layout = {"s.tsv": (0, 2)}
    fn = _PlainInference(_handler(tiny_nmt_models), WriteUnit(out, work, "cs-en", 1, layout))
    # Dask's runner unpickles the DoFn and calls setup() for every partition
    partitions = [pickle.loads(pickle.dumps(fn)) for _ in range(3)]
    for p in partitions:
        p.setup()
    assert _CountingHandler.loads == 1
    assert all(p.model is partitions[0].model for p in partitions)

    records = partitions[1].process([(0, _elements(0)), (1, _elements(1))])
    first = next(records)                       # unit 0 is on disk before unit 1 is decoded
    assert first["unit"] == 0 and os.path.isfile(unit_record_path(work, 0))
    assert not os.path.exists(unit_record_path(work, 1))
    assert next(records)["unit"] == 1 and os.path.isfile(unit_record_path(work, 1))

    # The task run again (its worker lost before the next step read its output): the committed
    # units are reused, not decoded again; a unit without a record is decoded.
    decoded = []
    real = partitions[2].handler.run_inference

    def counting(batch, model, inference_args=None):
        decoded.extend(unit for unit, _ in batch)
        return real(batch, model, inference_args)
    partitions[2].handler.run_inference = counting
    again = list(partitions[2].process([(0, _elements(0)), (1, _elements(1)), (2, _elements(2))]))
    assert [r["unit"] for r in again] == [0, 1, 2] and decoded == [2]
    assert again[0]["reused"] and again[1]["reused"] and not again[2].get("reused")
    assert again[0]["attempt"] == first["attempt"]                  # the same files, not a second copy


def test_one_heartbeat_thread_serves_every_progress_of_a_process():
    def heartbeats():
        return sum(t.name == "paragen-progress" for t in threading.enumerate())

    progresses = [Progress("generate", every_seconds=60) for _ in range(40)]     # a DoFn per bundle or partition
    for i, p in enumerate(progresses):
        p.working(f"unit {i}")
    assert heartbeats() == 1
    for p in progresses:
        p.idle()


def test_what_a_unit_leaves_in_cycles_is_collected_after_the_first_call_froze_the_rest():
    """release_memory() freezes what is alive at its first call (modules, models: a full collection
    walks them all, 0.2-0.3 s a unit), and its later calls still collect what units made."""
    import subprocess
    import sys

    code = """
import gc, weakref
from common.memory import release_memory

class Node:
    pass

release_memory()
frozen = gc.get_freeze_count()
assert frozen > 1000, frozen
for unit in range(3):
    a, b = Node(), Node()
    a.other, b.other = b, a                  # a cycle: only the collector frees it
    dead = weakref.ref(a)
    del a, b
    release_memory()
    assert dead() is None, unit
assert gc.get_freeze_count() == frozen, "frozen once, not at every unit"
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.stdout.strip() == "ok", done.stderr[-2000:]
