"""The fairseq engine (models/nmt/engine.py): a fairseq transformer, or an ensemble of them,
wrapped for the generation job: sampling with negative constraints, beam search, and
forced-decoding scores, with fairseq hub's text pipeline around them (Moses and BPE, or
sentencepiece: models/nmt/model_files/tokenization.py).

Model directory: models/nmt/model_files/model_dir.py (``paragen-train-nmt``'s, or ``paragen-import-model``'s
with several members).

Sampling is our own incremental decoding loop (models/nmt/decoding/sampler.py) over fairseq's encoders and
the decoders of models/nmt/decoding/prefix_decoder.py, which run once per distinct prefix of a source's
samples (fairseq-generate refuses constraints with sampling, and its constraints are positive
only). Each hypothesis carries its own banned phrases: a single-piece phrase is masked at every
step, a multi-piece phrase's last piece is masked whenever the hypothesis ends with the phrase's
prefix, so a banned phrase can never be completed. Randomness is counter-based (Gumbel-max with a
hash of (seed, request key, sample, step): models/nmt/decoding/device_random.py), so a pair's samples do
not depend on how pairs were batched, on which worker decoded them, or on the device.

Ensembles combine their members as fairseq's ``EnsembleModel`` and ``SequenceScorer`` do
(models/nmt/decoding/ensemble.py), and the banned phrases apply to that combined distribution.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
import warnings

import numpy as np
import torch

from models.nmt.decoding.bans import PhrasePack
from models.nmt.devices import PRECISIONS, batch_budgets, gpu_memory_share
from models.nmt.engine import Engine, Hypothesis, SampleRequest
from models.nmt.decoding.ensemble import mean_probability
from models.nmt.decoding.fixed_sampler import fixed_step_of, resolve_step_mode, sample_batch_fixed
from models.nmt.model_files.model_dir import build_members, read_model_meta
from models.nmt.decoding.onednn import pack_linears
from models.nmt.decoding.sampler import sample_batch
from models.nmt.model_files.tokenization import Tokenization
from models.nmt.decoding.topk import topk_rows

log = logging.getLogger(__name__)
# fairseq 0.12 passes a bool key-padding mask with a float attention mask; torch warns on every
# decoder call, which would drown the job's progress lines.
warnings.filterwarnings("ignore", message="Support for mismatched key_padding_mask", category=UserWarning)

_NEG_INF = float("-inf")
_LOGIT_ROWS = 160           # rows per block of logits on the CPU (see _logit_blocks)
# Words whose banned phrases a Translator keeps (~3 KB a word: ~60 MB at most), and as many packed
# (PhrasePack: about a third of that again).
_MAX_WORD_BANS = 20_000


def _logit_blocks(features: torch.Tensor):
    """Row slices of `features` to project to the vocabulary one at a time: blocks of
    `_LOGIT_ROWS` on the CPU (their logits stay cache-sized), all rows at once on a GPU."""
    n = features.shape[0]
    rows = _LOGIT_ROWS if features.device.type == "cpu" else max(1, n)
    return [slice(start, start + rows) for start in range(0, n, rows)]


__all__ = ["Translator", "SampleRequest", "Hypothesis", "load_translator"]


def _left_padded(id_lists: list[list[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows x longest) int64 array with each list right-aligned after PAD, and the lengths."""
    lengths = np.array([len(x) for x in id_lists], dtype=np.int64)
    out = np.full((len(id_lists), int(lengths.max(initial=0))), pad, dtype=np.int64)
    for i, ids in enumerate(id_lists):
        out[i, out.shape[1] - len(ids):] = ids
    return out, lengths


