"""Work units in the pipeline: key records by unit, decode each unit with Beam's RunInference (or a
plain ParDo on runners that cannot run it), write it, and reuse units a resumed run finished.

The per-unit algorithm is paracorpus/units.py; these are thin wrappers around it.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter

import apache_beam as beam
from apache_beam.ml.inference.base import ModelHandler, PredictionResult, RunInference
from apache_beam.utils.shared import Shared

from common.stopping import DEVICE_FAILURE_EXIT   # 70 (EX_SOFTWARE): a worker whose device failed
from common import storage
from common.cli import OutputBusy
from common.memory import release_memory
from models.nmt.devices import DeviceFailure, under_mps
from paracorpus.compaction import compact_group
from paracorpus.config import GenerationConfig
from paracorpus.paraphrasing import piece_limits
from paracorpus.steps import bitext_steps, decoding_steps
from paracorpus.unit_failures import record_failure
from paracorpus.units import (PAIR, REJECT, UNIT, generate_unit, input_shard_of, partition_of_unit, unit_of, unit_record_path,
                              write_unit)
from transforms.progress import Progress

log = logging.getLogger("paragen.units")


class _Models:
    """The translators of one process and the decoding steps built on them (Beam's Shared cache
    needs an object that can be weakly referenced, which a tuple cannot)."""

    def __init__(self, forward, backward, steps: list):
        self.forward, self.backward, self.steps = forward, backward, steps
        self._compile_ms = 0                 # the forward step's compile time counted so far
        self._lock = threading.Lock()        # DoFn instances of one process share these models
        self._pending: Counter = Counter()   # one-off costs (warm-up, compiling) not yet in a unit's record

    def add_pending(self, name: str, n: int) -> None:
        with self._lock:
            self._pending[name] += n

    def take_pending(self) -> Counter:
        """The one-off costs of this process not yet written in a unit's record (the run sums the
        records, so each is counted once, whichever DoFn instance of the process reports it)."""
        with self._lock:
            pending, self._pending = self._pending, Counter()
            return pending

    def compile_ms_since_last_call(self) -> int:
        """Milliseconds the forward engine spent compiling since the last call (in this process)."""
        with self._lock:
            total = round(1000 * getattr(self.forward, "compile_seconds", 0.0))     # only grows
            new, self._compile_ms = total - self._compile_ms, total
            return new


class UnitTranslatorHandler(ModelHandler):
    """RunInference's model handler: loads the two translators once per process (from a bucket
    through the local cache, checked against the manifest's sha256), and 'infers' whole work
    units: an example is (unit, elements), its inference the unit's rows, rejects and counters."""

    def __init__(self, forward_model: str, backward_model: str | None, device: str | None, precision: str,
                 torch_threads: int | None, model_sha256: dict, cfg: GenerationConfig, config_hash: str,
                 expected_pairs: int | None = None, bitext=None, langs: tuple[str, str] = ("", ""),
                 processes_per_gpu: int = 1, decode_step: str = "auto"):
        super().__init__()
        self.decode_step = decode_step      # how the forward model samples (models/nmt/decoding/fixed_sampler.py)
        self.processes_per_gpu = processes_per_gpu   # this machine's GPUs are shared by this many processes each
        self.bitext, self.langs = bitext, langs      # a paracorpus.steps.BitextFilterConfig, or None
        self.forward_model, self.backward_model = forward_model, backward_model
        self.device, self.precision, self.torch_threads = device, precision, torch_threads
        self.model_sha256, self.cfg, self.config_hash = model_sha256, cfg, config_hash
        self.expected_pairs = expected_pairs
        self.work: str | None = None                 # where a failed unit is noted (DecodeUnits sets it)
        self._progress = None
        self._warm_up_ms = 0                         # the engines' first calls (load_model), counted once

    def load_model(self) -> _Models:
        from models.nmt.devices import worker_device
        from models.nmt.engines.loading import load_engine

        if self.torch_threads:      # several worker processes share this machine's cores
            import torch

            torch.set_num_threads(self.torch_threads)
        device = worker_device(self.device, self.processes_per_gpu)      # on a GPU machine: this process's GPU
        gpu = {"processes_per_gpu": self.processes_per_gpu} if device.startswith("cuda") else {}
        step = {"step_mode": self.decode_step} if self.decode_step != "auto" else {}
        forward = load_engine(self.forward_model, device=device, precision=self.precision,
                              sha256=self.model_sha256.get("forward"), threads=self.torch_threads, **gpu, **step)
        backward = (load_engine(self.backward_model, device=device, precision=self.precision,
                                sha256=self.model_sha256.get("backward"), threads=self.torch_threads, **gpu)
                    if self.backward_model else None)
        bitext = []
        if self.bitext is not None and self.bitext.enabled:
            bitext = bitext_steps(self.bitext, self.langs, device=device, sha256=self.model_sha256)
        limits = piece_limits(forward, backward, self.cfg.max_pieces)
        # First calls outside the units: their cost is its own counter, not the first unit's.
        seconds = sum(e.warm_up(self.cfg.mode) for e in (forward, backward) if e is not None)
        self._warm_up_ms += round(seconds * 1000)
        log.info("engines warmed up on %s in %.2f s", device, seconds)
        models = _Models(forward, backward, decoding_steps(forward, backward, self.cfg, self.config_hash, limits, bitext))
        models.add_pending("ms_warm_up", round(seconds * 1000))
        return models

    def should_skip_batching(self) -> bool:
        return True                 # a unit is already a batch of pairs; elements arrive as [unit]

    def get_metrics_namespace(self) -> str:
        return "paragen"

    def get_num_bytes(self, batch) -> int:
        return sum(len(elements) for _unit, elements in batch)

    def run_inference(self, batch, model: _Models, inference_args=None):
        if self._progress is None:
            self._progress = Progress("generate", rate_of="generate_pairs_in", expected=self.expected_pairs)
            # which device and precision each worker really decoded with, for the run's manifest
            self._progress.inc(f"workers_{model.forward.device_type}_{model.forward.precision}")
            self._progress.inc("ms_warm_up", self._warm_up_ms)
            step_mode = getattr(model.forward, "step_mode", None)         # the fairseq engine's
            if step_mode:
                self._progress.inc(f"decode_step_{step_mode}")
                up_front = model.compile_ms_since_last_call()
                self._progress.inc("ms_compile", up_front)
                model.add_pending("ms_compile", up_front)
        setup = {"device": model.forward.device_type, "precision": model.forward.precision,
                 "decode_step": getattr(model.forward, "step_mode", None),
                 # whether this worker's GPU work went through an MPS server (None on a CPU)
                 "mps": under_mps() if model.forward.device_type == "cuda" else None}
        for unit, elements in batch:
            start = time.time()
            elements = list(elements)
            pairs, done = sum(1 for tag, _ in elements if tag == PAIR), 0
            self._progress.working(f"unit {unit}: 0 of {pairs} pairs")
            for engine in (model.forward, model.backward):
                if engine is not None:
                    engine.start_unit(f"{self.config_hash}:{unit}")

            def on_batch(n, unit=unit, pairs=pairs):
                nonlocal done
                done += n
                self._progress.working(f"unit {unit}: {done} of {pairs} pairs")
                self._progress.inc("generate_pairs_in", n)
            try:
                result = generate_unit(elements, model.steps, self.cfg.batch_pairs, self.config_hash, on_batch=on_batch)
            except DeviceFailure as exc:
                self._note_failure(unit, exc)
                end_poisoned_worker(unit, exc)
            except Exception as exc:
                self._note_failure(unit, exc)
                raise
            self._progress.idle()
            # a batch of a shape the warm-up did not cover compiles inside the unit (its sample time)
            compiled = model.compile_ms_since_last_call()
            if compiled:
                self._progress.inc("ms_compile", compiled)
                self._progress.inc("ms_compile_in_units", compiled)
            for name, n in result.counters.items():
                self._progress.inc(name, n)
            for r in result.rejects:
                if r["stage"] in ("bitext_filter", "segment", "dual_xent", "generate"):
                    self._progress.inc(f"rejected_{r['reason']}")
            # what the unit's record says of how it ran (the manifest's counters and precision on
            # every runner, Dask's included, whose runner reports no Beam metrics)
            result.counters["generate_pairs_in"] += pairs
            if compiled:
                result.counters["ms_compile"] += compiled
                result.counters["ms_compile_in_units"] += compiled
            result.counters.update({k: v for k, v in model.take_pending().items() if v})
            result.setup = setup
            yield PredictionResult(unit, (result, time.time() - start))
        self._progress.flush()

    def _note_failure(self, unit: int, exc: Exception) -> None:
        if self.work:
            record_failure(self.work, unit, exc, "decoding")



