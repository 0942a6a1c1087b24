"""One sampling step with fixed shapes: the unit that ``torch.compile`` fuses and a GPU can replay
as a CUDA graph (models/nmt/decoding/fixed_sampler.py drives it).

The eager loop (models/nmt/decoding/sampler.py) changes every tensor's shape at every step: the prefix
tree's node count, the self-attention caches that grow by a position and are gathered on every
split, the finished rows that are dropped. A compiled or captured step needs the opposite: a few
shapes, buffers written in place, no host read inside. Here:

* **Rows keep their slot for the whole batch.** A batch's rows are laid out source by source,
  ``rows_per_source`` each (``R = sources x rows_per_source``); finished rows are masked, never
  compacted. Each row has its own self-attention cache, ``(R, H, L, hd)`` per layer, allocated
  once per batch and written in place at the step's position (a device tensor): no cache is ever
  gathered or copied when the tree splits.
* **Attention runs per row, everything else per node.** Rows with the same prefix share a node
  (the tree of models/nmt/decoding/prefix_decoder.py), and the products that cost (projections,
  feed-forward, output projection, softmax, top-k) run once per node. A node's queries are copied
  to its rows, attention runs over each row's own cache (the rows of a node hold the same keys, so
  any one of them gives the node's output) and over its source's keys (rows are grouped by source,
  so cross-attention is one batched product with no scatter), and the node takes the output of
  one of its rows (``rep``). Attention is a small part of a step's arithmetic.
* **Node counts come in buckets.** The node buffers are as long as the rows; a step reads the
  first ``n_nodes`` (a bucket: models/nmt/decoding/fixed_sampler.py ``bucket``), the only shape that
  changes during a batch.
* **The step never reads from the device.** The step index, the rows' state, the tree and the
  banned-phrase state (models/nmt/decoding/bans.py, its width fixed per batch) stay device tensors and are
  updated in place; the step returns ``[rows still decoding, nodes of the next step]``, which
  the host reads once to pick the next bucket (or stop).

The arithmetic is the eager loop's: the same log-probabilities (up to the last bits of a float:
attention here runs over the padded cache with masked positions, and products over padded
nodes), the same top-k after bans, the same counter-based Gumbel noise
(models/nmt/decoding/device_random.py), so a row draws the same tokens (tests/test_fixed_sampler.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from models.nmt.decoding.device_random import gumbel_at
from models.nmt.decoding.ensemble import mean_probability

_NEG_INF = float("-inf")
_SENTINEL = torch.iinfo(torch.int64).max
FUSED_MAX_BATCH = 65_535            # CUDA's grid limit on a fused attention's batch (pytorch#146704)
FUSED_ON_CPU = False                # bench/bench_gpu.py counts a GPU's launches on a CPU with it on


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(..., L, heads * d) -> (..., heads, L, d)"""
    return x.unflatten(-1, (heads, -1)).transpose(-3, -2)


def attention(q, k, v, mask):
    """softmax(q k^T + mask) v with q already scaled: on a GPU one fused kernel (in slices past
    CUDA's grid limit), on a CPU the explicit products (torch's CPU kernel for fused attention
    took 11 ms a call against ~1 for the products, one query a row over 3,000 rows)."""
    if q.device.type == "cpu" and not FUSED_ON_CPU:
        scores = (q @ k.transpose(-1, -2)).float() + mask
        return torch.softmax(scores, dim=-1).to(q.dtype) @ v
    step = FUSED_MAX_BATCH
    if q.shape[0] <= step:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
    return torch.cat([F.scaled_dot_product_attention(
        q[i:i + step], k[i:i + step], v[i:i + step], scale=1.0,
        attn_mask=mask if mask.shape[0] == 1 else mask[i:i + step]) for i in range(0, q.shape[0], step)])


def _linear(module, x):
    """The module's product by its weights (not its forward: on a CPU Translator the forward is a
    oneDNN packed product, models/nmt/decoding/onednn.py, which the compiler cannot trace)."""
    return F.linear(x, module.weight, module.bias)


