"""A trained detector: P(equivalent) of sentence pairs and the tuned threshold, and its model
directory: ``src_words.json`` and ``tgt_words.json`` (vocabularies as JSON lists), ``weights.pt``
(a plain state dict of tensors, read weights-only through models.safety.load_tensor_file: nothing
beyond tensors is ever unpickled) and ``config.json`` (sizes, languages, threshold, format
version, checked field by field before anything is built from it), written last: its presence
marks a whole model."""
from __future__ import annotations

import math
import os
from dataclasses import asdict, replace
from typing import Sequence

import numpy as np
import torch
from torch import nn

from common.atomic import write_json, write_text
from common.cli import UsageError
from common.text import Vocabulary
from models.bitext.divergence.config import DivergenceConfig
from models.bitext.divergence.lexicon import tokenize
from models.bitext.divergence.model import InteractionEnsemble, member_seed, new_model
from models.safety import load_tensor_file, save_torch_file

FORMAT_VERSION = 1
FILES = ("config.json", "src_words.json", "tgt_words.json", "weights.pt")


class DivergenceDetector:
    """A trained interaction model with its vocabularies and decision threshold."""

    def __init__(self, src_words: Vocabulary, tgt_words: Vocabulary, cfg: DivergenceConfig,
                 threshold: float = 0.5, model: nn.Module | None = None, extra: dict | None = None):
        self.src_words, self.tgt_words, self.cfg, self.threshold = src_words, tgt_words, cfg, float(threshold)
        self.device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model = (model or new_model(cfg, len(src_words), len(tgt_words))).to(self.device)
        self.extra = dict(extra or {})

    # ---------------------------------------------------------------- tensors
    def batch(self, src_tok: Sequence[Sequence[str]], tgt_tok: Sequence[Sequence[str]]):
        """Model inputs for tokenised pairs (each side cut to max_tokens; an empty side becomes
        one unknown word): ids, lengths and the same-string matrix."""
        cap = self.cfg.max_tokens
        strings: dict[str, int] = {}

        def pad(rows, vocab):
            rows = [list(r[:cap]) for r in rows]
            lengths = torch.tensor([max(1, len(r)) for r in rows], dtype=torch.long)
            ids = torch.full((len(rows), int(lengths.max())), 0, dtype=torch.long)
            sid = torch.full((len(rows), int(lengths.max())), -1, dtype=torch.long)     # -1: matches nothing
            for k, r in enumerate(rows):
                if not r:
                    ids[k, 0] = 1                       # an empty side: one unknown word, same as no string
                    continue
                ids[k, :len(r)] = torch.tensor(vocab.ids(r), dtype=torch.long)
                sid[k, :len(r)] = torch.tensor([strings.setdefault(w, len(strings)) for w in r], dtype=torch.long)
            return ids, lengths, sid
        s_ids, s_len, s_sid = pad(src_tok, self.src_words)
        t_ids, t_len, t_sid = pad(tgt_tok, self.tgt_words)
        same = (s_sid.unsqueeze(2) == t_sid.unsqueeze(1)) & (s_sid.unsqueeze(2) >= 0)
        dev = self.device
        return s_ids.to(dev), s_len, t_ids.to(dev), t_len, same.float().to(dev)

    def member_detectors(self) -> list["DivergenceDetector"]:
        """Each member of an ensemble as a one-model detector with its own seed (sharing this
        detector's vocabularies, threshold and weights); a one-model detector: itself."""
        if not isinstance(self.model, InteractionEnsemble):
            return [self]
        return [DivergenceDetector(self.src_words, self.tgt_words,
                                   replace(self.cfg, members=1, seed=member_seed(self.cfg.seed, k)),
                                   self.threshold, model=m)
                for k, m in enumerate(self.model.members)]

    def logits(self, src_tok, tgt_tok) -> torch.Tensor:
        return self.model(*self.batch(src_tok, tgt_tok))

    # ---------------------------------------------------------------- inference API
    @torch.no_grad()
    def score_tokens(self, src_tok, tgt_tok, batch_size: int = 64) -> np.ndarray:
        """P(equivalent) of pre-tokenised pairs; pairs are sorted by length inside (less padding),
        the output keeps the input order."""
        if len(src_tok) != len(tgt_tok):
            raise ValueError(f"{len(src_tok)} source sentences but {len(tgt_tok)} target sentences")
        was_training = self.model.training
        self.model.eval()
        try:
            order = sorted(range(len(src_tok)), key=lambda i: (len(src_tok[i]), len(tgt_tok[i])))
            out = np.zeros(len(src_tok), dtype=np.float64)
            for start in range(0, len(order), batch_size):
                idx = order[start:start + batch_size]
                logits = self.logits([src_tok[i] for i in idx], [tgt_tok[i] for i in idx])
                # P(equivalent) = sigmoid of the logit difference, in float64: float32 rounds
                # confident pairs to exactly 1.0, and ties lose their order when pairs are ranked
                out[idx] = torch.sigmoid((logits[:, 1] - logits[:, 0]).double()).cpu().numpy()
            return out
        finally:
            self.model.train(was_training)

    def score(self, src_sentences: Sequence[str], tgt_sentences: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Probability that each pair (src_sentences[i], tgt_sentences[i]) is equivalent."""
        cap = self.cfg.max_tokens
        return self.score_tokens([tokenize(s, cap) for s in src_sentences], [tokenize(t, cap) for t in tgt_sentences],
                                 batch_size)

    def divergent(self, src_sentences, tgt_sentences, threshold: float | None = None) -> np.ndarray:
        """True where a pair is predicted divergent: P(equivalent) below the tuned threshold."""
        th = self.threshold if threshold is None else threshold
        return self.score(src_sentences, tgt_sentences) < th

    # ---------------------------------------------------------------- persistence
    def config(self) -> dict:
        cfg = {k: v for k, v in asdict(self.cfg).items() if k not in ("device", "progress")}
        cfg["channels"] = [int(c) for c in self.cfg.channels]
        return {"format_version": FORMAT_VERSION, "kind": "divergence-interaction", "threshold": self.threshold,
                "src_words": len(self.src_words), "tgt_words": len(self.tgt_words), "model": cfg, **self.extra}

    def save(self, path: str) -> None:
        """Write the model directory; each file is renamed into place, config.json last, so a
        reader never takes half a model for a whole one."""
        write_text(os.path.join(path, "src_words.json"), self.src_words.to_json())
        write_text(os.path.join(path, "tgt_words.json"), self.tgt_words.to_json())
        on_cpu: dict[tuple, torch.Tensor] = {}             # a shared table (ensembles) is stored once
        state = {}
        for k, v in self.model.state_dict().items():
            key = (str(v.device), v.data_ptr(), tuple(v.shape), tuple(v.stride()), v.dtype)
            if key not in on_cpu:
                on_cpu[key] = v.detach().cpu()
            state[k] = on_cpu[key]
        save_torch_file(state, os.path.join(path, "weights.pt"))
        write_json(os.path.join(path, "config.json"), self.config())


def _validated_config(cfg, path: str) -> tuple[DivergenceConfig, float, dict]:
    """(model config, threshold, extra fields) of a config.json, or UsageError: only known
    fields of the expected types and ranges reach the model constructor."""
    def bad(why):
        raise UsageError(f"{path}/config.json: {why}")

    if not isinstance(cfg, dict):
        bad("not a JSON object")
    if cfg.get("format_version") != FORMAT_VERSION:
        bad(f"format {cfg.get('format_version')!r}, this code reads {FORMAT_VERSION}")
    th = cfg.get("threshold")
    if isinstance(th, bool) or not isinstance(th, (int, float)) or not math.isfinite(th):
        bad(f"threshold must be a finite number, not {th!r}")
    model = cfg.get("model")
    if not isinstance(model, dict):
        bad("no 'model' object")
    defaults = DivergenceConfig()
    # detectors saved before these fields were trained without them (and as one member)
    kwargs = {"partial_negatives": 0, "average_epochs": 0, "members": 1}
    for name, value in model.items():
        if name not in DivergenceConfig.__dataclass_fields__ or name in ("device", "progress"):
            continue                                   # unknown fields are ignored, never passed on
        want = getattr(defaults, name)
        if name == "channels":
            if not (isinstance(value, list) and 0 < len(value) <= 16 and
                    all(type(c) is int and 0 < c <= 4096 for c in value)):
                bad(f"model.channels must be a list of 1 to 16 positive integers, not {value!r}")
            value = tuple(value)
        elif type(want) is bool:
            if not isinstance(value, bool):
                bad(f"model.{name} must be true or false")
        elif type(want) is int:
            if type(value) is not int or not 0 <= value < 1 << 31:
                bad(f"model.{name} must be a non-negative integer, not {value!r}")
        elif type(want) is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                bad(f"model.{name} must be a finite number, not {value!r}")
            value = float(value)
        elif type(want) is str:
            if not isinstance(value, str) or len(value) > 100:
                bad(f"model.{name} must be a short string")
        kwargs[name] = value
    mc = DivergenceConfig(**kwargs)
    try:
        mc.validate()
    except ValueError as exc:
        bad(str(exc))
    if mc.dim > 4096 or mc.hidden > 4096 or mc.dense > 65536:
        bad("model sizes out of range")
    known = {"format_version", "kind", "threshold", "src_words", "tgt_words", "model"}
    return mc, float(th), {k: v for k, v in cfg.items() if k not in known}


def load_divergence_detector(path: str, device: str | None = None) -> DivergenceDetector:
    """Load a directory written by DivergenceDetector.save (or python -m models.bitext.train_divergence);
    a bucket URL is copied to the local cache first (common.storage.local_copy)."""
    from models.safety import open_model_dir

    path, raw = open_model_dir(path, FILES, "divergence model")
    cfg, threshold, extra = _validated_config(raw, path)
    cfg.device = device
    vocabs = []
    for name in ("src_words.json", "tgt_words.json"):
        try:
            with open(os.path.join(path, name), encoding="utf-8") as f:
                vocabs.append(Vocabulary.from_json(f.read()))
        except (ValueError, UnicodeDecodeError) as exc:
            raise UsageError(f"{path}/{name}: {exc}") from None
    for vocab, key in zip(vocabs, ("src_words", "tgt_words")):
        if raw.get(key) != len(vocab):
            raise UsageError(f"{path}: config says {raw.get(key)} {key}, the vocabulary file has {len(vocab)}")
    det = DivergenceDetector(vocabs[0], vocabs[1], cfg, threshold, extra=extra)
    state = load_tensor_file(os.path.join(path, "weights.pt"))
    try:
        det.model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise UsageError(f"{path}/weights.pt does not fit its config.json ({str(exc).splitlines()[0]})") from None
    det.model.eval()
    return det