def end_poisoned_worker(unit: int, exc: Exception) -> None:
    """End this worker process at once after a device error (a CUDA context is unusable after
    one): one line, exit status DEVICE_FAILURE_EXIT, so that the runner (or the scheduler) runs
    the unit again in a fresh process; nothing of the unit was committed."""
    import os
    import sys

    from common.stopping import end_in_this_process

    why = (f"the device of worker process {os.getpid()} failed while decoding unit {unit} ({exc}); this process "
           f"ends (exit status {DEVICE_FAILURE_EXIT}) so that its work is done again in a fresh one")
    end_in_this_process(why, DEVICE_FAILURE_EXIT)       # the job's own process (in-memory runner): its claim released
    # a worker process of its own: the job's line comes from the driver, which sees this exit status
    print(f"paragen worker: {why}", file=sys.stderr, flush=True)
    os._exit(DEVICE_FAILURE_EXIT)


class _PlainInference(beam.DoFn):
    """The same handler in a plain ParDo, for runners that do not run RunInference (Dask), each
    unit written as soon as it is decoded. Dask's runner makes a DoFn per partition and collects a
    partition's outputs in a list before the next step sees them, so a separate write step would
    hold every decoded unit of the partition at once, and a model loaded in setup() would be loaded
    again for every partition; Shared keeps one loaded model per worker process. A unit whose
    completion record exists is reused, not decoded (a task run again after its worker was lost)."""

    def __init__(self, handler: UnitTranslatorHandler, writer: "WriteUnit"):
        self.handler, self.writer = handler, writer
        self._shared = Shared()

    def setup(self):
        self.model = self._shared.acquire(self.handler.load_model)

    def process(self, batch):
        # Dask runs a task again when the worker holding its output is lost (preempted, at its
        # lifetime, killed): the units it had finished are committed, and are not decoded twice.
        todo = []
        for unit, elements in batch:
            if storage.exists(unit_record_path(self.writer.work, unit)):
                yield reuse_unit(unit, self.writer.work, self.writer.plan_key)
            else:
                todo.append((unit, elements))
        if todo:
            for prediction in self.handler.run_inference(todo, self.model):
                yield self.writer.write(prediction)