class MemberStep(torch.nn.Module):
    """One fairseq ``TransformerDecoder``'s incremental step in the fixed layout, on the module's
    own weights (layers that models/nmt/decoding/prefix_decoder.py ``unsupported_reason`` accepts)."""

    def __init__(self, decoder, max_positions: int):
        super().__init__()
        self.dec = decoder
        self.heads = decoder.layers[0].self_attn.num_heads
        self.embed_scale = float(decoder.embed_scale)
        qkv_w, qkv_b, cq_w, cq_b = [], [], [], []
        for layer in decoder.layers:
            a, c = layer.self_attn, layer.encoder_attn
            parts = [(a.q_proj, a.scaling), (a.k_proj, 1.0), (a.v_proj, 1.0)]
            qkv_w.append(torch.cat([p.weight * s for p, s in parts]))
            qkv_b.append(torch.cat([(p.bias if p.bias is not None else p.weight.new_zeros(p.weight.shape[0])) * s
                                    for p, s in parts]))
            cq_w.append(c.q_proj.weight * c.scaling)
            cq_b.append(c.q_proj.bias * c.scaling if c.q_proj.bias is not None
                        else c.q_proj.weight.new_zeros(c.q_proj.weight.shape[0]))
        # Buffers, not plain attributes: the compiler lifts them as the step's static inputs.
        for name, tensors in (("qkv_w", qkv_w), ("qkv_b", qkv_b), ("cq_w", cq_w), ("cq_b", cq_b)):
            for i, t in enumerate(tensors):
                self.register_buffer(f"{name}{i}", t.detach().clone(), persistent=False)
        if decoder.embed_positions is not None:
            probe = torch.full((1, max_positions), decoder.dictionary.eos(), dtype=torch.long,
                               device=decoder.embed_tokens.weight.device)
            with torch.no_grad():
                positions = decoder.embed_positions(probe)[0].to(decoder.embed_tokens.weight.dtype)
            self.register_buffer("positions", positions.clone(), persistent=False)
        else:
            self.positions = None

    def cross_kv(self, encoder_out: dict, n_src: int, src_len: int):
        """Per layer, the encoder's keys and values as (n_src, H, src_len, hd), zero-padded to N_SRC
        sources and SRC_LEN positions, and the additive mask (n_src, 1, 1, src_len) over them:
        padded positions of a real source masked, a padded source left open (its rows are
        finished from the start; an all-masked row would make NaN)."""
        enc = encoder_out["encoder_out"][0].transpose(0, 1)          # (real sources, S, d)
        real, s, _ = enc.shape
        pad = encoder_out["encoder_padding_mask"]
        mask = enc.new_zeros(n_src, src_len, dtype=enc.dtype)
        mask[:real, s:] = _NEG_INF
        if len(pad) and pad[0] is not None:
            mask[:real, :s] = mask[:real, :s].masked_fill(pad[0], _NEG_INF)
        padded = enc.new_zeros(n_src, src_len, enc.shape[2])
        padded[:real, :s] = enc
        out = []
        for layer in self.dec.layers:
            c = layer.encoder_attn
            out.append((_heads(_linear(c.k_proj, padded), self.heads).contiguous(),
                        _heads(_linear(c.v_proj, padded), self.heads).contiguous()))
        return out, mask[:, None, None, :]

    def forward(self, node_token, pos, node_of_row, rep, caches, cross, cross_mask, self_mask):
        """Features (n_nodes, d) of the nodes' last positions. NODE_TOKEN (n_nodes,): each node's
        last token; NODE_OF_ROW (R,): each row's node (clamped into range); REP (n_nodes,): a row
        of each node; CACHES: per layer (k, v), (R, H, L, hd), written at POS in place."""
        dec, heads = self.dec, self.heads
        rows = node_of_row.shape[0]
        x = self.embed_scale * F.embedding(node_token, dec.embed_tokens.weight)
        if dec.project_in_dim is not None:
            x = _linear(dec.project_in_dim, x)
        if self.positions is not None:
            x = x + self.positions.index_select(0, pos.view(1))
        if dec.layernorm_embedding is not None:
            x = dec.layernorm_embedding(x)
        n_src = cross_mask.shape[0]
        for i, layer in enumerate(dec.layers):
            pre = layer.normalize_before
            # Self-attention: the nodes' q, k, v copied to their rows; k, v written at POS.
            h = layer.self_attn_layer_norm(x) if pre else x
            qkv = F.linear(h, getattr(self, f"qkv_w{i}"), getattr(self, f"qkv_b{i}")).index_select(0, node_of_row)
            q, k_new, v_new = (t.view(rows, heads, 1, -1) for t in qkv.chunk(3, dim=-1))
            k_cache, v_cache = caches[i]
            k_cache.index_copy_(2, pos.view(1), k_new)
            v_cache.index_copy_(2, pos.view(1), v_new)
            span = self_mask.shape[-1]            # positions attended to: the step's length bucket
            out = attention(q, k_cache[:, :, :span], v_cache[:, :, :span], self_mask).view(rows, -1).index_select(0, rep)
            x = x + _linear(layer.self_attn.out_proj, out)
            x = x if pre else layer.self_attn_layer_norm(x)
            # Cross-attention: one product per source over its rows.
            h = layer.encoder_attn_layer_norm(x) if pre else x
            cq = F.linear(h, getattr(self, f"cq_w{i}"), getattr(self, f"cq_b{i}")).index_select(0, node_of_row)
            cq = _heads(cq.view(n_src, rows // n_src, -1), heads)              # (n_src, H, rows per source, hd)
            k, v = cross[i]
            out = attention(cq, k, v, cross_mask).transpose(1, 2).reshape(rows, -1).index_select(0, rep)
            x = x + _linear(layer.encoder_attn.out_proj, out)
            x = x if pre else layer.encoder_attn_layer_norm(x)
            h = layer.final_layer_norm(x) if pre else x
            x = x + _linear(layer.fc2, layer.activation_fn(_linear(layer.fc1, h)))
            x = x if pre else layer.final_layer_norm(x)
        if dec.layer_norm is not None:
            x = dec.layer_norm(x)
        if dec.project_out_dim is not None:
            x = _linear(dec.project_out_dim, x)
        return x

    def logits(self, features):
        return _linear(self.dec.output_projection, features)


class FixedStep(torch.nn.Module):
    """The whole sampling step of an ensemble's members (one MemberStep each): decoder, next-token
    log-probabilities with the engine's masks, each node's top (k + ban width), each row's bans
    removed, Gumbel-max, the rows' state and the next tree, all in place in the batch's
    buffers (models/nmt/decoding/fixed_sampler.py ``FixedBatch``)."""

    def __init__(self, decoders: list, vocab: int, eos: int, never: list[int], max_positions: int):
        super().__init__()
        self.members = torch.nn.ModuleList(MemberStep(d, max_positions) for d in decoders)
        self.vocab, self.eos = vocab, eos
        self.register_buffer("never", torch.tensor(never, dtype=torch.long,
                                                   device=decoders[0].embed_tokens.weight.device), persistent=False)

    def forward(self, s: dict, n_nodes: int, span: int, topk: int, width: int, min_len: int) -> torch.Tensor:
        """One step on the batch state S (dict of tensors, updated in place) with the first
        N_NODES node slots, attending to the first SPAN cache positions (a bucket above the
        step); TOPK the sample's k, WIDTH the node top-k's width (k + the batch's ban width, at
        most the vocabulary). Returns [rows still decoding, nodes of the next step] as a device
        tensor."""
        pos = s["pos"]
        node_token = s["node_token"][:n_nodes]
        rep = s["rep"][:n_nodes]
        node_of_row = s["node_of_row"].clamp(max=n_nodes - 1)
        rows = s["node_of_row"].shape[0]
        self_mask = torch.where(s["self_mask_base"][..., :span] <= pos, 0.0, _NEG_INF).to(s["cross_mask"][0].dtype)
        members = []
        for m, member in enumerate(self.members):
            features = member(node_token, pos, node_of_row, rep, s["caches"][m], s["cross"][m], s["cross_mask"][m],
                              self_mask)
            members.append(torch.log_softmax(member.logits(features).float(), dim=-1))
        lp = members[0] if len(members) == 1 else mean_probability(torch.stack(members))
        # The engine's masks (Translator._steered_log_probs), with the step as a tensor.
        lp = lp.index_fill(1, self.never, _NEG_INF)
        eos_col = torch.where(pos < min_len, _NEG_INF, lp[:, self.eos])
        forced = torch.where(torch.isinf(eos_col), 0.0, eos_col)            # masked: certain
        at_limit = s["row_limit"].index_select(0, rep) <= pos
        lp = lp.masked_fill(at_limit[:, None], _NEG_INF)
        lp[:, self.eos] = torch.where(at_limit, forced, eos_col)
        node_vals, node_idx = lp.topk(width, dim=-1)
        # Rows: their node's candidates, their bans removed, the top k, Gumbel-max.
        vals = node_vals.index_select(0, node_of_row)
        idx = node_idx.index_select(0, node_of_row)
        active = s["active"]
        if "ban_single" in s:
            banned = s["ban_single"].index_select(0, s["row_req"])
            if "ban_state" in s:
                state = s["ban_state"]
                banned = torch.cat([banned, s["ban_emits"].index_select(0, state.reshape(-1)).view(rows, -1)], dim=1)
            hit = (idx[:, :, None] == banned[:, None, :]).any(-1)
            vals, order = vals.masked_fill(hit, _NEG_INF).topk(topk, dim=-1)
            idx = idx.gather(1, order)
        choice = (vals + gumbel_at(s["seeds"], pos, topk)).argmax(-1, keepdim=True)
        tok = idx.gather(1, choice).squeeze(1)
        val = vals.gather(1, choice).squeeze(1)
        # Finished rows keep the </s> their token row was filled with.
        s["tokens"].index_copy_(1, pos.view(1) + 1, torch.where(active, tok, self.eos)[:, None])
        s["score"].add_(torch.where(active, val, 0.0))
        done = active & tok.eq(self.eos)
        s["length"].copy_(torch.where(done, pos, s["length"]))
        still = active & ~done
        active.copy_(still)
        if "ban_state" in s:                       # each row's trie state after its token (models/nmt/decoding/bans.py)
            state = s["ban_state"]
            parent = torch.cat([(s["row_req"] + 1)[:, None], state[:, :-1]], dim=1)
            key = parent * self.vocab + tok[:, None]
            edge_key = s["ban_edge_key"]
            at = torch.searchsorted(edge_key, key).clamp_(max=edge_key.shape[0] - 1)
            state.copy_(torch.where(edge_key[at] == key, s["ban_edge_child"][at], 0))
        # The next tree: each continuing row's child is its distinct (node, token); a sort-based
        # unique, so the count stays on the device (sampler._next_nodes).
        keys = torch.where(still, node_of_row * self.vocab + tok, _SENTINEL)
        sorted_keys, perm = keys.sort()
        first = torch.cat([torch.ones_like(still[:1]), sorted_keys[1:] != sorted_keys[:-1]])
        group = first.long().cumsum(0) - 1
        child = torch.empty_like(group).scatter_(0, perm, group)
        count = group[-1] + 1 - (sorted_keys[-1] == _SENTINEL).long()
        s["node_of_row"].copy_(child)
        s["node_token"].copy_(torch.zeros_like(group).scatter_(0, group, sorted_keys % self.vocab))
        # A row of each node: any of them (their caches are equal); rows past the last node write
        # to the slot of the finished rows' group, which no row reads.
        s["rep"].copy_(torch.zeros_like(group).scatter_(0, child, torch.arange(rows, device=child.device)))
        pos.add_(1)
        return torch.stack([still.sum(), count])


__all__ = ["FixedStep", "MemberStep", "attention"]
