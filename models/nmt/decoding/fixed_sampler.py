"""Top-k sampling under banned phrases with a fixed-shape step (models/nmt/decoding/fixed_step.py), run
eagerly or compiled by ``torch.compile``: the same samples as the eager tree loop
(models/nmt/decoding/sampler.py), in a form whose step can be fused and replayed.

A batch's shapes are set once (rows, sources, source length, cache length, the banned-phrase
tables); during the batch only the node count changes, in buckets (:func:`bucket`: two sizes an
octave, 8, 12, 16, 24, 32, ...), and the positions attended to, in steps of 16, so a compiled step
meets a few shapes per batch. The host reads
two integers a step (rows still decoding, nodes of the next step) and nothing else until the batch
ends, as the eager loop does.

Step modes (``Translator(step_mode=...)``, the jobs' ``--decode_step``):

* ``tree``: the eager tree loop (models/nmt/decoding/sampler.py): the CPU's fastest, and the default;
* ``fixed``: this module's step, eager (the reference the compiled step is tested against);
* ``compiled``: the step compiled by inductor (``fullgraph=True``: no graph breaks, no host read
  inside), the small operations of a step fused into few kernels;
* ``graphs``: compiled, and on a GPU replayed as CUDA graphs (inductor's "reduce-overhead"): a
  step's launches become one replay. GPU only.

Compilation is paid once per process and shape family (dynamic shapes: the node bucket, the
batch's rows, sources and lengths are symbolic), and inductor's on-disk cache
(``TORCHINDUCTOR_CACHE_DIR``, by default under the temporary directory) serves later processes
and runs: docs/benchmarks.md ("The fixed-shape step") says how long each takes.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref

import numpy as np
import torch

from models.nmt.decoding.bans import BanTable
from models.nmt.decoding.device_random import row_seed
from models.nmt.devices import STEP_MODES
from models.nmt.engine import Hypothesis, SampleRequest
from models.nmt.decoding.fixed_step import FixedStep
from models.nmt.decoding.prefix_decoder import unsupported_reason

log = logging.getLogger("paragen.decoder")

_ALIGN = 16                 # source and cache lengths are padded to this (fused attention takes them as they are)
_STEPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_STEPS_LOCK = threading.Lock()
_MAX_BUFFERS = 512          # state buffers a process keeps (each name x shape; the caches apart)


def bucket(n: int, cap: int | None = None, floor: int = 8) -> int:
    """The smallest of 8, 12, 16, 24, 32, 48, ... (two sizes an octave) that holds N, at most CAP
    (N <= CAP)."""
    size = floor
    while size < n:
        size = size * 3 // 2 if size & (size - 1) == 0 else size // 3 * 4
    return min(size, cap) if cap else size


def _round_up(n: int, multiple: int = _ALIGN) -> int:
    return -(-n // multiple) * multiple


def resolve_step_mode(mode: str, device_type: str) -> str:
    """The step mode a Translator runs: 'auto' is the eager tree loop (measured fastest on a CPU;
    the compiled modes are yet to be measured on a GPU: docs/benchmarks.md)."""
    if mode not in STEP_MODES:
        raise ValueError(f"decode step must be one of {STEP_MODES}, not {mode!r}")
    if mode == "graphs" and device_type != "cuda":
        raise ValueError("--decode_step graphs replays CUDA graphs: it needs a GPU (use compiled on a CPU)")
    return "tree" if mode == "auto" else mode


def fixed_step_of(engine) -> "CompiledStep | None":
    """The engine's step for its step mode (built, and compiled, once per process), or None
    where its models need the eager loop (a decoder configuration the fixed step does not cover)."""
    with _STEPS_LOCK:
        if engine in _STEPS:
            return _STEPS[engine]
        reasons = [unsupported_reason(m.decoder) for m in engine.models]
        if any(reasons):
            log.info("sampling with the eager loop: the fixed-shape step does not cover %s",
                     ", ".join(r for r in reasons if r))
            step = None
        else:
            d = engine.tgt_dict
            never = sorted(i for i in {d.pad(), d.unk(), d.bos()} if i != d.eos())
            module = FixedStep([m.decoder for m in engine.models], len(d), d.eos(), never,
                               engine.max_target_positions).eval()
            step = CompiledStep(module, engine.step_mode, engine.device)
        _STEPS[engine] = step
        return step


class CompiledStep:
    """A FixedStep, eager or compiled; counts its compilations and the seconds they took."""

    def __init__(self, module: FixedStep, mode: str, device: torch.device):
        self.module, self.mode, self.device = module, mode, device
        self.compile_seconds = 0.0
        self.compilations = 0
        self.lock = threading.Lock()           # one batch at a time: the buffers are the workspace's
        self._caches: dict = {}
        self._buffers: dict = {}
        if mode in ("compiled", "graphs"):
            import torch._dynamo
            import torch._inductor.config as inductor_config

            # Batches with and without bans are two graphs; beyond the default limit of
            # recompilations dynamo would fall back to eager silently.
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            # CUDA graphs: one is recorded per shape (node and length buckets, batch sizes); that
            # many is expected, not a warning.
            inductor_config.triton.cudagraph_dynamic_shape_warn_limit = None
            self.fn = torch.compile(module, fullgraph=True, dynamic=True,
                                    mode="reduce-overhead" if mode == "graphs" else None)
        else:
            self.fn = module

    def _new(self, shape, dtype) -> torch.Tensor:
        with torch.inference_mode(False):          # a normal tensor: updated in place in and out of inference mode
            t = torch.zeros(shape, dtype=dtype, device=self.device)
        if self.mode == "graphs":
            # A CUDA graph may update a buffer in place only if its address never changes: these
            # are made once per shape and kept (graph replays then need no copy of their inputs).
            torch._dynamo.mark_static_address(t, guard=False)
        return t

    def put(self, name: str, value) -> torch.Tensor:
        """VALUE (a tensor or a numpy array) in this process's buffer NAME of its shape and dtype,
        made once per shape and kept: a batch's state lives at the same addresses as the last
        batch of its shape (what a replayed CUDA graph needs, and fewer allocations)."""
        value = torch.from_numpy(np.ascontiguousarray(value)) if isinstance(value, np.ndarray) else value
        return self._buffer(name, tuple(value.shape), value.dtype).copy_(value)

    def fill(self, name: str, shape: tuple, dtype: torch.dtype, value) -> torch.Tensor:
        """:meth:`put` of a tensor of SHAPE all VALUE."""
        return self._buffer(name, tuple(shape), dtype).fill_(value)

    def _buffer(self, name: str, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        key = (name, shape, dtype)
        buf = self._buffers.get(key)
        if buf is None:
            if len(self._buffers) >= _MAX_BUFFERS:              # shapes come in buckets; bound them anyway
                self._buffers.clear()
            buf = self._buffers[key] = self._new(shape, dtype)
        return buf

    def caches(self, member: int, layers: int, rows: int, heads: int, length: int, head_dim: int, like: torch.Tensor):
        """Per layer (k, v) self-attention caches for a batch of ROWS rows, (ROWS, HEADS, >= LENGTH,
        HEAD_DIM), kept from batch to batch (a compiled step sees the same contiguous buffers, and
        a CUDA graph the same addresses) and made anew when the rows change or a batch needs
        more positions. Zeroed once when made; later batches find finite keys and values of
        earlier ones at positions the step masks, which weigh exactly 0 (a zero fill a batch cost
        8% of a CPU batch)."""
        key = (member, heads, head_dim, like.dtype)
        held = self._caches.get(key)
        if held is None or held[0][0].shape[0] != rows or held[0][0].shape[2] < length or len(held) != layers:
            shape = (rows, heads, max(length, held[0][0].shape[2] if held else 0), head_dim)
            self._caches[key] = None                               # the old buffers go before the new come
            self._caches[key] = held = [(self._new(shape, like.dtype), self._new(shape, like.dtype))
                                        for _ in range(layers)]
        return held

    def __call__(self, state: dict, n_nodes: int, span: int, topk: int, width: int, min_len: int) -> torch.Tensor:
        if self.mode == "fixed":
            return self.fn(state, n_nodes, span, topk, width, min_len)
        if self.mode == "graphs":
            torch.compiler.cudagraph_mark_step_begin()
        from torch._dynamo.utils import counters
        from torch.fx.experimental import _config as shapes

        graphs = counters["stats"]["unique_graphs"]
        start = time.perf_counter()
        # No duck sizing: two sizes that happen to be equal in the first batch (the ban tables'
        # width and the heads, say) would otherwise share a symbol, and a batch where they differ
        # would recompile.
        with shapes.patch(use_duck_shape=False):
            out = self.fn(state, n_nodes, span, topk, width, min_len)
        if counters["stats"]["unique_graphs"] != graphs:
            seconds = time.perf_counter() - start
            self.compile_seconds += seconds
            self.compilations += 1
            log.info("decoder step compiled (%s, graph %d) on %s in %.1f s", self.mode, self.compilations,
                     self.device, seconds)
        return out


class FixedBatch:
    """A batch's rows laid out source by source (each source's rows in request order, padded to
    the most rows a source has; sources padded to a bucket) and every device tensor the step
    reads or updates (the state dict :meth:`FixedStep.forward` takes)."""

    def __init__(self, engine, step: CompiledStep, reqs: list[SampleRequest], src_ids: dict, seed: int):
        dev = engine.device
        self.sources = list(dict.fromkeys(r.source for r in reqs if r.num_samples > 0))
        at = {s: i for i, s in enumerate(self.sources)}
        per_source: list[list[tuple[int, int, int]]] = [[] for _ in self.sources]   # (request, seed, eager row)
        n = 0
        for qi, r in enumerate(reqs):
            for k in range(r.num_samples):
                per_source[at[r.source]].append((qi, row_seed(seed, r.key, k), n))
                n += 1
        self.n_rows = n
        self.per_source = max((len(p) for p in per_source), default=0)
        self.n_src = bucket(len(self.sources))
        rows = self.rows = self.n_src * self.per_source
        row_req = np.zeros(rows, dtype=np.int64)
        seeds = np.zeros(rows, dtype=np.int64)
        self.eager_row = np.full(rows, -1, dtype=np.int64)        # the eager loop's row of each slot
        limits = [engine._max_len(len(src_ids[s])) for s in self.sources]
        row_limit = np.zeros(rows, dtype=np.int64)
        for i, slots in enumerate(per_source):
            for j, (qi, sd, eager) in enumerate(slots):
                row = i * self.per_source + j
                row_req[row], seeds[row], self.eager_row[row], row_limit[row] = qi, sd, eager, limits[i]
        self.row_req = row_req
        self.max_len = max(limits)
        length_cap = self.length_cap = _round_up(self.max_len + 1)
        src_tokens, src_lengths = engine._collate_src([src_ids[s] for s in self.sources])
        src_len = _round_up(src_tokens.shape[1])
        # Every tensor the step reads or updates lives in the step's buffers (CompiledStep.put).
        put, fill, long = step.put, step.fill, torch.long
        s = {"pos": fill("pos", (), long, 0),
             "row_req": put("row_req", row_req), "seeds": put("seeds", seeds), "row_limit": put("row_limit", row_limit),
             "active": put("active", self.eager_row >= 0),
             "node_of_row": put("node_of_row", np.arange(rows) // max(1, self.per_source)),
             "node_token": fill("node_token", (rows,), long, engine.eos),
             "rep": put("rep", np.where(np.arange(rows) < self.n_src, np.arange(rows) * self.per_source, 0)),
             # each row's tokens after the </s> it starts with; as wide as the cache, so that batches
             # of a length bucket share the buffer
             "tokens": fill("tokens", (rows, length_cap + 1), long, engine.eos),
             "score": fill("score", (rows,), torch.float32, 0.0),
             "length": fill("length", (rows,), long, -1),
             "self_mask_base": put("self_mask_base", np.arange(length_cap).reshape(1, 1, 1, length_cap)),
             "caches": [], "cross": [], "cross_mask": []}
        for m, (model, member) in enumerate(zip(engine.models, step.module.members)):
            enc = model.encoder.forward_torchscript({"src_tokens": src_tokens, "src_lengths": src_lengths})
            cross, mask = member.cross_kv(enc, self.n_src, src_len)
            s["cross"].append([(put(f"cross_k{m}.{i}", k), put(f"cross_v{m}.{i}", v)) for i, (k, v) in enumerate(cross)])
            s["cross_mask"].append(put(f"cross_mask{m}", mask))
            k0 = cross[0][0]
            # One position more than a step attends to: the span is then always a strict slice of the
            # cache (were they equal in the first batch, the compiled step would guard on it).
            s["caches"].append(step.caches(m, len(member.dec.layers), rows, k0.shape[1], length_cap + 1, k0.shape[3], k0))
        packs = [engine.banned_packs(r.banned_words) for r in reqs]
        self.ban_width = 0
        if any(map(any, packs)):
            bans = _ban_tensors(BanTable.from_packs(packs, len(engine.tgt_dict), dev), rows)
            s.update({name: put(name, t) for name, t in bans.items()})
            self.ban_width = s["ban_single"].shape[1] + s["ban_state"].shape[1] * s["ban_emits"].shape[1]
        self.state = s

    def hypotheses(self, engine, n_requests: int) -> list[list[Hypothesis]]:
        """Every row read back in one go, each request's in the order its rows finished (then in
        the eager loop's row order, as it gives them)."""
        s = self.state
        outs: list[list[Hypothesis]] = [[] for _ in range(n_requests)]
        token_rows = s["tokens"][:, 1:].cpu().numpy()
        lengths, totals = s["length"].cpu().numpy(), s["score"].cpu().numpy()
        real = np.flatnonzero(self.eager_row >= 0)
        for row in real[np.lexsort((self.eager_row[real], lengths[real]))]:
            n = int(lengths[row])
            ids = [int(i) for i in token_rows[row, :n]]
            text, pieces = engine.decode_ids(ids)
            outs[self.row_req[row]].append(Hypothesis(text, pieces, tuple(ids), -float(totals[row]) / (n + 1)))
        return outs


