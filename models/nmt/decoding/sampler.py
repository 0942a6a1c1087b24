"""Top-k sampling under per-request banned phrases, with the decoding loop on the model's device.

One batch of requests (models/nmt/engine.py SampleRequest) decodes as one tree of prefixes
(models/nmt/decoding/prefix_decoder.py): rows (one per sample) with the same source and prefix share a
node, and the decoder, output projection, softmax and top-k run once per node. Everything the
loop needs is put on the device once per batch (sources, each row's request, seed and length
limit, the banned phrases: models/nmt/decoding/bans.py), and each step reads back from the device once: a
handful of integers (rows finished, nodes of the next step, whether the tree changed, the most
bans a row has, the most nodes of one source) that size the next step's tensors. Finished rows
stay on the device until the batch ends and are read back in one transfer. So the host round
trips of a step are a constant, whatever the rows, samples and banned phrases: on a GPU each round
trip waits for the device to drain, and one per row or per phrase left it idle.

Each step, per row: the node's top (k + bans) tokens, the row's banned tokens removed, the top k of
the rest, then Gumbel-max with counter-based noise (models/nmt/decoding/device_random.py), so a row's
sample depends only on its seed, its request key and its sample index.
"""
from __future__ import annotations

import numpy as np
import torch

from models.nmt.decoding.bans import BanTable, compact
from models.nmt.decoding.device_random import gumbel_steps, row_seed, row_seeds
from models.nmt.engine import Hypothesis, SampleRequest
from models.nmt.decoding.ensemble import EnsembleDecoder
from models.nmt.decoding.prefix_decoder import prefix_decoder

_NEG_INF = float("-inf")
# Gumbel noise is made for up to this many steps at a time (models/nmt/decoding/device_random.py), within
# about this many numbers (its int64 and float64 temporaries are 8 bytes each).
_NOISE_STEPS = 8
_NOISE_NUMBERS = 1 << 22


def _to_device(values, device, dtype=np.int64) -> torch.Tensor:
    return torch.from_numpy(np.asarray(values, dtype=dtype)).to(device)


