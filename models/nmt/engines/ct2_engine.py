"""The CTranslate2 engine (models/nmt/engine.py): pretrained Marian/OPUS-MT, M2M-100 and NLLB
models, and fairseq transformers, converted to CTranslate2 and run with its int8 or float kernels.

A model directory (models/nmt/model_files/model_dir.py, ``"engine": "ctranslate2"``) holds the converted model
(``model.bin``, CTranslate2's ``config.json`` and vocabulary files), the tokenizer files of its
family and ``model.json`` (family, compute type, language codes, sha256 of every file):

================  ==============================================  ===============================
family            source tokens                                   target
================  ==============================================  ===============================
``fairseq``       Moses/BPE or sentencepiece pieces (CTranslate2   pieces
                  appends ``</s>``: ``add_source_eos``)
``marian``        ``source.spm`` pieces, ``</s>``                  ``target.spm`` pieces
``m2m100``,       source code, ``sentencepiece.bpe.model``         target code first
``nllb``          pieces, ``</s>``                                 (``target_prefix``), stripped
================  ==============================================  ===============================

The ParaBank 2 recipe, as the fairseq engine runs it:

* **Banned words per pair.** CTranslate2's ``suppress_sequences`` applies to a whole call and
  blocks token sequences, not words, so every (pair, constraint set) request is its own call,
  with every form and segmentation of its words the target vocabulary can spell
  (models/nmt/model_files/tokenization.py, the fairseq engine's rule; a piece outside the vocabulary would
  be an error, so such sequences are dropped: they cannot be generated anyway).
* **Randomness per work unit.** CTranslate2 has no per-call seed: ``set_random_seed`` is global
  and each thread seeds once, at its first sampling call. So the engine runs one decoding thread
  (``inter_threads=1``: parallelism comes from worker processes) and, at the first sampling call
  of every work unit (:meth:`start_unit`), seeds with a hash of (seed, unit) and makes a new
  ``Translator``: the same unit gives the same samples however often it is decoded, and whether it
  is a process's first or not (``--resume``, retries, other workers). The
  fairseq engine draws per pair instead (counter-based noise keyed by the pair), so its samples
  do not depend on the unit; the two engines' samples differ.
* **Scores.** ``score_batch`` appends and scores ``</s>`` itself; the language token of
  multilingual models is skipped (``offset=1``). Scores are per-token NLL, ``</s>`` included, as
  the fairseq engine's, so thresholds and presets mean the same on both engines. Sampled and beam
  hypotheses are scored with ``score_batch`` too (the scores ``translate_batch`` returns differ
  slightly from a forced decoding of the same tokens).
* **Threads.** ``intra_threads`` from the job's ``--torch_threads`` (1 by default). With more than
  one, ``OMP_WAIT_POLICY=PASSIVE`` is set before CTranslate2 loads: busy-waiting OpenMP threads
  collapse throughput on shared cores.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import threading

from models.nmt.engine import Engine, Hypothesis, SampleRequest
from models.nmt.model_files.model_dir import read_model_meta
from models.nmt.model_files.tokenization import Tokenization

log = logging.getLogger("paragen.ct2")
MAX_LEN_A, MAX_LEN_B = 1.5, 10          # as the fairseq engine (models/nmt/engines/fairseq_engine.py)
BATCH = 32                              # sources per beam / scoring call


def _seed_of(seed: int, key: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{seed}\0{key}".encode(), digest_size=4).digest(), "little")


_LANG_TOKEN = {"m2m100": re.compile(r"__[A-Za-z_]+__|madeupword\d+"), "nllb": re.compile(r"[a-z]{3}_[A-Z][a-z]{3}|<mask>")}


def _never_generated(token: str, family: str) -> bool:
    """Tokens no output may hold, as the fairseq engine masks <pad>, <unk> and <s>: those, and a
    multilingual model's language tokens (the target's is the forced first token, stripped)."""
    if token in ("<s>", "<pad>", "<blank>", "<unk>"):
        return True
    pattern = _LANG_TOKEN.get(family)
    return bool(pattern and pattern.fullmatch(token))


def tokenization_of(meta: dict, model_dir: str) -> Tokenization:
    """The Tokenization of a CTranslate2 model directory's family (see the module doc)."""
    tok = meta["tokenization"]

    def path(name):
        return os.path.join(model_dir, name) if name else None
    return Tokenization(tok["tokenizer"], tok["bpe"], path(tok["codes"]), meta["src_lang"], meta["tgt_lang"],
                        source_codes_path=path(tok.get("source_codes")))


def _call_groups(requests: list[SampleRequest], limits: list[int], size: int = BATCH) -> list[list[int]]:
    """Indices of REQUESTS decoded by one call each, in order: a request with banned words alone
    (suppress_sequences applies to a whole call), consecutive requests without any together (up to
    SIZE, with the same number of samples and the same length limit LIMITS[i]: a call has one
    limit, and a sample's must not depend on what it is batched with); none for requests asking
    no samples."""
    groups, run = [], []
    for i, r in enumerate(requests):
        if r.num_samples <= 0:
            continue
        if r.banned_words:
            if run:
                groups.append(run)
                run = []
            groups.append([i])
            continue
        if run and (len(run) == size or requests[run[0]].num_samples != r.num_samples or limits[run[0]] != limits[i]):
            groups.append(run)
            run = []
        run.append(i)
    if run:
        groups.append(run)
    return groups