def _right_padded(id_lists: list[list[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows x longest) int64 array with each list left-aligned before PAD, and the lengths."""
    lengths = np.array([len(x) for x in id_lists], dtype=np.int64)
    out = np.full((len(id_lists), int(lengths.max(initial=0))), pad, dtype=np.int64)
    for i, ids in enumerate(id_lists):
        out[i, :len(ids)] = ids
    return out, lengths


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


_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(precision: str, device_type: str, capability: tuple[int, int] | None = None) -> str:
    """Weights' precision. auto is fp32 weights everywhere: on an H100 fp32 sampled 1.3-1.5x
    faster than bf16 and fp16 and ran beam search 1.5-1.8x faster (docs/benchmarks.md, "Decoding
    on a GPU"): a 6-layer d512 model's decoding steps are too small for half precision to pay for
    its casts. On a GPU of compute CAPABILITY 8.0 or later (Ampere, Hopper) auto is tf32: fp32
    weights, the matrix products on tensor cores with 10-bit mantissas, no casts, so no extra
    kernels a step; the scorer's products, the job's largest, run several times faster on them.
    bf16 (Ampere and later; fp32's range, so activations cannot overflow as fp16's can) and fp16
    are there on request, for larger models. All but fp32 give slightly different scores and
    samples. Softmax and scores are always computed in fp32."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    if precision == "auto":
        return "tf32" if device_type == "cuda" and capability is not None and capability >= (8, 0) else "fp32"
    if precision == "fp16" and device_type != "cuda":
        raise ValueError("fp16 decoding needs a GPU; use bf16 on the CPU")
    if precision == "tf32" and device_type != "cuda":
        raise ValueError("tf32 is a GPU's tensor-core format (NVIDIA Ampere or later); use fp32 on the CPU")
    return precision


def gpu_capability(device) -> tuple[int, int] | None:
    """DEVICE's CUDA compute capability, None for a CPU."""
    device = torch.device(device)
    return tuple(torch.cuda.get_device_capability(device)) if device.type == "cuda" else None


def _kept(memo: dict, word: str, make):
    """MEMO[WORD], made by MAKE() the first time; the memo is dropped when it reaches
    _MAX_WORD_BANS words (a job's words keep coming)."""
    found = memo.get(word)
    if found is None:
        if len(memo) >= _MAX_WORD_BANS:
            memo.clear()
        found = memo[word] = make()
    return found


@contextlib.contextmanager
def tf32_matmuls(on: bool):
    """fp32 matrix products in TF32 while the block runs, if ON: torch's switch is per process,
    so a tf32 engine turns it on for its own calls only and an fp32 engine beside it stays exact."""
    if not on:
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


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


class Translator(Engine):
    """One direction of translation by one fairseq model or an ensemble, loaded once per process
    (see :func:`load_translator`)."""

    def __init__(self, model_dir: str, device: str | None = None, max_len_a: float = MAX_LEN_A,
                 max_len_b: int = MAX_LEN_B, batch_tokens: int | None = None,
                 sample_batch_tokens: int | None = None, precision: str = "auto", processes_per_gpu: int = 1,
                 step_mode: str = "auto"):
        """BATCH_TOKENS (beam search, scoring) and SAMPLE_BATCH_TOKENS: padded source plus output
        tokens per batch; None sizes them for the device (models/nmt/devices.py), on a GPU for
        this process's share of its memory when PROCESSES_PER_GPU processes share it. STEP_MODE:
        how sampling runs its decoder steps (models/nmt/decoding/fixed_sampler.py: tree, fixed, compiled,
        graphs; auto is tree)."""
        self.model_dir = model_dir
        self.meta = read_model_meta(model_dir)
        self.device = torch.device(device or default_device())
        src_lang, tgt_lang = self.meta["src_lang"], self.meta["tgt_lang"]
        self.precision = resolve_precision(precision, self.device.type, gpu_capability(self.device))
        self.step_mode = resolve_step_mode(step_mode, self.device.type)
        if self.precision == "bf16" and self.device.type == "cpu" and cpu_has_native_bf16() is False:
            log.warning("bf16 on a CPU without AVX512-BF16/AMX is emulated and several times slower than fp32")
        models, task = build_members(model_dir, self.meta)           # validated configs only
        self.models = []
        for model in models:
            model = model.to(self.device).eval()
            if self.precision in _DTYPES:
                model.to(_DTYPES[self.precision])
            if self.device.type == "cpu":
                pack_linears(model)                         # oneDNN products: see models/nmt/decoding/onednn.py
            self.models.append(model)
        self.model = self.models[0]
        self.src_dict, self.tgt_dict = task.source_dictionary, task.target_dictionary
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        tok = self.meta["tokenization"]
        self.tokenization = Tokenization(tok["tokenizer"], tok["bpe"],
                                         os.path.join(model_dir, tok["codes"]) if tok["codes"] else None,
                                         src_lang, tgt_lang)
        self.max_len_a, self.max_len_b = max_len_a, max_len_b
        self.batch_tokens, self.sample_batch_tokens = self._budgets(processes_per_gpu)
        self.batch_tokens = batch_tokens or self.batch_tokens
        self.sample_batch_tokens = sample_batch_tokens or self.sample_batch_tokens
        self.fingerprint = model_fingerprint(model_dir, self.meta["files"])
        d = self.tgt_dict
        self.eos, self.pad, self.unk = d.eos(), d.pad(), d.unk()
        never = sorted(i for i in {d.pad(), d.unk(), d.bos()} if i != d.eos())
        self._never_t = torch.tensor(never, dtype=torch.long, device=self.device)   # masked at every step
        self._vocabulary = frozenset(d.symbols)
        self._word_bans_memo: dict[str, tuple[tuple[int, ...], ...]] = {}
        self._word_packs_memo: dict[str, PhrasePack] = {}
        # Sampling decodes with models/nmt/decoding/prefix_decoder.py's PrefixDecoder where the model's
        # configuration allows it (False: fairseq's own incremental decoder, the reference).
        self.fast_decoder = True

    def _smaller_batches_on_oom(self, decode):
        """DECODE(), retried with halved batch budgets while the GPU runs out of memory (another
        process may hold more of it than this one planned for). The output does not depend on
        the batches, so a retry gives what the first try would have."""
        for attempt in range(5):
            try:
                with tf32_matmuls(self.precision == "tf32"):
                    return decode()
            except torch.cuda.OutOfMemoryError:
                if self.device.type != "cuda" or attempt == 4:
                    raise
                torch.cuda.empty_cache()
                self.batch_tokens = max(1, self.batch_tokens // 2)
                self.sample_batch_tokens = max(1, self.sample_batch_tokens // 2)
                log.warning("%s ran out of GPU memory: batches of %d scoring and %d sampling tokens from now on",
                            self.device, self.batch_tokens, self.sample_batch_tokens)

    def _budgets(self, processes_per_gpu: int) -> tuple[int, int]:
        if self.device.type != "cuda":
            return batch_budgets("cpu")
        decoder = self.model.decoder
        return batch_budgets("cuda", gpu_memory_share(self.device, processes_per_gpu) // max(1, len(self.models)),
                             layers=len(getattr(decoder, "layers", [])) or 6,
                             dim=int(decoder.embed_tokens.weight.shape[1]), vocab=len(self.tgt_dict),
                             element_bytes=2 if self.precision in _DTYPES else 4)

    def warm_up(self, mode: str = "sample") -> float:
        """Engine.warm_up, and with a fixed-shape step also a sample under banned words: the step
        has a graph for batches with bans and one for batches without, and both are compiled
        here, not in the first unit (models/nmt/decoding/fixed_sampler.py). The memo of spelled words is
        left as it was."""
        seconds = super().warm_up(mode)
        if mode != "sample" or self.step_mode == "tree":
            return seconds
        start = time.perf_counter()
        memos = dict(self._word_bans_memo), dict(self._word_packs_memo)
        try:
            self.sample([SampleRequest("a b c d e f g h", "warm-up:bans", ("a", "b"), 3)], topk=10)
        finally:
            self._word_bans_memo, self._word_packs_memo = memos
        return seconds + time.perf_counter() - start

    @property
    def compile_seconds(self) -> float:
        """Seconds this process spent compiling the sampling step (0 for the eager modes)."""
        step = fixed_step_of(self) if self.step_mode in ("compiled", "graphs") else None
        return step.compile_seconds if step is not None else 0.0

    def describe(self) -> dict:
        return {"engine": "fairseq", "members": len(self.models), "tokenization": self.tokenization.describe(),
                "precision": self.precision, "fingerprint": self.fingerprint, "decode_step": self.step_mode}

    # ---------------------------------------------------------------- tokens
    def source_pieces(self, text: str) -> list[str]:
        return self.tokenization.encode(text, "src")

    def target_pieces(self, text: str) -> list[str]:
        return self.tokenization.encode(text, "tgt")

    def _ids(self, dictionary, text: str, side: str) -> list[int]:
        """TEXT's token ids with </s>, as fairseq's Dictionary.index maps its pieces (unknown ->
        <unk>), through the dictionary's table directly: this runs for every candidate scored."""
        get, unk = dictionary.indices.get, dictionary.unk_index
        return [get(p, unk) for p in self.tokenization.encode(text, side)] + [dictionary.eos()]

    def _ids_of(self, dictionary, texts: list[str], side: str) -> list[list[int]]:
        """_ids of each text, each distinct text encoded once: in dual scoring a pair's ~150
        candidates share its source, and samples repeat. The lists are shared between equal
        texts; callers only read them."""
        seen: dict[str, list[int]] = {}
        return [seen[t] if t in seen else seen.setdefault(t, self._ids(dictionary, t, side)) for t in texts]

    def _collate_src(self, id_lists: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded source tokens (as fairseq's translation task pads them) and their lengths,
        on the device: built on the host, one transfer each."""
        tokens, lengths = _left_padded(id_lists, self.src_dict.pad())
        return torch.from_numpy(tokens).to(self.device), torch.from_numpy(lengths).to(self.device)

    def decode_ids(self, ids) -> tuple[str, tuple[str, ...]]:
        pieces = tuple(self.tgt_dict[i] for i in ids)
        return self.tokenization.decode(list(pieces), "tgt"), pieces

    def banned_phrases(self, words) -> list[tuple[int, ...]]:
        """Target-token sequences to ban for these words: every form (as written, lower-cased,
        capitalised, upper-cased) in every segmentation the dictionary can spell it with
        (models/nmt/model_files/tokenization.py), so a sample cannot write the word another way."""
        phrases = []
        for word in words:
            phrases += self._word_bans(word)
        return list(dict.fromkeys(phrases))

    def _word_bans(self, word: str) -> tuple[tuple[int, ...], ...]:
        """banned_phrases of one word, kept: a job's constraint words repeat (a thousand pairs'
        5 sets draw ~10,000 words, ~1,500 distinct), and enumerating a word's segmentations is
        host work the device waits for. The memo is dropped when it reaches _MAX_WORD_BANS words."""
        return _kept(self._word_bans_memo, word, lambda: tuple(
            ids for ids in (tuple(self.tgt_dict.index(p) for p in pieces)
                            for pieces in self.tokenization.banned_phrases(word, self._vocabulary))
            if ids and self.unk not in ids))

    def banned_packs(self, words) -> list[PhrasePack]:
        """banned_phrases of WORDS as one PhrasePack a word (kept beside the word's phrases), what
        BanTable.from_packs takes: the sampler's tables are then built from whole arrays. A
        phrase two words share is banned once all the same (the tables keep distinct ones)."""
        return [_kept(self._word_packs_memo, w, lambda w=w: PhrasePack.of(self._word_bans(w))) for w in words]

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
        prev_output_tokens, target, real) on the device; the target is right-padded and ends with
        </s>, REAL holds the flat positions (row x width + column) of its non-pad tokens. Every
        batch's arrays are built on the host and sent to the device in one transfer."""
        src_ids = self._ids_of(self.src_dict, sources, "src")
        tgt_ids = self._ids_of(self.tgt_dict, targets, "tgt")
        lengths = [len(s) + len(t) for s, t in zip(src_ids, tgt_ids)]
        # Target length in buckets of 4 pieces first, then source length: in dual scoring all
        # candidates of a pair share the target (the foreign source), so this order pads both
        # sides far less than ordering by total length does.
        order = sorted(range(len(lengths)), key=lambda i: (len(tgt_ids[i]) // 4, len(src_ids[i])))
        batches, arrays = [], []
        for batch in self._length_batches(lengths, rows_per_item=1, order=order):
            src, src_len = _left_padded([src_ids[i] for i in batch], self.src_dict.pad())
            target, tgt_len = _right_padded([tgt_ids[i] for i in batch], self.pad)
            inside = np.arange(target.shape[1])[None, :] < tgt_len[:, None]
            prev = np.roll(target, 1, axis=1)                         # </s> first, as fairseq shifts
            prev[:, 0] = self.eos
            prev[~inside] = self.pad
            batches.append(batch)
            arrays.append((src, src_len, prev, target, np.flatnonzero(inside)))
        flat = [a.ravel() for group in arrays for a in group]
        on_device = torch.from_numpy(np.concatenate(flat) if flat else np.zeros(0, dtype=np.int64)).to(self.device)
        at = 0
        for batch, group in zip(batches, arrays):
            views = []
            for a in group:
                views.append(on_device[at:at + a.size].view(a.shape))
                at += a.size
            yield (batch, *views)

    @torch.inference_mode()
    def score(self, sources: list[str], targets: list[str]) -> list[float]:
        """Per-token NLL of each target given its source (forced decoding, </s> included); an
        ensemble's token probability is the mean of its members' (fairseq's SequenceScorer).
        One transfer to the device and one back per call, however many batches."""
        return self._smaller_batches_on_oom(lambda: self._score(sources, targets))

    def _score(self, sources: list[str], targets: list[str]) -> list[float]:
        indices, nlls = [], []
        for batch, src_tokens, src_lengths, prev, target, real in self.score_batches(sources, targets):
            members = [self._member_token_log_probs(m, src_tokens, src_lengths, prev, target, real)
                       for m in self.models]
            tok_lp = members[0] if len(members) == 1 else mean_probability(torch.stack(members))
            mask = target.ne(self.pad)
            nlls.append(-(tok_lp * mask).sum(1) / mask.sum(1))
            indices += batch
        out = [0.0] * len(sources)
        for i, nll in zip(indices, torch.cat(nlls).tolist() if nlls else []):
            out[i] = nll
        return out

    def _member_token_log_probs(self, model, src_tokens, src_lengths, prev, target, real) -> torch.Tensor:
        """log p(target token) at every position of one member (0 at padding)."""
        if getattr(model.decoder, "adaptive_softmax", None) is None:
            features, _ = model(src_tokens, src_lengths, prev, features_only=True)
            lp = self._target_log_probs(model, features.flatten(0, 1).index_select(0, real),
                                        target.flatten().index_select(0, real))
            return torch.zeros(target.numel(), device=self.device).index_put_((real,), lp).view(target.shape)
        net_out = model(src_tokens, src_lengths, prev)                # adaptive softmax: fairseq normalises
        lprobs = model.get_normalized_probs(net_out, log_probs=True).float()
        return lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1) * target.ne(self.pad)

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
    def beam_search(self, sources: list[str], beam: int = 12, nbest: int = 1) -> list[list[Hypothesis]]:
        """fairseq's own SequenceGenerator (the reference engine), n-best per source; an ensemble
        through fairseq's EnsembleModel. Each source ends at its own length limit
        (models/nmt/decoding/beam.py), so its hypotheses do not depend on the sources batched with it."""
        with tf32_matmuls(self.precision == "tf32"):
            return self._beam_search(sources, beam, nbest)

    @torch.inference_mode()
    def _beam_search(self, sources: list[str], beam: int, nbest: int) -> list[list[Hypothesis]]:
        from models.nmt.decoding.beam import beam_generator

        src_ids = [self._ids(self.src_dict, s, "src") for s in sources]
        results: list[list[Hypothesis]] = [[] for _ in sources]
        for batch in self._length_batches([len(x) for x in src_ids], rows_per_item=beam):
            src_tokens, src_lengths = self._collate_src([src_ids[i] for i in batch])
            limits = torch.from_numpy(np.array([self._max_len(len(src_ids[i])) for i in batch])).to(self.device)
            gen = beam_generator(self.models, self.tgt_dict, limits, beam, self.max_len_a, self.max_len_b)
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
        return self._smaller_batches_on_oom(lambda: self._sample(requests, topk, seed, min_len))

    def _sample(self, requests: list[SampleRequest], topk: int, seed: int, min_len: int) -> list[list[Hypothesis]]:
        src_cache: dict[str, list[int]] = {}
        for r in requests:
            if r.source not in src_cache:
                src_cache[r.source] = self._ids(self.src_dict, r.source, "src")
        results: list[list[Hypothesis]] = [[] for _ in requests]
        per_item = max((r.num_samples for r in requests), default=1)
        lengths = [len(src_cache[r.source]) for r in requests]
        step = fixed_step_of(self) if self.step_mode != "tree" and self.fast_decoder else None
        for batch in self._length_batches(lengths, rows_per_item=per_item, budget=self.sample_batch_tokens):
            if not any(requests[i].num_samples > 0 for i in batch):
                continue
            reqs = [requests[i] for i in batch]
            hyps = (sample_batch(self, reqs, src_cache, topk, seed, min_len) if step is None
                    else sample_batch_fixed(self, step, reqs, src_cache, topk, seed, min_len))
            for i, h in zip(batch, hyps):
                results[i] = h
        return results

    def _top_tokens(self, decoder, features, k, no_eos, at_limit):
        """Top-k next tokens of each node with their log-probabilities. The whole vocabulary is
        normalised first (one fused kernel), then masks steer the choice: scores stay the model's
        true log-probabilities. `no_eos`: before the minimum length; `at_limit`: None, or which
        nodes are forced to </s>. On the CPU the nodes go through in blocks of `_LOGIT_ROWS`, so
        that a block's logits stay in cache (those of ~500 nodes over an 8,000-word vocabulary
        are 16 MB)."""
        blocks = _logit_blocks(features)
        if len(blocks) == 1:                        # all nodes at once (a GPU): no copy into place
            return topk_rows(self._steered_log_probs(decoder, features, blocks[0], no_eos, at_limit), k)
        vals = torch.empty(features.shape[0], k, device=self.device)
        idx = torch.empty(features.shape[0], k, dtype=torch.long, device=self.device)
        for part in blocks:
            vals[part], idx[part] = topk_rows(self._steered_log_probs(decoder, features, part, no_eos, at_limit), k)
        return vals, idx

    def _steered_log_probs(self, decoder, features, part: slice, no_eos: bool, at_limit):
        """Next-token log-probabilities of the nodes PART, with _top_tokens' masks applied."""
        lp = decoder.log_probs(features, part)
        lp.index_fill_(1, self._never_t, _NEG_INF)
        if no_eos:
            lp[:, self.eos] = _NEG_INF
        if at_limit is not None:
            limit = at_limit[part]
            forced = lp[:, self.eos].clone()
            forced = torch.where(torch.isinf(forced), 0.0, forced)          # masked: certain
            lp.masked_fill_(limit[:, None], _NEG_INF)
            lp[:, self.eos] = torch.where(limit, forced, lp[:, self.eos])
        return lp


_CACHE: dict = {}
_CACHE_LOCK = threading.Lock()


def load_translator(model_dir: str, device: str | None = None, sha256: dict | None = None,
                    **kwargs) -> Translator:
    """Load a model once per process: Beam may create many DoFn instances in one worker.
    MODEL_DIR may be a bucket URL: it is copied to a local cache first and checked against
    SHA256 ({file: digest}, recorded by the driver), see models/nmt/model_files/model_dir.py."""
    from models.nmt.model_files.model_dir import local_model_dir
    from common import storage

    key = (storage.absolute(model_dir), device, tuple(sorted(kwargs.items())))
    with _CACHE_LOCK:
        if key not in _CACHE:
            log.info("loading NMT model %s", model_dir)
            _CACHE[key] = Translator(local_model_dir(model_dir, sha256), device=device, **kwargs)
        return _CACHE[key]
