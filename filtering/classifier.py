"""Reference-vs-back-translation classifier (Wieting, Mallinson & Gimpel 2017, §4): how likely a
sentence is a human reference rather than machine output. The paraphrase's P(reference) is the
filter score (fluent, human-like paraphrases score high).

Two variants over the embedding job's encoders: ``word`` (word averaging) and ``lstm`` (average
of LSTM states), each followed by a logistic layer. Saved as an encoder directory
(models/sentence/sentence_encoder.py) plus ``head.pt`` (a state dict, loaded with weights_only=True).
"""
from __future__ import annotations

import os
import random

import numpy as np
import torch

from models.safety import load_tensor_file, save_torch_file
from models.sentence.sentence_encoder import SentenceEncoder, load_encoder


class ReferenceClassifier:
    def __init__(self, encoder: SentenceEncoder, head: torch.nn.Linear | None = None):
        self.encoder = encoder
        self.head = (head or torch.nn.Linear(encoder.out_dim, 1)).to(encoder.device)

    def logits(self, token_lists) -> torch.Tensor:
        return self.head(self.encoder.embed_tokens(token_lists)).squeeze(-1)

    @torch.no_grad()
    def p_reference(self, sentences, batch_size: int = 512) -> np.ndarray:
        self.encoder.module.eval()
        toks = [self.encoder.tokenize(s or "") for s in sentences]
        out = np.zeros(len(toks), dtype=np.float64)
        order = sorted(range(len(toks)), key=lambda i: len(toks[i]))
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            out[idx] = torch.sigmoid(self.logits([toks[i] for i in idx])).double().cpu().numpy()
        return out

    def save(self, path: str) -> None:
        self.encoder.save(path)
        save_torch_file({k: v.detach().cpu() for k, v in self.head.state_dict().items()}, os.path.join(path, "head.pt"))


def load_classifier(path: str) -> ReferenceClassifier:
    enc = load_encoder(path)
    head = torch.nn.Linear(enc.out_dim, 1)
    head.load_state_dict(load_tensor_file(os.path.join(path, "head.pt")))
    clf = ReferenceClassifier(enc, head)
    clf.head.eval()
    return clf


def train_classifier(references, translations, variant: str, out: str, epochs: int = 3, dim: int = 100,
                     batch_size: int = 64, lr: float = 5e-3, seed: int = 1, held_out: float = 0.1) -> float:
    """Train on REFERENCES (label 1) vs TRANSLATIONS (label 0), deduplicated; save to OUT and return
    the balanced accuracy (mean of the two classes' recall) on a held-out tenth. A pair has one
    reference and several paraphrases, so the classes are weighted to count equally: plain
    accuracy would reward always answering "translation"."""
    if variant not in ("word", "lstm"):
        raise ValueError(f"classifier variant must be word or lstm, got {variant!r}")
    refs = sorted({s for s in references if s})
    trans = sorted({s for s in translations if s} - set(refs))   # a paraphrase equal to a reference is no evidence
    data = [(s, 1.0) for s in refs] + [(s, 0.0) for s in trans]
    if len(refs) < 2 or len(trans) < 2:
        raise ValueError("the classifier needs at least 2 references and 2 distinct translations")
    rng = random.Random(seed)
    rng.shuffle(data)
    n_test = max(1, int(len(data) * held_out))
    test, train = data[:n_test], data[n_test:]
    torch.manual_seed(seed)
    enc = SentenceEncoder.from_corpus(variant, (s for s, _ in train), dim=dim, device="cpu")
    clf = ReferenceClassifier(enc)
    params = list(enc.module.parameters()) + list(clf.head.parameters())
    opt = torch.optim.Adam(params, lr=lr)
    n_pos = sum(y for _, y in train)
    pos_weight = torch.tensor((len(train) - n_pos) / max(n_pos, 1.0))
    loss_fn = torch.nn.BCEWithLogitsLoss(pos_weight=pos_weight)
    for _ in range(epochs):
        rng.shuffle(train)
        enc.module.train()
        for i in range(0, len(train), batch_size):
            chunk = train[i:i + batch_size]
            logits = clf.logits([enc.tokenize(s) for s, _ in chunk])
            loss = loss_fn(logits, torch.tensor([y for _, y in chunk], device=logits.device))
            opt.zero_grad()
            loss.backward()
            opt.step()
    p = clf.p_reference([s for s, _ in test])
    truth = np.array([y == 1.0 for _, y in test])
    hit = (p >= 0.5) == truth
    acc = float(np.mean([hit[truth == c].mean() for c in (True, False) if (truth == c).any()]))
    clf.save(out)
    return acc
