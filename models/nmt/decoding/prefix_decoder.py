"""Incremental decoding over a tree of distinct prefixes, on a fairseq transformer decoder's weights.

Samples of one source share long prefixes (on Multi30k, 30 top-10 samples per source: 38% of the
decoder row-steps repeat a prefix another sample of the same source already has). Rows with the
same source and prefix have the same decoder state, so the decoder runs once per distinct prefix
("node"); when a node's samples pick different next tokens the node splits and its self-attention
cache is copied to the children (:meth:`reorder`).

:class:`PrefixDecoder` re-implements fairseq's ``TransformerDecoder`` incremental step with the
module's own weights, laid out for this: the encoder-side keys and values of each layer are
projected once per source and never copied per sample (fairseq keeps a copy per decoder row and
copies it at every reorder), and cross-attention runs as one batched matrix product per source
over its nodes. On a GPU, where a step's time follows its kernel launches, each attention is one
fused kernel (``F.scaled_dot_product_attention``). :class:`FairseqPrefixDecoder` is the same
interface over fairseq's own decoder, used for configurations the former does not cover and as
its reference in tests.
"""
from __future__ import annotations

import logging
import weakref

import torch
import torch.nn.functional as F

from models.nmt.decoding.onednn import Linear, linear_of

log = logging.getLogger("paragen.decoder")


