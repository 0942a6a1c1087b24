"""The fairseq engine (models/nmt/engine.py): a fairseq transformer, or an ensemble of them,
wrapped for the generation job: sampling with negative constraints, beam search, and
forced-decoding scores, with fairseq hub's text pipeline around them (Moses and BPE, or
sentencepiece: models/nmt/tokenization.py).

Model directory: models/nmt/model_dir.py (``paragen-train-nmt``'s, or ``paragen-import-model``'s
with several members).

Sampling is our own incremental decoding loop over fairseq's encoders and the decoders of
models/nmt/prefix_decoder.py, which run once per distinct prefix of a source's samples
(fairseq-generate refuses constraints with sampling, and its constraints are positive only).
Each hypothesis carries its own banned phrases: a single-piece phrase is masked at every step, a
multi-piece phrase's last piece is masked whenever the hypothesis ends with the phrase's prefix,
so a banned phrase can never be completed. Randomness is counter-based (Gumbel-max with a hash of
(seed, request key, sample, step)), so a pair's samples do not depend on how pairs were batched
or on which worker decoded them.

Ensembles combine their members as fairseq's ``EnsembleModel`` and ``SequenceScorer`` do: at every
step, the log of the mean of the members' probabilities (``logsumexp`` of their log-probabilities
minus ``log M``), and the banned phrases apply to that combined distribution.
"""
from __future__ import annotations

import hashlib
import logging
import math
import os
import threading
import warnings

import numpy as np
import torch

from models.nmt.engine import Engine, Hypothesis, SampleRequest
from models.nmt.model_dir import build_members, read_model_meta
from models.nmt.onednn import pack_linears
from models.nmt.prefix_decoder import prefix_decoder
from models.nmt.tokenization import Tokenization
from models.nmt.topk import topk_rows

log = logging.getLogger(__name__)
# fairseq 0.12 passes a bool key-padding mask with a float attention mask; torch warns on every
# decoder call, which would drown the job's progress lines.
warnings.filterwarnings("ignore", message="Support for mismatched key_padding_mask", category=UserWarning)

_NEG_INF = float("-inf")
_LOGIT_ROWS = 160           # rows per block of logits on the CPU (see _logit_blocks)


def _logit_blocks(features: torch.Tensor):
    """Row slices of `features` to project to the vocabulary one at a time: blocks of
    `_LOGIT_ROWS` on the CPU (their logits stay cache-sized), all rows at once on a GPU."""
    n = features.shape[0]
    rows = _LOGIT_ROWS if features.device.type == "cpu" else max(1, n)
    return [slice(start, start + rows) for start in range(0, n, rows)]