class WriteUnit(beam.DoFn):
    """PredictionResult of a unit -> its files and completion record (paracorpus.units.write_unit)
    -> the record, for the run's summary."""

    def __init__(self, output: str, work: str, lang_pair: str, num_output_shards: int, layout: dict,
                 plan_key: str = "", fence=None):
        self.output, self.work, self.lang_pair, self.num_output_shards = output, work, lang_pair, num_output_shards
        self.layout, self.plan_key, self.fence = layout, plan_key, fence

    def write(self, prediction: PredictionResult) -> dict:
        unit, (result, seconds) = prediction.example, prediction.inference
        try:
            record = write_unit(self.output, self.work, unit,
                                partition_of_unit(unit, self.layout, self.num_output_shards), self.lang_pair, result,
                                seconds, input_shard_of(unit, self.layout), self.plan_key, self.fence)
        except OutputBusy:            # the run lost its output: not the unit's failure
            raise
        except Exception as exc:
            record_failure(self.work, unit, exc, "writing")
            raise
        del prediction, result
        release_memory()              # the unit's buffers go back to the system: flat memory over units
        return record

    def process(self, prediction: PredictionResult):
        yield self.write(prediction)


class CompactGroup(beam.DoFn):
    """(group key, its units' completion records and carried files, tagged "unit" / "carry") ->
    the group's record, its files rewritten as files sized for readers (paracorpus/compaction.py)."""

    def __init__(self, output: str, work: str, lang_pair: str, target, plan_key: str = "", fence=None):
        self.output, self.work, self.lang_pair, self.target, self.plan_key = output, work, lang_pair, target, plan_key
        self.fence = fence

    def process(self, keyed):
        bin_, partition = keyed[0].split("\0")
        items = list(keyed[1])
        record = compact_group(self.output, self.work, self.lang_pair, bin_, int(partition),
                               [r for tag, r in items if tag == "unit"], [c for tag, c in items if tag == "carry"],
                               self.target, self.plan_key, self.fence)
        release_memory()
        yield record