def unsupported_reason(decoder) -> str | None:
    """Why :class:`PrefixDecoder` cannot reproduce this fairseq decoder, or None if it can."""
    checks = {
        "adaptive softmax": getattr(decoder, "adaptive_softmax", None) is not None,
        "quant noise": getattr(decoder, "quant_noise", None) is not None,
        "cross self-attention": bool(getattr(decoder, "cross_self_attention", False)),
    }
    for layer in getattr(decoder, "layers", []):
        checks["layer without encoder attention"] = checks.get(
            "layer without encoder attention", False) or getattr(layer, "encoder_attn", None) is None
        for name in ("c_attn", "attn_ln", "ffn_layernorm", "w_resid"):    # NormFormer options
            checks[name] = checks.get(name, False) or getattr(layer, name, None) is not None
        for attn in (layer.self_attn, getattr(layer, "encoder_attn", None)):
            if attn is not None and (attn.bias_k is not None or attn.add_zero_attn):
                checks["attention bias_kv / zero_attn"] = True
    if not hasattr(decoder, "layers") or not hasattr(decoder, "embed_tokens"):
        checks["not a fairseq TransformerDecoder"] = True
    failed = [name for name, bad in checks.items() if bad]
    return ", ".join(failed) if failed else None


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(..., L, heads * d) -> (..., heads, L, d)"""
    return x.unflatten(-1, (heads, -1)).transpose(-3, -2)


def _is_relu(fn) -> bool:
    return fn in (F.relu, torch.relu) or getattr(fn, "__name__", "") == "relu"


_FUSED_MAX_BATCH = 65_535          # rows of one fused attention call (see PrefixDecoder._attention)
_LINEARS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def decoder_linears(decoder) -> dict:
    """Every matrix product of an incremental decoder step, built once per loaded model (the
    weights of a loaded model do not change; the cache goes with the module)."""
    cached = _LINEARS.get(decoder)
    if cached is not None:
        return cached
    layers = []
    for layer in decoder.layers:
        a, c = layer.self_attn, layer.encoder_attn
        # fairseq scales each query after its projection; here the query weights are scaled
        # instead, which saves a kernel a layer and attention (exact when the head width is a
        # power of 4, as 64 is: the scaling is then a power of 2).
        qkv = [(a.q_proj, a.scaling), (a.k_proj, 1.0), (a.v_proj, 1.0)]
        bias = [(p.bias if p.bias is not None else p.weight.new_zeros(p.weight.shape[0])) * s for p, s in qkv]
        relu = _is_relu(layer.activation_fn)
        layers.append({
            # Self-attention's three projections as one product (fewer, larger products).
            "qkv": Linear(torch.cat([p.weight * s for p, s in qkv]), torch.cat(bias)),
            # The rest are the modules' own products (already packed by pack_linears on a CPU
            # Translator, so the weights are not packed twice).
            "self_out": linear_of(a.out_proj),
            "cross_q": Linear(c.q_proj.weight * c.scaling,
                              None if c.q_proj.bias is None else c.q_proj.bias * c.scaling),
            "cross_k": linear_of(c.k_proj),
            "cross_v": linear_of(c.v_proj),
            "cross_out": linear_of(c.out_proj),
            "fc1": Linear(layer.fc1.weight, layer.fc1.bias, relu=relu),
            "fc2": linear_of(layer.fc2),
            "relu_fused": relu,
        })
    cached = {"layers": layers, "output": linear_of(decoder.output_projection)}
    _LINEARS[decoder] = cached
    return cached


class PrefixDecoder:
    """Decoder state for a batch of nodes, each a distinct (source, prefix); starts with one node
    per source (the prefix ``<s>``). Nodes must stay grouped by source in ascending order, which
    the sampler's sorted unique (parent, token) keys guarantee."""

    def __init__(self, decoder, encoder_out: dict, max_len: int, fused_attention: bool | None = None):
        self.dec = decoder
        self.layers = list(decoder.layers)
        self.heads = self.layers[0].self_attn.num_heads
        enc = encoder_out["encoder_out"][0]                       # (S, n_src, d)
        pad = encoder_out["encoder_padding_mask"]
        n_src = enc.shape[1]
        # Additive mask over the source positions, one row per source: (n_src, 1, 1, S).
        mask = torch.zeros(n_src, enc.shape[0], dtype=torch.float32, device=enc.device)
        if len(pad) and pad[0] is not None:
            mask = mask.masked_fill(pad[0], float("-inf"))
        self.cross_mask = mask[:, None, None, :]
        # Fused attention where launches dominate (a GPU): three to four kernels an attention
        # become one. On a CPU the explicit products are faster at these shapes (one query a
        # node, short caches). Its mask is made once as the fused kernel takes it without a
        # copy per call: in the activations' dtype, rows 16-aligned (a slice of a wider tensor).
        self.fused = enc.device.type == "cuda" if fused_attention is None else fused_attention
        if self.fused:
            width = mask.shape[1]
            aligned = mask.new_zeros(n_src, 1, 1, -(-width // 16) * 16, dtype=enc.dtype)[..., :width]
            self.cross_mask = aligned.copy_(self.cross_mask)
        self.linears = decoder_linears(decoder)
        src_first = enc.transpose(0, 1)                          # (n_src, S, d)
        self.cross_kv = [(_heads(lin["cross_k"](src_first), self.heads), _heads(lin["cross_v"](src_first), self.heads))
                         for lin in self.linears["layers"]]
        # Position embeddings of steps 0..max_len, from the module itself (sinusoidal or learned).
        if decoder.embed_positions is not None:
            probe = torch.full((1, max_len + 1), decoder.dictionary.eos(), dtype=torch.long, device=enc.device)
            self.positions = decoder.embed_positions(probe)[0].to(decoder.embed_tokens.weight.dtype)
        else:
            self.positions = None
        # Per layer, keys and values apart: one (2, nodes, ...) tensor would save a copy a layer
        # but gathers along its second dimension, 1.4x slower a sample() on the CPU.
        self.cache: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(self.layers)
        self.node_src = torch.arange(n_src, device=enc.device)
        self.parent: torch.Tensor | None = None   # a reorder the caches have not had yet
        self._width: int | None = 1               # most nodes of one source (one each at the start)
        self._groups = None
        self._padded = None                       # cross-attention's queries, (n_src, width, d)

    def reorder(self, parent: torch.Tensor, width: int | None = None) -> None:
        """The next step's nodes are children of these (indices into the current nodes). The
        self-attention caches are gathered by the next step, straight into the grown cache.
        WIDTH, the most children of one source, if the caller knows it (else it is read from the
        device: a host round trip)."""
        self.parent = parent if self.parent is None else self.parent.index_select(0, parent)
        self.node_src = self.node_src.index_select(0, parent)
        self._width = width
        self._groups = self._padded = None

    def _append(self, cache: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """`cache` (nodes before the reorder, H, L, hd) with `new` (H, 1, hd) appended per node:
        one copy (index_select writes into the view) instead of a gather and a concatenation."""
        if self.parent is None:
            return torch.cat([cache, new], dim=2)
        _, h, length, hd = cache.shape
        out = cache.new_empty(new.shape[0], h, length + 1, hd)
        torch.index_select(cache, 0, self.parent, out=out[:, :, :length])
        out[:, :, length:] = new
        return out

    def _source_groups(self):
        """Each node's (source, slot) in a (n_src, widest group) padded layout."""
        if self._groups is None:
            n_src = self.cross_kv[0][0].shape[0]
            # index_add_, not bincount: bincount reads its output size back from the device
            counts = torch.zeros(n_src, dtype=torch.long, device=self.node_src.device).index_add_(
                0, self.node_src, torch.ones_like(self.node_src))
            starts = torch.cumsum(counts, 0) - counts
            slot = torch.arange(self.node_src.numel(), device=counts.device) - starts[self.node_src]
            width = self._width if self._width is not None else int(counts.max())
            self._groups = (self.node_src, slot, width)
        return self._groups

    def _cross_attention(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        lin = self.linears["layers"][layer]
        q = lin["cross_q"](x)                                     # scaled (decoder_linears)
        src, slot, width = self._source_groups()
        k, v = self.cross_kv[layer]                               # (n_src, H, S, hd)
        # The padded queries' buffer is zeroed once per tree, not once per layer: every layer
        # writes the same slots, and the others stay zero.
        if self._padded is None:
            self._padded = q.new_zeros(k.shape[0], width, q.shape[-1])
        padded = self._padded
        padded[src, slot] = q
        out = self._attention(_heads(padded, self.heads), k, v, self.cross_mask)   # (n_src, H, width, hd)
        # Each node's row, gathered from the heads-first layout (no copy of the whole output).
        return lin["cross_out"](out.transpose(1, 2)[src, slot].flatten(1))

    def _attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None):
        """softmax(q k^T + mask) v, q already scaled; the softmax in fp32 as fairseq's."""
        if self.fused:
            # The fused kernels launch a grid with the batch as a dimension, which CUDA caps at
            # 65,535 (pytorch#146704): a larger tree's nodes go through in slices.
            step = _FUSED_MAX_BATCH
            if q.shape[0] <= step:
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
            return torch.cat([F.scaled_dot_product_attention(
                q[i:i + step], k[i:i + step], v[i:i + step], scale=1.0,
                attn_mask=None if mask is None else mask[i:i + step]) for i in range(0, q.shape[0], step)])
        scores = (q @ k.transpose(-1, -2)).float()
        probs = torch.softmax(scores if mask is None else scores + mask, dim=-1).type_as(q)
        return probs @ v

    def _self_attention(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        lin = self.linears["layers"][layer]
        q, k_new, v_new = (_heads(t, self.heads) for t in lin["qkv"](x[:, None, :]).chunk(3, dim=-1))
        # q: (N, H, 1, hd), already scaled by its weights (decoder_linears)
        if self.cache[layer] is None:
            k, v = k_new, v_new
        else:
            k, v = (self._append(c, new) for c, new in zip(self.cache[layer], (k_new, v_new)))
        self.cache[layer] = (k, v)
        return lin["self_out"](self._attention(q, k, v, None).flatten(1))   # (N, H*1*hd) = (N, d)

    @torch.inference_mode()
    def step(self, prefixes: torch.Tensor) -> torch.Tensor:
        """Decoder features (N, d) of each node's last position; `prefixes` is (N, step + 1)."""
        dec, step = self.dec, prefixes.shape[1] - 1
        x = dec.embed_scale * dec.embed_tokens(prefixes[:, -1])
        if dec.project_in_dim is not None:
            x = dec.project_in_dim(x)
        if self.positions is not None:
            x = x + self.positions[step]
        if dec.layernorm_embedding is not None:
            x = dec.layernorm_embedding(x)
        for i, layer in enumerate(self.layers):
            pre = layer.normalize_before
            h = layer.self_attn_layer_norm(x) if pre else x
            x = x + self._self_attention(h, i)
            x = x if pre else layer.self_attn_layer_norm(x)
            h = layer.encoder_attn_layer_norm(x) if pre else x
            x = x + self._cross_attention(h, i)
            x = x if pre else layer.encoder_attn_layer_norm(x)
            h = layer.final_layer_norm(x) if pre else x
            lin = self.linears["layers"][i]
            hidden = lin["fc1"](h)                                # ReLU fused into the product
            x = x + lin["fc2"](hidden if lin["relu_fused"] else layer.activation_fn(hidden))
            x = x if pre else layer.final_layer_norm(x)
        if dec.layer_norm is not None:
            x = dec.layer_norm(x)
        if dec.project_out_dim is not None:
            x = dec.project_out_dim(x)
        self.parent = None                                        # every cache has had it
        return x

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.linears["output"](features)


class FairseqPrefixDecoder:
    """The same interface over fairseq's own incremental decoder (reorders its whole state)."""

    def __init__(self, model, encoder_out: dict):
        self.model, self.encoder_out, self.state = model, encoder_out, {}

    def reorder(self, parent: torch.Tensor, width: int | None = None) -> None:
        self.model.decoder.reorder_incremental_state_scripting(self.state, parent)
        self.encoder_out = self.model.encoder.reorder_encoder_out(self.encoder_out, parent)

    @torch.inference_mode()
    def step(self, prefixes: torch.Tensor) -> torch.Tensor:
        features, _ = self.model.decoder(prefixes, encoder_out=self.encoder_out,
                                         incremental_state=self.state, features_only=True)
        return features[:, -1, :]

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.model.decoder.output_layer(features)


_TOLD: "weakref.WeakSet" = weakref.WeakSet()      # models whose fallback was logged


def prefix_decoder(model, encoder_out: dict, max_len: int, fast: bool = True):
    """The fastest decoder state this model supports: PrefixDecoder, or fairseq's own incremental
    decoder (correct, slower) for a configuration it does not cover, said once per model."""
    if fast:
        reason = unsupported_reason(model.decoder)
        if reason is None:
            return PrefixDecoder(model.decoder, encoder_out, max_len)
        if model not in _TOLD:
            _TOLD.add(model)
            log.info("sampling with fairseq's incremental decoder (correct, slower): the fast decoder does not "
                     "cover %s", reason)
    return FairseqPrefixDecoder(model, encoder_out)