def _next_nodes(node: torch.Tensor, tok: torch.Tensor, done: torch.Tensor, vocab: int):
    """The tree after this step: each continuing row's child node is its (node, token). Returns
    (child of each row, the children's parents (a buffer as long as the rows: the first 'count'
    entries are the children's), count as a device scalar). Done rows map past the last child.
    A sort-based unique, so the number of children stays on the device."""
    sentinel = torch.iinfo(torch.int64).max
    keys = torch.where(done, sentinel, node * vocab + tok)
    sorted_keys, perm = keys.sort()
    first = torch.ones_like(done)
    first[1:] = sorted_keys[1:] != sorted_keys[:-1]
    group = first.long().cumsum(0) - 1
    child = torch.empty_like(group).scatter_(0, perm, group)
    parent = torch.zeros_like(group).scatter_(0, group, sorted_keys // vocab)
    count = group[-1] + 1 - (sorted_keys[-1] == sentinel).long()
    return child, parent, count


class _Batch:
    """A batch's rows and their device-side tables, built once."""

    def __init__(self, engine, reqs: list[SampleRequest], src_ids: dict, seed: int):
        dev = engine.device
        self.sources = list(dict.fromkeys(r.source for r in reqs if r.num_samples > 0))
        src_index = {s: i for i, s in enumerate(self.sources)}
        row_req, row_src, seeds = [], [], []
        for qi, r in enumerate(reqs):
            for s in range(r.num_samples):
                row_req.append(qi)
                row_src.append(src_index[r.source])
                seeds.append(row_seed(seed, r.key, s))
        self.row_req = row_req
        self.n_rows = len(row_req)
        src_limit = [engine._max_len(len(src_ids[s])) for s in self.sources]
        self.limits = set(src_limit)
        self.max_len = max(src_limit)
        self.src_tokens, self.src_lengths = engine._collate_src([src_ids[s] for s in self.sources])
        self.row_req_t = _to_device(row_req, dev)
        self.row_src_t = _to_device(row_src, dev)
        self.seeds = row_seeds(seeds, dev)
        self.row_limit_t = _to_device(np.asarray(src_limit)[row_src], dev)
        # One row of each source: the node a source starts from.
        first_row = np.zeros(len(self.sources), dtype=np.int64)
        for row in reversed(range(self.n_rows)):
            first_row[row_src[row]] = row
        self.first_row_t = _to_device(first_row, dev)
        packs = [engine.banned_packs(r.banned_words) for r in reqs]
        self.bans = BanTable.from_packs(packs, len(engine.tgt_dict), dev) if any(map(any, packs)) else None
        # Most bans a row has at the first step (one-piece phrases only).
        self.first_widest = self.bans.single.shape[1] if self.bans is not None else 0


def sample_batch(engine, reqs: list[SampleRequest], src_ids: dict, topk: int, seed: int,
                 min_len: int) -> list[list[Hypothesis]]:
    """REQS' samples (each request's list in the order its rows finished); SRC_IDS maps each
    source to its token ids. ENGINE is a models.nmt.engines.fairseq_engine.Translator."""
    outs: list[list[Hypothesis]] = [[] for _ in reqs]
    b = _Batch(engine, reqs, src_ids, seed)
    if not b.n_rows:
        return outs
    dev, eos, vocab = engine.device, engine.eos, len(engine.tgt_dict)
    tokens = torch.full((b.n_rows, b.max_len + 2), eos, dtype=torch.long, device=dev)
    score = torch.zeros(b.n_rows, device=dev)
    length = torch.full((b.n_rows,), -1, dtype=torch.long, device=dev)   # pieces, set when a row ends
    active = torch.arange(b.n_rows, device=dev)          # global row ids still decoding, ascending
    node = b.row_src_t.clone()                           # node of each active row
    rep = b.first_row_t                                  # an active row of each node (its position)
    node_src = torch.arange(len(b.sources), device=dev)  # source of each node
    n_active, n_nodes = b.n_rows, len(b.sources)
    ban_state = b.bans.start(b.n_rows, dev) if b.bans is not None else None
    banned = b.bans.banned(b.row_req_t, None) if b.bans is not None else None
    widest = b.first_widest
    decoder = EnsembleDecoder([
        prefix_decoder(m, m.encoder.forward_torchscript({"src_tokens": b.src_tokens, "src_lengths": b.src_lengths}),
                       b.max_len, fast=engine.fast_decoder) for m in engine.models])
    k = min(topk, vocab)
    noise_steps = max(1, min(_NOISE_STEPS, _NOISE_NUMBERS // (b.n_rows * k)))
    for step in range(b.max_len + 1):
        if step % noise_steps == 0:                  # every row's noise for the next steps
            noise = gumbel_steps(b.seeds, step, noise_steps, k)
        features = decoder.step(tokens[active[rep], :step + 1])
        # A row's top k after its bans lie in its node's top (k + its bans).
        at_limit = b.row_limit_t[active[rep]] <= step if step in b.limits else None
        node_vals, node_idx = engine._top_tokens(decoder, features, min(k + widest, vocab), step < min_len, at_limit)
        vals, idx = node_vals[node], node_idx[node]
        if widest:
            ban = compact(banned, widest)
            hit = (idx[:, :, None] == ban[:, None, :]).any(-1)
            vals, order = vals.masked_fill(hit, _NEG_INF).topk(k, dim=-1)
            idx = idx.gather(1, order)
        choice = (vals + noise[active, step % noise_steps]).argmax(-1, keepdim=True)
        tok = idx.gather(1, choice).squeeze(1)
        tokens[active, step + 1] = tok
        score[active] += vals.gather(1, choice).squeeze(1)
        done = tok.eq(eos)
        length[active] = torch.where(done, step, -1)
        child, parent, count = _next_nodes(node, tok, done, vocab)
        # The next step's bans, on this step's rows (compacted below with them).
        if b.bans is not None:
            requests = b.row_req_t[active]
            ban_state = b.bans.advance(ban_state, requests, tok)
            banned = b.bans.banned(requests, ban_state)
            bans_next = (banned >= 0).sum(1).masked_fill(done, 0).max()
        else:
            bans_next = torch.zeros((), dtype=torch.long, device=dev)
        child_src = node_src.index_select(0, parent.clamp(max=n_nodes - 1))
        real = torch.arange(n_active, device=dev) < count
        per_src = torch.zeros(len(b.sources), dtype=torch.long, device=dev).index_add_(0, child_src, real.long())
        same_tree = (count == n_nodes) & (parent[:n_nodes] == torch.arange(n_nodes, device=dev)).all()
        # The step's one read-back: what sizes the next step.
        n_done, n_nodes_next, unchanged, widest, width = torch.stack(
            [done.sum(), count, same_tree.long(), bans_next, per_src.max()]).tolist()
        n_active -= n_done
        if n_active == 0:
            break
        if n_done:                                   # continuing rows first, in row order
            keep = done.to(torch.uint8).argsort(stable=True)[:n_active]
            active, child = active[keep], child[keep]
            if banned is not None:
                banned = banned[keep]
            if ban_state is not None:
                ban_state = ban_state[keep]
        node = child
        if not unchanged:
            parent = parent[:n_nodes_next]
            node_src = child_src[:n_nodes_next]
            decoder.reorder(parent, width)
        n_nodes = n_nodes_next
        rep = torch.empty(n_nodes, dtype=torch.long, device=dev).scatter_(
            0, node, torch.arange(n_active, device=dev))
    # Read every row out in one go, in the order rows finished (then row order).
    token_rows = tokens[:, 1:].cpu().numpy()
    lengths, totals = length.cpu().numpy(), score.cpu().numpy()
    for row in np.lexsort((np.arange(b.n_rows), lengths)):
        n = int(lengths[row])
        ids = [int(i) for i in token_rows[row, :n]]
        text, pieces = engine.decode_ids(ids)
        outs[b.row_req[row]].append(Hypothesis(text, pieces, tuple(ids), -float(totals[row]) / (n + 1)))
    return outs


__all__ = ["sample_batch"]