class CT2Engine(Engine):
    """One direction of translation by a CTranslate2 model, loaded once per process."""

    def __init__(self, model_dir: str, device: str | None = None, threads: int | None = None, **_ignored):
        self.model_dir = model_dir
        self.meta = read_model_meta(model_dir)
        self.src_lang, self.tgt_lang = self.meta["src_lang"], self.meta["tgt_lang"]
        self.family, self.compute_type = self.meta["family"], self.meta["compute_type"]
        self.precision = self.compute_type
        self.device_name = self.device = device or "cpu"
        self.intra_threads = max(1, int(threads or 1))
        if self.intra_threads > 1:
            os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        import ctranslate2

        self._ct2 = ctranslate2
        self.tokenization = tokenization_of(self.meta, model_dir)
        codes = self.meta.get("lang_codes") or {}
        self.src_code, self.tgt_code = codes.get("src"), codes.get("tgt")
        self.fingerprint = hashlib.sha256(repr(sorted(self.meta["sha256"].items())).encode()).hexdigest()[:16]
        self.max_len_a, self.max_len_b = MAX_LEN_A, MAX_LEN_B
        self._unit, self._translator = "", None
        self._sampling: tuple[str, int] | None = None      # (unit, seed) the Translator samples for
        self._lock = threading.Lock()
        self._vocabulary = frozenset(self._target_vocabulary())
        # the target code too: the prefix forces it first, it must not come again
        self._never = [[t] for t in sorted(self._vocabulary) if _never_generated(t, self.family)]

    # ---------------------------------------------------------------- model and randomness
    def _target_vocabulary(self) -> list[str]:
        from models.nmt.model_files.model_dir import ct2_vocabulary

        return ct2_vocabulary(self.model_dir, "target")

    def start_unit(self, key: str) -> None:
        """A work unit KEY starts: its samples are drawn from a generator seeded by (seed, KEY)
        in a fresh Translator (see the module doc)."""
        self._unit, self._translator, self._sampling = str(key), None, None

    def warm_up(self, mode: str = "sample") -> float:
        """Engine.warm_up, then the randomness as a freshly loaded engine has it."""
        seconds = super().warm_up(mode)
        self.start_unit("")
        return seconds

    def _get(self, seed: int | None = None):
        """The Translator. For sampling (SEED given), a unit's first call makes a new one right
        after seeding CTranslate2's global generator with (SEED, unit), whatever exists: a
        Translator's thread seeds itself at its first sampling call, from the global seed as it
        is then, and another engine of this process (the backward model scoring the unit) may
        have set it since an earlier Translator was made. Scoring and beam search draw nothing:
        they use whichever Translator there is."""
        if seed is not None and self._sampling != (self._unit, seed):
            self._sampling, self._translator = (self._unit, seed), None
        if self._translator is None:
            self._ct2.set_random_seed(_seed_of(seed or 0, self._unit))
            try:
                kind, _, index = self.device_name.partition(":")       # "cuda:1": CTranslate2 wants an index
                self._translator = self._ct2.Translator(self.model_dir, device=kind, device_index=int(index or 0),
                                                        compute_type=self.compute_type, inter_threads=1,
                                                        intra_threads=self.intra_threads)
            except (RuntimeError, ValueError) as exc:
                from models.safety import UnsafeModelError

                raise UnsafeModelError(f"{self.model_dir}: CTranslate2 cannot load it on {self.device_name} with "
                                       f"compute type {self.compute_type} ({str(exc).splitlines()[0][:200]})") from None
        return self._translator

    def describe(self) -> dict:
        return {"engine": "ctranslate2", "family": self.family, "compute_type": self.compute_type,
                "tokenization": self.tokenization.describe(), "fingerprint": self.fingerprint}

    # ---------------------------------------------------------------- tokens
    def source_pieces(self, text: str) -> list[str]:
        return self.tokenization.encode(text, "src")

    def target_pieces(self, text: str) -> list[str]:
        return self.tokenization.encode(text, "tgt")

    def _source_tokens(self, text: str) -> list[str]:
        pieces = self.source_pieces(text)
        if self.family == "fairseq":
            return pieces                               # the converted model appends </s>
        return ([self.src_code] if self.src_code else []) + pieces + ["</s>"]

    def _prefix(self) -> list[str] | None:
        return [self.tgt_code] if self.tgt_code else None

    def _output(self, tokens: list[str]) -> list[str]:
        if self.tgt_code and tokens[:1] == [self.tgt_code]:
            tokens = tokens[1:]
        return [t for t in tokens if t != "</s>"]

    @property
    def max_source_positions(self) -> int:
        return int(self.meta.get("max_source_positions") or 1024)

    @property
    def max_target_positions(self) -> int:
        return int(self.meta.get("max_target_positions") or 1024)

    def _max_len(self, src_len: int) -> int:
        return min(int(self.max_len_a * src_len + self.max_len_b), self.max_target_positions - 1)

    def _hypothesis(self, tokens: list[str], nll: float) -> Hypothesis:
        return Hypothesis(self.tokenization.decode(tokens, "tgt"), tuple(tokens), (), nll)

    # ---------------------------------------------------------------- scoring
    def _score_tokens(self, sources: list[list[str]], targets: list[list[str]]) -> list[float]:
        """Per-token NLL of target TOKENS (pieces, no code, no </s>) given source TOKENS."""
        translator, out = self._get(), []
        prefix = [self.tgt_code] if self.tgt_code else []
        for start in range(0, len(sources), BATCH):
            results = translator.score_batch(sources[start:start + BATCH],
                                             [prefix + t for t in targets[start:start + BATCH]],
                                             offset=1 if prefix else 0)
            out += [-sum(r.log_probs) / max(len(r.log_probs), 1) for r in results]
        return out

    def score(self, sources: list[str], targets: list[str]) -> list[float]:
        with self._lock:
            return self._score_tokens([self._source_tokens(s) for s in sources],
                                      [self.target_pieces(t) for t in targets])

    # ---------------------------------------------------------------- beam search
    def beam_search(self, sources: list[str], beam: int = 12, nbest: int = 1) -> list[list[Hypothesis]]:
        with self._lock:
            tokens = [self._source_tokens(s) for s in sources]
            limits = [self._max_len(len(self.source_pieces(s)) + 1) for s in sources]
            order = sorted(range(len(sources)), key=lambda i: (limits[i], len(tokens[i])))
            outputs: list = [None] * len(sources)
            translator = self._get()
            prefix = self._prefix()
            # A call has one length limit: only sources with the same limit share one, so that a
            # source's hypotheses do not depend on what it is batched with.
            batches = [[i for i in order if limits[i] == limit] for limit in sorted(set(limits))]
            for batch in (b[start:start + BATCH] for b in batches for start in range(0, len(b), BATCH)):
                results = translator.translate_batch([tokens[i] for i in batch],
                                                     target_prefix=[prefix] * len(batch) if prefix else None,
                                                     beam_size=beam, num_hypotheses=nbest,
                                                     suppress_sequences=self._never or None,
                                                     max_decoding_length=limits[batch[0]] + (1 if prefix else 0))
                for i, r in zip(batch, results):
                    outputs[i] = [self._output(h) for h in r.hypotheses]
            flat = [(i, h) for i, hs in enumerate(outputs) for h in hs]
            nll = self._score_tokens([tokens[i] for i, _ in flat], [h for _, h in flat])
            results_out: list[list[Hypothesis]] = [[] for _ in sources]
            for (i, h), n in zip(flat, nll):
                results_out[i].append(self._hypothesis(h, n))
            return results_out

    # ---------------------------------------------------------------- sampling
    def banned_phrases(self, words) -> list[list[str]]:
        """Token sequences to suppress for WORDS: every form and segmentation in the target vocabulary."""
        phrases = []
        for word in words:
            phrases += [list(p) for p in self.tokenization.banned_phrases(word, self._vocabulary)]
        return [list(p) for p in dict.fromkeys(tuple(p) for p in phrases)]

    def sample(self, requests: list[SampleRequest], topk: int = 10, seed: int = 0,
               min_len: int = 1) -> list[list[Hypothesis]]:
        """One call per request with banned words (they apply to it alone), requests without
        batched together (_call_groups), in the given order, from the unit's generator; NLLs by
        forced decoding."""
        with self._lock:
            translator = self._get(seed)
            prefix = self._prefix()
            drawn: list[list[list[str]]] = [[] for _ in requests]
            limits = [self._max_len(len(self.source_pieces(r.source)) + 1) for r in requests]
            for group in _call_groups(requests, limits):
                first = requests[group[0]]
                banned = self._never + (self.banned_phrases(first.banned_words) if first.banned_words else [])
                results = translator.translate_batch(
                    [self._source_tokens(requests[i].source) for i in group],
                    target_prefix=[prefix] * len(group) if prefix else None, beam_size=1, sampling_topk=topk,
                    num_hypotheses=first.num_samples, suppress_sequences=banned or None,
                    max_decoding_length=limits[group[0]] + (1 if prefix else 0),
                    min_decoding_length=min_len + (1 if prefix else 0))
                for i, result in zip(group, results):
                    drawn[i] = [self._output(h) for h in result.hypotheses]
            flat = [(qi, h) for qi, hs in enumerate(drawn) for h in hs]
            distinct = list(dict.fromkeys((requests[qi].source, tuple(h)) for qi, h in flat))
            nll = dict(zip(distinct, self._score_tokens([self._source_tokens(s) for s, _ in distinct],
                                                        [list(h) for _, h in distinct])))
            out: list[list[Hypothesis]] = [[] for _ in requests]
            for qi, h in flat:
                out[qi].append(self._hypothesis(h, nll[(requests[qi].source, tuple(h))]))
            return out
