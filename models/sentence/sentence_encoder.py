"""A trained sentence encoder as one directory, and the API other jobs use.

    enc = load_encoder("runs/enc-word-trigram")
    vectors = enc.encode(["a man is playing a guitar .", "someone plays guitar ."])  # numpy (2, dim)

Directory layout: ``config.json`` (encoder spec, sizes, format version), ``words.json`` and
``trigrams.json`` (vocabularies as JSON lists) and ``weights.pt`` (a plain state dict of tensors,
loaded with ``torch.load(weights_only=True)`` through models.safety.load_tensor_file: nothing
beyond tensors is ever unpickled).
"""
from __future__ import annotations

import json
import os
from collections import Counter
from typing import Iterable, Sequence

import numpy as np
import torch

from common.text import MAX_TOKENS, Vocabulary, sentence_trigrams, tokenize
from models.safety import load_tensor_file, save_torch_file
from models.sentence.encoders import Features, build_module, parse_spec
from common.atomic import write_json, write_text

FORMAT_VERSION = 1
FILES = ("config.json", "words.json", "trigrams.json", "weights.pt")


class SentenceEncoder:
    def __init__(self, spec: str, words: Vocabulary, trigrams: Vocabulary, dim: int = 300,
                 hidden: int | None = None, max_tokens: int = MAX_TOKENS, device: str | None = None,
                 module: torch.nn.Module | None = None, extra: dict | None = None):
        parse_spec(spec)
        self.spec, self.words, self.trigrams, self.dim, self.hidden = spec, words, trigrams, dim, hidden
        self.max_tokens = max_tokens
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.module = (module or build_module(spec, len(words), len(trigrams), dim, hidden)).to(self.device)
        self.extra = dict(extra or {})

    @classmethod
    def from_corpus(cls, spec: str, sentences: Iterable[str], min_count: int = 1, min_trigram_count: int = 1,
                    max_words: int | None = None, **kwargs) -> "SentenceEncoder":
        """Vocabularies built from SENTENCES in one streaming pass (word and trigram counts)."""
        words, trigrams = Counter(), Counter()
        for s in sentences:
            toks = tokenize(s, kwargs.get("max_tokens", MAX_TOKENS))
            words.update(toks)
            trigrams.update(sentence_trigrams(toks))
        return cls(spec, Vocabulary.build(words, min_count, max_words), Vocabulary.build(trigrams, min_trigram_count),
                   **kwargs)

    @property
    def out_dim(self) -> int:
        return self.module.out_dim

    # ------------------------------------------------------------------ features
    def tokenize(self, sentence: str) -> list[str]:
        return tokenize(sentence, self.max_tokens)

    def features(self, token_lists: Sequence[list[str]]) -> Features:
        """Tensors for pre-tokenised sentences (training scrambles tokens before this step)."""
        word_rows, tri_ids, offsets = [], [], []
        for toks in token_lists:
            toks = toks[:self.max_tokens] or ["<unk>"]
            word_rows.append(self.words.ids(toks))
            offsets.append(len(tri_ids))
            tri_ids.extend(self.trigrams.ids(sentence_trigrams(toks)) or [1])
        lengths = torch.tensor([len(r) for r in word_rows], dtype=torch.long)
        padded = torch.zeros(len(word_rows), int(lengths.max()) if word_rows else 0, dtype=torch.long)
        for i, r in enumerate(word_rows):
            padded[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        return Features(padded, lengths, torch.tensor(tri_ids, dtype=torch.long),
                        torch.tensor(offsets, dtype=torch.long)).to(self.device)

    def embed_tokens(self, token_lists: Sequence[list[str]]) -> torch.Tensor:
        """(B, out_dim) tensor with gradient (training)."""
        return self.module(self.features(token_lists))

    # ------------------------------------------------------------------ inference API
    @torch.no_grad()
    def encode(self, sentences: Sequence[str], batch_size: int = 512) -> np.ndarray:
        """float32 array (len(sentences), out_dim). Sentences are sorted by length inside so
        recurrent encoders pad little; the output keeps the input order."""
        was_training = self.module.training
        self.module.eval()
        try:
            toks = [self.tokenize(s if isinstance(s, str) else "") for s in sentences]
            order = sorted(range(len(toks)), key=lambda i: len(toks[i]))
            out = np.zeros((len(toks), self.out_dim), dtype=np.float32)
            for start in range(0, len(order), batch_size):
                idx = order[start:start + batch_size]
                out[idx] = self.embed_tokens([toks[i] for i in idx]).float().cpu().numpy()
            return out
        finally:
            self.module.train(was_training)

    def similarity(self, s1: Sequence[str], s2: Sequence[str], batch_size: int = 512) -> np.ndarray:
        """Cosine similarity of each pair (s1[i], s2[i])."""
        a, b = self.encode(s1, batch_size), self.encode(s2, batch_size)
        return cosine_rows(a, b)

    # ------------------------------------------------------------------ persistence
    def config(self) -> dict:
        return {"format_version": FORMAT_VERSION, "spec": self.spec, "dim": self.dim, "hidden": self.hidden,
                "max_tokens": self.max_tokens, "out_dim": self.out_dim, "words": len(self.words),
                "trigrams": len(self.trigrams), **self.extra}

    def save(self, path: str) -> None:
        """Write the model directory; files are renamed into place so a reader never sees half a model."""
        write_text(os.path.join(path, "words.json"), self.words.to_json())
        write_text(os.path.join(path, "trigrams.json"), self.trigrams.to_json())
        save_torch_file({k: v.detach().cpu() for k, v in self.module.state_dict().items()},
                        os.path.join(path, "weights.pt"))
        write_json(os.path.join(path, "config.json"), self.config())   # last: marks a whole model


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    na = np.linalg.norm(a, axis=1)
    nb = np.linalg.norm(b, axis=1)
    # clipped: float rounding puts identical sentences a hair above 1
    return np.clip((a * b).sum(1) / np.maximum(na * nb, 1e-12), -1.0, 1.0)


def load_encoder(path: str, device: str | None = None) -> SentenceEncoder:
    """Load a directory written by SentenceEncoder.save (or by python -m embeddings.train); a
    bucket URL is copied to the local cache first (common.storage.local_copy)."""
    from common import storage

    if storage.is_url(path) and storage.isdir(path):
        path = storage.local_copy(path)
    missing = [f for f in FILES if not os.path.isfile(os.path.join(path, f))]
    if missing:
        raise FileNotFoundError(f"{path} is not an encoder directory: missing {', '.join(missing)}")
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    if cfg.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: encoder format {cfg.get('format_version')!r}, this code reads {FORMAT_VERSION}")
    with open(os.path.join(path, "words.json"), encoding="utf-8") as f:
        words = Vocabulary.from_json(f.read())
    with open(os.path.join(path, "trigrams.json"), encoding="utf-8") as f:
        trigrams = Vocabulary.from_json(f.read())
    known = {"format_version", "spec", "dim", "hidden", "max_tokens", "out_dim", "words", "trigrams"}
    enc = SentenceEncoder(cfg["spec"], words, trigrams, dim=cfg["dim"], hidden=cfg.get("hidden"),
                          max_tokens=cfg.get("max_tokens", MAX_TOKENS), device=device,
                          extra={k: v for k, v in cfg.items() if k not in known})
    enc.module.load_state_dict(load_tensor_file(os.path.join(path, "weights.pt")))
    enc.module.eval()
    return enc
