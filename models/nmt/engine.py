"""The interface the generation job decodes through, whatever runs the model.

An engine is one direction of translation (``src_lang`` -> ``tgt_lang``) loaded from a model
directory (models/nmt/model_files/model_dir.py). The job's steps (paracorpus/steps.py,
paracorpus/paraphrasing.py) use only what is here:

* :meth:`Engine.sample`: top-k samples per request, each request with its own banned words, which
  never appear in its detokenized samples (every form and segmentation of a word is banned);
* :meth:`Engine.beam_search`: n-best by beam search;
* :meth:`Engine.score`: per-token NLL of given targets (natural log, ``</s>`` included: minus
  fairseq's score), the dual-scoring convention presets and thresholds are set in;
* :meth:`Engine.source_pieces` / :meth:`Engine.target_pieces`: the pieces a model sees (length
  limits, clustering), and the positions it allows;
* :meth:`Engine.describe`: what the manifest and the config hash record (engine, members,
  tokenization, precision);
* :meth:`Engine.start_unit`: a work unit starts (per-unit randomness, for engines that need it);
* :meth:`Engine.warm_up`: a process's first calls made on made-up text, before any unit.

Text in and out is plain text: each engine tokenizes and detokenizes (models/nmt/model_files/tokenization.py).
The fairseq engine is models/nmt/engines/fairseq_engine.py; models/nmt/engines/loading.py's ``load_engine`` picks the
engine a model directory names.
"""
from __future__ import annotations

import abc
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class SampleRequest:
    source: str
    key: str                                 # seeds the randomness: pair id + constraint set index
    banned_words: tuple[str, ...] = ()
    num_samples: int = 30


@dataclass(frozen=True)
class Hypothesis:
    text: str                                # detokenized
    pieces: tuple[str, ...]                  # as the model's dictionary has them
    token_ids: tuple[int, ...]               # without the final </s>
    nll: float                               # per-token NLL, </s> included (fairseq's convention)


class Engine(abc.ABC):
    """One direction of translation. Subclasses set src_lang, tgt_lang, device (a torch.device
    or a name), precision and fingerprint."""

    src_lang: str
    tgt_lang: str
    precision: str
    fingerprint: str

    @abc.abstractmethod
    def sample(self, requests: list[SampleRequest], topk: int = 10, seed: int = 0,
               min_len: int = 1) -> list[list[Hypothesis]]:
        """REQUEST.num_samples top-k samples per request, none containing a banned word."""

    @abc.abstractmethod
    def beam_search(self, sources: list[str], beam: int = 12, nbest: int = 1) -> list[list[Hypothesis]]:
        """The NBEST best hypotheses of a beam of BEAM per source, best first."""

    @abc.abstractmethod
    def score(self, sources: list[str], targets: list[str]) -> list[float]:
        """Per-token NLL of each target given its source (natural log, </s> included)."""

    @abc.abstractmethod
    def source_pieces(self, text: str) -> list[str]:
        """TEXT (source language) as the model's pieces."""

    @abc.abstractmethod
    def target_pieces(self, text: str) -> list[str]:
        """TEXT (target language) as the model's pieces."""

    @property
    def device_type(self) -> str:
        """'cpu' or 'cuda': where this engine decodes (recorded per worker in the manifest)."""
        device = getattr(self, "device", "cpu")
        return getattr(device, "type", str(device))

    def pieces(self, text: str) -> list[str]:
        """Target-side pieces: the segmentation Levenshtein clustering compares candidates in."""
        return self.target_pieces(text)

    @property
    @abc.abstractmethod
    def max_source_positions(self) -> int:
        """Longest source, in pieces with </s>, the model takes."""

    @property
    @abc.abstractmethod
    def max_target_positions(self) -> int:
        """Longest output, in pieces with </s>, the model writes."""

    @abc.abstractmethod
    def describe(self) -> dict:
        """What runs this direction: engine, members, tokenization, precision."""

    def start_unit(self, key: str) -> None:
        """A work unit KEY starts: an engine whose randomness cannot be keyed per pair (CTranslate2)
        reseeds here, so that decoding the unit again gives the same samples. The fairseq
        engine's randomness is keyed per pair: nothing to do."""

    def warm_up(self, mode: str = "sample") -> float:
        """Score and decode (MODE: 'sample' or 'beam', as the job will) two short made-up
        sentences; returns the seconds taken. A process's first calls on a GPU load kernels and
        build library handles (a second or more a process), which would otherwise land in the
        first work unit's stage times; on a CPU, oneDNN builds its kernels the same way. Nothing
        is kept: the outputs are dropped and no request or unit state is touched."""
        start = time.perf_counter()
        texts = ["a", "a b c d e f g h"]
        self.score(texts, texts)
        if mode == "beam":
            self.beam_search(texts, beam=2)
        else:
            self.sample([SampleRequest(t, f"warm-up:{i}", (), 3) for i, t in enumerate(texts)], topk=10)
        return time.perf_counter() - start