__all__ = ["Translator", "SampleRequest", "Hypothesis", "load_translator"]


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """Counter-based hash (SplitMix64 finaliser); uint64 arithmetic wraps by design."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _key_seed(seed: int, key: str, sample: int) -> int:
    digest = hashlib.blake2b(f"{seed}\x00{key}\x00{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _gumbel(row_seeds: np.ndarray, step: int, k: int) -> torch.Tensor:
    with np.errstate(over="ignore"):
        base = _splitmix64(row_seeds ^ np.uint64((step + 1) * 0xD1B54A32D192ED03 % (1 << 64)))
        counters = base[:, None] + np.arange(k, dtype=np.uint64)[None, :]
        bits = _splitmix64(counters) >> np.uint64(11)
    uniform = (bits.astype(np.float64) + 0.5) * (1.0 / (1 << 53))
    return torch.from_numpy(-np.log(-np.log(uniform))).float()


def model_fingerprint(model_dir: str, files: list[str]) -> str:
    """A short id of a model directory's FILES (the model, its dictionaries and tokenization)."""
    digest = hashlib.sha256()
    for name in sorted(files):
        if name == "model.json":
            continue
        digest.update(name.encode() + b"\0")
        with open(os.path.join(model_dir, name), "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


PRECISIONS = ("auto", "fp32", "bf16", "fp16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(precision: str, device_type: str) -> str:
    """Weights' precision. auto: fp16 on a GPU, fp32 on the CPU. bf16 halves the weights on CPUs
    with AVX512-BF16 or AMX (faster sampling: docs/benchmarks.md), at the cost of slightly
    different scores and samples; softmax and scores are always computed in fp32."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    if precision == "auto":
        return "fp16" if device_type == "cuda" else "fp32"
    if precision == "fp16" and device_type != "cuda":
        raise ValueError("fp16 decoding needs a GPU; use bf16 on the CPU")
    return precision


def cpu_has_native_bf16() -> bool | None:
    """True if this CPU computes bf16 natively (AVX512-BF16 or AMX), False if not, None if it
    cannot tell. Without it torch emulates bf16, several times slower than fp32."""
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:
        pass
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
        return "avx512_bf16" in flags or "amx_bf16" in flags
    except OSError:
        return None


# A hypothesis may have at most MAX_LEN_A x source pieces + MAX_LEN_B pieces (fairseq's max_len_a/b):
# a translation is rarely much longer than its source, and a bound keeps a degenerate sample
# (a repeated phrase) from running to the model's position limit.
MAX_LEN_A = 1.5
MAX_LEN_B = 10
BATCH_TOKENS = 24_000            # beam search and forced decoding: source + output tokens per batch
# Sampled rows share prefixes (models/nmt/prefix_decoder.py): a sampling batch holds far fewer decoder
# states than rows, so it gets a larger budget (one batch for a typical 64-pair call).
SAMPLE_BATCH_TOKENS = 200_000


class Translator(Engine):
    """One direction of translation by one fairseq model or an ensemble, loaded once per process
    (see :func:`load_translator`)."""

    def __init__(self, model_dir: str, device: str | None = None, max_len_a: float = MAX_LEN_A,
                 max_len_b: int = MAX_LEN_B, batch_tokens: int = BATCH_TOKENS,
                 sample_batch_tokens: int = SAMPLE_BATCH_TOKENS, precision: str = "auto"):
        self.model_dir = model_dir
        self.meta = read_model_meta(model_dir)
        self.device = torch.device(device or default_device())
        src_lang, tgt_lang = self.meta["src_lang"], self.meta["tgt_lang"]
        self.precision = resolve_precision(precision, self.device.type)
        if self.precision == "bf16" and self.device.type == "cpu" and cpu_has_native_bf16() is False:
            log.warning("bf16 on a CPU without AVX512-BF16/AMX is emulated and several times slower than fp32")
        models, task = build_members(model_dir, self.meta)           # validated configs only
        self.models = []
        for model in models:
            model = model.to(self.device).eval()
            if self.precision != "fp32":
                model.to(_DTYPES[self.precision])
            if self.device.type == "cpu":
                pack_linears(model)                         # oneDNN products: see models/nmt/onednn.py
            self.models.append(model)
        self.model = self.models[0]
        self.src_dict, self.tgt_dict = task.source_dictionary, task.target_dictionary
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        tok = self.meta["tokenization"]
        self.tokenization = Tokenization(tok["tokenizer"], tok["bpe"],
                                         os.path.join(model_dir, tok["codes"]) if tok["codes"] else None,
                                         src_lang, tgt_lang)
        self.max_len_a, self.max_len_b = max_len_a, max_len_b
        self.batch_tokens = batch_tokens
        self.sample_batch_tokens = sample_batch_tokens
        self.fingerprint = model_fingerprint(model_dir, self.meta["files"])
        d = self.tgt_dict
        self.eos, self.pad, self.unk = d.eos(), d.pad(), d.unk()
        self._never = [i for i in {d.pad(), d.unk(), d.bos()} if i != d.eos()]
        self._vocabulary = frozenset(d.symbols)
        # Sampling decodes with models/nmt/prefix_decoder.py's PrefixDecoder where the model's
        # configuration allows it (False: fairseq's own incremental decoder, the reference).
        self.fast_decoder = True

    def describe(self) -> dict:
        return {"engine": "fairseq", "members": len(self.models), "tokenization": self.tokenization.describe(),
                "precision": self.precision, "fingerprint": self.fingerprint}

    # ---------------------------------------------------------------- tokens
    def source_pieces(self, text: str) -> list[str]:
        return self.tokenization.encode(text, "src")

    def target_pieces(self, text: str) -> list[str]:
        return self.tokenization.encode(text, "tgt")

    def _ids(self, dictionary, text: str, side: str) -> list[int]:
        return [dictionary.index(p) for p in self.tokenization.encode(text, side)] + [dictionary.eos()]

    def _collate_src(self, id_lists: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = torch.tensor([len(x) for x in id_lists])
        out = torch.full((len(id_lists), int(lengths.max())), self.src_dict.pad(), dtype=torch.long)
        for i, ids in enumerate(id_lists):            # left padding, as fairseq's translation task
            out[i, out.shape[1] - len(ids):] = torch.tensor(ids)
        return out.to(self.device), lengths.to(self.device)

    def decode_ids(self, ids) -> tuple[str, tuple[str, ...]]:
        pieces = tuple(self.tgt_dict[i] for i in ids)
        return self.tokenization.decode(list(pieces), "tgt"), pieces

    def banned_phrases(self, words) -> list[tuple[int, ...]]:
        """Target-token sequences to ban for these words: every form (as written, lower-cased,
        capitalised, upper-cased) in every segmentation the dictionary can spell it with
        (models/nmt/tokenization.py), so a sample cannot write the word another way."""
        phrases = []
        for word in words:
            for pieces in self.tokenization.banned_phrases(word, self._vocabulary):
                ids = tuple(self.tgt_dict.index(p) for p in pieces)
                if ids and self.unk not in ids:
                    phrases.append(ids)
        return list(dict.fromkeys(phrases))

    @property
    def max_source_positions(self) -> int:
        """Longest source, in pieces with </s>, every member's encoder positions allow."""
        return min(int(m.encoder.max_positions()) for m in self.models)

    @property
    def max_target_positions(self) -> int:
        """Longest output, in pieces with </s>, every member's decoder positions allow."""
        return min(int(m.decoder.max_positions()) for m in self.models)

    def _max_len(self, src_len: int) -> int:
        """Output length limit for a source of SRC_LEN pieces, within the decoder's positions."""
        return min(int(self.max_len_a * src_len + self.max_len_b), self.max_target_positions - 1)

    def _length_batches(self, lengths: list[int], rows_per_item: int = 1, budget: int | None = None,
                        order: list[int] | None = None):
        """Indices grouped into batches of similar length: at most `budget` (`batch_tokens`) padded
        source plus target tokens over all decoder rows (an item decodes `rows_per_item` rows).
        Items are taken in `order` (default: by length)."""
        budget = budget or self.batch_tokens
        order = sorted(range(len(lengths)), key=lambda i: lengths[i]) if order is None else order
        batch: list[int] = []
        longest = 0
        for i in order:
            grown = max(longest, lengths[i])
            cost = (len(batch) + 1) * rows_per_item * (grown + self._max_len(grown))
            if batch and cost > budget:
                yield batch
                batch, grown = [], lengths[i]
            batch.append(i)
            longest = grown
        if batch:
            yield batch

    # ---------------------------------------------------------------- scoring
    def score_batches(self, sources: list[str], targets: list[str]):
        """Forced-decoding batches, length-bucketed: (indices, src_tokens, src_lengths,
        prev_output_tokens, target); the target is right-padded and ends with </s>."""
        src_ids = [self._ids(self.src_dict, s, "src") for s in sources]
        tgt_ids = [self._ids(self.tgt_dict, t, "tgt") for t in targets]
        lengths = [len(s) + len(t) for s, t in zip(src_ids, tgt_ids)]
        # Target length in buckets of 4 pieces first, then source length: in dual scoring all
        # candidates of a pair share the target (the foreign source), so this order pads both
        # sides far less than ordering by total length does.
        order = sorted(range(len(lengths)), key=lambda i: (len(tgt_ids[i]) // 4, len(src_ids[i])))
        for batch in self._length_batches(lengths, rows_per_item=1, order=order):
            src_tokens, src_lengths = self._collate_src([src_ids[i] for i in batch])
            tl = max(len(tgt_ids[i]) for i in batch)
            target = torch.full((len(batch), tl), self.pad, dtype=torch.long)
            prev = torch.full((len(batch), tl), self.pad, dtype=torch.long)
            for row, i in enumerate(batch):
                t = torch.tensor(tgt_ids[i])
                target[row, :len(t)] = t
                prev[row, 0] = self.eos
                prev[row, 1:len(t)] = t[:-1]
            yield batch, src_tokens, src_lengths, prev.to(self.device), target.to(self.device)

    @torch.inference_mode()
    def score(self, sources: list[str], targets: list[str]) -> list[float]:
        """Per-token NLL of each target given its source (forced decoding, </s> included); an
        ensemble's token probability is the mean of its members' (fairseq's SequenceScorer)."""
        out = [0.0] * len(sources)
        for batch, src_tokens, src_lengths, prev, target in self.score_batches(sources, targets):
            mask = target.ne(self.pad)
            members = [self._member_token_log_probs(m, src_tokens, src_lengths, prev, target, mask)
                       for m in self.models]
            tok_lp = members[0] if len(members) == 1 else _mean_probability(torch.stack(members))
            nll = -(tok_lp * mask).sum(1) / mask.sum(1)
            for row, i in enumerate(batch):
                out[i] = float(nll[row])
        return out

    def _member_token_log_probs(self, model, src_tokens, src_lengths, prev, target, mask) -> torch.Tensor:
        """log p(target token) at every position of one member (0 at padding)."""
        if getattr(model.decoder, "adaptive_softmax", None) is None:
            features, _ = model(src_tokens, src_lengths, prev, features_only=True)
            tok_lp = torch.zeros(target.shape, device=self.device)
            tok_lp[mask] = self._target_log_probs(model, features[mask], target[mask])
            return tok_lp
        net_out = model(src_tokens, src_lengths, prev)                # adaptive softmax: fairseq normalises
        lprobs = model.get_normalized_probs(net_out, log_probs=True).float()
        return lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1) * mask

    def _target_log_probs(self, model, features: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """log p(target) at each real (non-pad) position: the output projection and log-softmax
        run on those positions only (not on padding) and, on the CPU, in blocks of `_LOGIT_ROWS`
        positions, so the batch's logits (positions x 8,008 words) are never held at once. Dual
        scoring is most of the job's time at S=5 x N=30 (~150 candidates per pair)."""
        out = torch.empty(targets.shape[0], device=features.device)
        for part in _logit_blocks(features):
            lp = torch.log_softmax(model.decoder.output_layer(features[part]).float(), dim=-1)
            out[part] = lp.gather(1, targets[part, None]).squeeze(1)
        return out

    # ---------------------------------------------------------------- beam search
    @torch.inference_mode()
    def beam_search(self, sources: list[str], beam: int = 12, nbest: int = 1) -> list[list[Hypothesis]]:
        """fairseq's own SequenceGenerator (the reference engine), n-best per source; an ensemble
        through fairseq's EnsembleModel."""
        from fairseq.sequence_generator import SequenceGenerator

        gen = SequenceGenerator(self.models, self.tgt_dict, beam_size=beam, max_len_a=self.max_len_a,
                                max_len_b=self.max_len_b, normalize_scores=True, unk_penalty=0.0)
        src_ids = [self._ids(self.src_dict, s, "src") for s in sources]
        results: list[list[Hypothesis]] = [[] for _ in sources]
        for batch in self._length_batches([len(x) for x in src_ids], rows_per_item=beam):
            src_tokens, src_lengths = self._collate_src([src_ids[i] for i in batch])
            hypos = gen.generate(self.models, {"net_input": {"src_tokens": src_tokens,
                                                              "src_lengths": src_lengths}})
            for row, i in enumerate(batch):
                for h in hypos[row][:nbest]:
                    ids = [int(t) for t in h["tokens"] if int(t) != self.eos]
                    text, pieces = self.decode_ids(ids)
                    nll = -float(h["positional_scores"].float().mean())
                    results[i].append(Hypothesis(text, pieces, tuple(ids), nll))
        return results

    # ---------------------------------------------------------------- sampling
    @torch.inference_mode()
    def sample(self, requests: list[SampleRequest], topk: int = 10, seed: int = 0,
               min_len: int = 1) -> list[list[Hypothesis]]:
        """Top-k samples per request, never completing one of the request's banned phrases."""
        src_cache: dict[str, list[int]] = {}
        for r in requests:
            if r.source not in src_cache:
                src_cache[r.source] = self._ids(self.src_dict, r.source, "src")
        results: list[list[Hypothesis]] = [[] for _ in requests]
        per_item = max((r.num_samples for r in requests), default=1)
        lengths = [len(src_cache[r.source]) for r in requests]
        for batch in self._length_batches(lengths, rows_per_item=per_item, budget=self.sample_batch_tokens):
            self._sample_batch([requests[i] for i in batch], [results[i] for i in batch],
                               src_cache, topk, seed, min_len)
        return results

    def _top_tokens(self, decoder, features, k, no_eos, at_limit):
        """Top-k next tokens of each node with their log-probabilities. The whole vocabulary is
        normalised first (one fused kernel), then masks steer the choice: scores stay the model's
        true log-probabilities. `no_eos`: before the minimum length; `at_limit`: nodes forced to
        </s>. On the CPU the nodes go through in blocks of `_LOGIT_ROWS`, so that a block's
        logits stay in cache (those of ~500 nodes over an 8,000-word vocabulary are 16 MB)."""
        n = features.shape[0]
        vals = torch.empty(n, k, device=self.device)
        idx = torch.empty(n, k, dtype=torch.long, device=self.device)
        for part in _logit_blocks(features):
            limit = at_limit[part]
            lp = decoder.log_probs(features, part)
            lp[:, self._never] = _NEG_INF
            if no_eos:
                lp[:, self.eos] = _NEG_INF
            if bool(limit.any()):
                forced = lp[limit, self.eos].clone()
                lp[limit] = _NEG_INF
                lp[limit, self.eos] = torch.where(torch.isinf(forced), 0.0, forced)    # masked: certain
            vals[part], idx[part] = topk_rows(lp, k)
        return vals, idx

    def _sample_batch(self, reqs, outs, src_cache, topk, seed, min_len):
        dev = self.device
        # Only sources with samples to draw: the decoder starts with one node per source.
        sources = list(dict.fromkeys(r.source for r in reqs if r.num_samples > 0))
        if not sources:                                      # every request asked for 0 samples
            return
        src_index = {s: i for i, s in enumerate(sources)}
        row_req, row_src, row_seed = [], [], []
        for qi, r in enumerate(reqs):
            for s in range(r.num_samples):
                row_req.append(qi)
                row_src.append(src_index[r.source])
                row_seed.append(_key_seed(seed, r.key, s))
        n_rows = len(row_req)
        src_tokens, src_lengths = self._collate_src([src_cache[s] for s in sources])
        max_len = max(self._max_len(len(src_cache[s])) for s in sources)
        seeds = np.array(row_seed, dtype=np.uint64)

        # Banned phrases per row: single pieces as (row, token) pairs, longer ones as
        # right-aligned prefixes with -1 as wildcard padding plus their last token.
        phrase_cache = {}
        single_rows, single_toks, multi_rows, multi_prefix, multi_last = [], [], [], [], []
        for row, qi in enumerate(row_req):
            words = reqs[qi].banned_words
            if not words:
                continue
            if words not in phrase_cache:
                phrase_cache[words] = self.banned_phrases(words)
            for ph in phrase_cache[words]:
                if len(ph) == 1:
                    single_rows.append(row)
                    single_toks.append(ph[0])
                else:
                    multi_rows.append(row)
                    multi_prefix.append(ph[:-1])
                    multi_last.append(ph[-1])
        lmax = max((len(p) for p in multi_prefix), default=0)
        single_rows_t = torch.tensor(single_rows, dtype=torch.long, device=dev)
        single_toks_t = torch.tensor(single_toks, dtype=torch.long, device=dev)
        multi_rows_t = torch.tensor(multi_rows, dtype=torch.long, device=dev)
        multi_last_t = torch.tensor(multi_last, dtype=torch.long, device=dev)
        prefix_t = torch.full((len(multi_prefix), max(lmax, 1)), -1, dtype=torch.long, device=dev)
        for j, p in enumerate(multi_prefix):
            prefix_t[j, lmax - len(p):] = torch.tensor(p)

        # tokens keeps `lmax` columns of -2 on the left so phrase windows never run off the start.
        tokens = torch.full((n_rows, lmax + max_len + 2), -2, dtype=torch.long, device=dev)
        tokens[:, lmax] = self.eos
        score = torch.zeros(n_rows, device=dev)
        active = torch.arange(n_rows, device=dev)           # global row ids still decoding
        pos_of = torch.arange(n_rows, device=dev)           # global row -> position in active
        # Rows with the same source and prefix have the same decoder state and next-token
        # distribution, so the decoder, output projection, softmax and top-k run once per distinct
        # prefix (a node; see models/nmt/prefix_decoder.py). Step 0 has one node per source.
        node = torch.tensor(row_src, dtype=torch.long, device=dev)   # node of each active row
        decoder = EnsembleDecoder([
            prefix_decoder(m, m.encoder.forward_torchscript({"src_tokens": src_tokens, "src_lengths": src_lengths}),
                           max_len, fast=self.fast_decoder) for m in self.models])
        row_limit = torch.tensor([self._max_len(len(src_cache[reqs[q].source])) for q in row_req], device=dev)
        vocab = len(self.tgt_dict)
        for step in range(max_len + 1):
            n_nodes = int(node.max()) + 1
            rep = torch.empty(n_nodes, dtype=torch.long, device=dev).scatter_(
                0, node, torch.arange(node.numel(), device=dev))     # an active row of each node
            features = decoder.step(tokens[active[rep], lmax:lmax + step + 1].clamp(min=0))
            # This step's banned (row position, token) pairs: single pieces always, a phrase's last
            # piece when the row ends with the rest of the phrase.
            ban_pos, ban_tok = [], []
            if len(single_rows):
                alive = pos_of[single_rows_t] >= 0
                ban_pos.append(pos_of[single_rows_t[alive]])
                ban_tok.append(single_toks_t[alive])
            if len(multi_rows) and step >= 1:
                alive = pos_of[multi_rows_t] >= 0
                rows = multi_rows_t[alive]
                window = tokens[rows, step + 1:lmax + step + 1]
                pref = prefix_t[alive]
                hit = ((pref == -1) | (window == pref)).all(1)
                ban_pos.append(pos_of[rows[hit]])
                ban_tok.append(multi_last_t[alive][hit])
            ban_pos_t = torch.cat(ban_pos) if ban_pos else torch.zeros(0, dtype=torch.long, device=dev)
            k = min(topk, vocab)
            # A row's top k after its bans lie in its prefix's top (k + bans of that row).
            widest = int(torch.bincount(ban_pos_t, minlength=active.numel()).max()) if ban_pos_t.numel() else 0
            node_vals, node_idx = self._top_tokens(decoder, features, min(k + widest, vocab), step < min_len,
                                                   row_limit[active][rep] <= step)
            vals, idx = node_vals[node], node_idx[node]
            if widest:
                banned = torch.zeros(vals.shape, dtype=torch.int32, device=dev).index_add_(
                    0, ban_pos_t, (idx[ban_pos_t] == torch.cat(ban_tok)[:, None]).int())
                vals = vals.masked_fill(banned > 0, _NEG_INF)
                vals, order = vals.topk(k, dim=-1)
                idx = idx.gather(1, order)
            g = _gumbel(seeds[active.cpu().numpy()], step, vals.shape[1]).to(dev)
            choice = (vals + g).argmax(-1, keepdim=True)
            tok = idx.gather(1, choice).squeeze(1)
            tok_lp = vals.gather(1, choice).squeeze(1)
            tokens[active, lmax + step + 1] = tok
            score[active] += tok_lp
            done = tok.eq(self.eos)
            if bool(done.any()):
                rows = active[done]                        # finished: read out in one go
                for row, ids, total in zip(rows.tolist(), tokens[rows, lmax + 1:lmax + step + 1].tolist(),
                                           score[rows].tolist()):
                    text, pieces = self.decode_ids(ids)
                    outs[row_req[row]].append(Hypothesis(text, pieces, tuple(ids), -total / (step + 1)))
                keep = (~done).nonzero().squeeze(1)
                active = active[keep]
                if active.numel() == 0:
                    break
                pos_of.fill_(-1)
                pos_of[active] = torch.arange(active.numel(), device=dev)
                node, tok = node[keep], tok[keep]
            children, node = torch.unique(node * vocab + tok, return_inverse=True)
            parent = children // vocab                  # sorted, so nodes stay grouped by source
            if parent.numel() != n_nodes or bool((parent != torch.arange(n_nodes, device=dev)).any()):
                decoder.reorder(parent)


def _mean_probability(log_probs: torch.Tensor) -> torch.Tensor:
    """log of the mean of the members' probabilities (dimension 0 holds the members), as
    fairseq's EnsembleModel combines them."""
    return torch.logsumexp(log_probs, dim=0) - math.log(log_probs.shape[0])


class EnsembleDecoder:
    """The prefix decoders of an ensemble's members driven together: one tree of nodes, each
    member's state reordered alike, next-token log-probabilities combined (_mean_probability).
    Features are one tensor per member (their sizes may differ); `log_probs` takes a row slice."""

    def __init__(self, decoders: list):
        self.decoders = decoders

    def step(self, prefixes: torch.Tensor) -> "_Features":
        return _Features([d.step(prefixes) for d in self.decoders])

    def reorder(self, parent: torch.Tensor) -> None:
        for d in self.decoders:
            d.reorder(parent)

    def log_probs(self, features: "_Features", part: slice) -> torch.Tensor:
        members = [torch.log_softmax(d.logits(f[part]).float(), dim=-1) for d, f in zip(self.decoders, features.parts)]
        return members[0] if len(members) == 1 else _mean_probability(torch.stack(members))


class _Features:
    """Each member's decoder features of the same nodes; len() and shape[0] are the nodes."""

    def __init__(self, parts: list):
        self.parts = parts
        self.shape, self.device = parts[0].shape, parts[0].device

    def __len__(self):
        return self.shape[0]


_CACHE: dict = {}
_CACHE_LOCK = threading.Lock()


def load_translator(model_dir: str, device: str | None = None, sha256: dict | None = None,
                    **kwargs) -> Translator:
    """Load a model once per process: Beam may create many DoFn instances in one worker.
    MODEL_DIR may be a bucket URL: it is copied to a local cache first and checked against
    SHA256 ({file: digest}, recorded by the driver), see models/nmt/model_dir.py."""
    from models.nmt.model_dir import local_model_dir
    from common import storage

    key = (storage.absolute(model_dir), device, tuple(sorted(kwargs.items())))
    with _CACHE_LOCK:
        if key not in _CACHE:
            log.info("loading NMT model %s", model_dir)
            _CACHE[key] = Translator(local_model_dir(model_dir, sha256), device=device, **kwargs)
        return _CACHE[key]