def _unit_batch(unit_elements):
    """(unit, elements) -> [[(unit, records)]] without the unit's marker; nothing for a unit that
    got no records."""
    unit, elements = unit_elements
    records = [e for e in elements if e[0] != UNIT]
    return [[(unit, records)]] if records else []


def reuse_unit(unit: int, work: str, plan_key: str = "") -> dict:
    """The completion record of a unit a previous attempt of this run finished (--resume). A record
    of another plan (PLAN_KEY) is refused: its rows are not this run's (a run's _work holds one
    plan's records: beam_pipelines/generation/plan.py refuses a --run_id of another plan)."""
    path = unit_record_path(work, unit)
    record = storage.read_json(path)
    if record.get("plan_key", plan_key) != plan_key:          # records written before plan keys: the run's own
        raise RuntimeError(f"{path} was written for plan {record.get('plan_key')}, not this run's ({plan_key}); "
                           "its rows cannot be reused")
    record["reused"] = True
    return record


def key_by_unit(tag: str, layout: dict):
    """A function tagging a record (or reject row) and keying it by its unit (see
    paracorpus.units.plan_units for LAYOUT)."""
    def key(rec):
        return unit_of(rec["input_shard"], rec["pair_id"], layout), (tag, rec)
    return key


class DecodeUnits(beam.PTransform):
    """(unit, elements) -> completion records: each unit decoded (RunInference, or a plain ParDo
    where USE_RUN_INFERENCE is False) and written."""

    def __init__(self, handler: UnitTranslatorHandler, output: str, work: str, lang_pair: str,
                 num_output_shards: int, layout: dict, use_run_inference: bool = True, plan_key: str = "",
                 fence=None):
        super().__init__()
        self.handler, self.output, self.work, self.lang_pair = handler, output, work, lang_pair
        self.num_output_shards, self.layout, self.use_run_inference = num_output_shards, layout, use_run_inference
        self.plan_key, self.fence = plan_key, fence

    def expand(self, units):
        batches = units | "OneUnitPerBatch" >> beam.FlatMap(_unit_batch)
        self.handler.work = self.work
        writer = WriteUnit(self.output, self.work, self.lang_pair, self.num_output_shards, self.layout, self.plan_key,
                           self.fence)
        if not self.use_run_inference:
            return batches | "DecodeAndWrite" >> beam.ParDo(_PlainInference(self.handler, writer))
        return batches | "RunInference" >> RunInference(self.handler) | "WriteUnit" >> beam.ParDo(writer)


__all__ = ["UnitTranslatorHandler", "DecodeUnits", "CompactGroup", "key_by_unit", "reuse_unit", "PAIR", "REJECT",
           "UNIT"]