def _ban_tensors(table: BanTable, rows: int) -> dict:
    """TABLE's tensors (models/nmt/decoding/bans.py) for ROWS rows, every dimension padded to a bucket of
    at least 4 with entries that change nothing: a ban of -1 (no token), a trie column that stays
    DEAD (no prefix is longer than the table's depth), edges whose key no (node, token) has.
    Every batch with bans is then one graph of the compiled step, never specialised on a size
    of 1 (a table with one-piece phrases only has depth 0), and its shapes come in few sizes."""
    def pad(t: torch.Tensor, dim: int, size: int, value: int) -> torch.Tensor:
        extra = size - t.shape[dim]
        if extra <= 0:
            return t
        shape = list(t.shape)
        shape[dim] = extra
        return torch.cat([t, t.new_full(shape, value)], dim=dim)

    emits = pad(pad(table.emits, 0, bucket(table.emits.shape[0], floor=4), -1), 1, bucket(table.emits.shape[1], floor=4), -1)
    edges = bucket(table.edge_key.shape[0], floor=4)
    single = pad(table.single, 0, bucket(table.single.shape[0], floor=4), -1)          # a row per request
    return {"ban_single": pad(single, 1, bucket(table.single.shape[1], floor=4), -1),
            "ban_state": torch.zeros((rows, bucket(table.depth, floor=4)), dtype=torch.long, device=table.single.device),
            "ban_emits": emits,
            # sorted keys stay sorted: the padding is larger than any key
            "ban_edge_key": pad(table.edge_key, 0, edges, torch.iinfo(torch.int64).max),
            "ban_edge_child": pad(table.edge_child, 0, edges, 0)}


def sample_batch_fixed(engine, step: CompiledStep, reqs: list[SampleRequest], src_ids: dict, topk: int, seed: int,
                       min_len: int) -> list[list[Hypothesis]]:
    """REQS' samples, as models/nmt/decoding/sampler.py ``sample_batch`` gives them, through STEP."""
    with step.lock:
        b = FixedBatch(engine, step, reqs, src_ids, seed)
        if not b.n_rows:
            return [[] for _ in reqs]
        vocab = len(engine.tgt_dict)
        k = min(topk, vocab)
        width = min(k + b.ban_width, vocab)
        n_nodes = b.n_src
        for pos in range(b.max_len + 1):
            span = min(_round_up(pos + 1), b.length_cap)                # the host knows the step
            active, count = step(b.state, n_nodes, span, k, width, min_len).tolist()     # the step's one read-back
            if active == 0:
                break
            n_nodes = bucket(count, cap=b.rows)
        return b.hypotheses(engine, len(reqs))


__all__ = ["STEP_MODES", "CompiledStep", "FixedBatch", "bucket", "fixed_step_of", "resolve_step_mode",
           "sample_batch_fixed"]
