"""A learned similarity: an MLP that says whether two sentence embeddings are a translation pair.

Kim et al. 2019 ("Learning Bilingual Sentence Embeddings via Autoencoding and Computing
Similarities with a Multilayer Perceptron") score a pair (a, b) of source and target embeddings
with a multilayer perceptron instead of a fixed measure: two hidden layers of 512 ReLU units over
the concatenation [a; b], a sigmoid output = the probability that the pair is parallel. It is
trained on clean pairs as positives against one of two kinds of negatives:

* ``negatives="worst"``: the worst-scoring fraction (60% in the paper) of a noisy parallel corpus,
  ranked here by the cosine of the two embeddings (`worst_negatives`);
* ``negatives="random"``: random cross pairs a[i], b[j], j != i (`random_negatives`, seeded).

``features="interaction"`` feeds [a; b; |a - b|; a * b] instead (the InferSent-style features):
not in the paper, a config flag for comparison. The input order matters: a is always the source.

    clf = train_pair_classifier(pos_a, pos_b, *make_negatives("random", pos_a, pos_b), epochs=10)
    clf.save("runs/pair-mlp")
    probs = load_pair_classifier("runs/pair-mlp").score(src_vecs, tgt_vecs)     # (n,) in [0, 1]

Directory: ``config.json`` (sizes, format version; validated on load, written last so that a
directory holding one is whole) and ``weights.pt`` (a plain state dict of tensors, loaded
weights-only through models.safety.load_tensor_file: nothing else is ever unpickled).
"""
from __future__ import annotations

import logging
import os

import numpy as np
import torch
import torch.nn as nn

from models.safety import load_tensor_file, save_torch_file
from common.atomic import write_json
from common.cli import UsageError

FORMAT_VERSION = 1
FILES = ("config.json", "weights.pt")
FEATURES = ("concat", "interaction")      # [a; b] (the paper) | [a; b; |a-b|; a*b]
NEGATIVES = ("worst", "random")
PAIR_FLOATS = 1 << 24                     # hidden activations per block when scoring many pairs

log = logging.getLogger(__name__)


class PairClassifier:
    def __init__(self, dim: int, hidden: int = 512, layers: int = 2, features: str = "concat",
                 device: str | None = None, extra: dict | None = None):
        if features not in FEATURES:
            raise ValueError(f"features must be one of {FEATURES}, not {features!r}")
        self.dim, self.hidden, self.layers, self.features = dim, hidden, layers, features
        self.extra = dict(extra or {})
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        width = (2 if features == "concat" else 4) * dim
        blocks = []
        for _ in range(layers):
            blocks += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        self.module = nn.Sequential(*blocks, nn.Linear(width, 1)).to(self.device)

    # ------------------------------------------------------------------ forward
    def pair_features(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.features == "concat":
            return torch.cat([a, b], dim=-1)
        return torch.cat([a, b, (a - b).abs(), a * b], dim=-1)

    def logits(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """(n,) logits of the pairs (a[i], b[i]), with gradient (training)."""
        return self.module(self.pair_features(a, b)).squeeze(-1)

    def _tensor(self, x) -> torch.Tensor:
        x = np.asarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"expected embeddings of shape (n, {self.dim}), got {x.shape}")
        return torch.from_numpy(np.ascontiguousarray(x)).to(self.device)

    @torch.no_grad()
    def score(self, a, b, batch_size: int = 8192) -> np.ndarray:
        """Probability that (a[i], b[i]) is a parallel pair, for each row i: float32 (n,)."""
        a, b = self._tensor(a), self._tensor(b)
        if a.shape != b.shape:
            raise ValueError(f"pairs need arrays of the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
        self.module.eval()
        out = [torch.sigmoid(self.logits(a[i:i + batch_size], b[i:i + batch_size]))
               for i in range(0, len(a), batch_size)]
        return torch.cat(out).cpu().numpy() if out else np.zeros(0, np.float32)

    @torch.no_grad()
    def score_matrix(self, a, b) -> np.ndarray:
        """(len(a), len(b)) probabilities of every pair (a[i], b[j]). For [a; b] features the first
        layer splits into W_a a + W_b b, computed once per sentence rather than once per pair."""
        a, b = self._tensor(a), self._tensor(b)
        self.module.eval()
        out = torch.empty(len(a), len(b))
        rows = max(1, PAIR_FLOATS // max(1, len(b) * self.hidden))
        if self.features == "concat":
            first, rest = self.module[0], self.module[1:]
            ha = a @ first.weight[:, :self.dim].T + first.bias            # (n_a, hidden)
            hb = b @ first.weight[:, self.dim:].T                          # (n_b, hidden)
            for i in range(0, len(a), rows):
                out[i:i + rows] = rest(ha[i:i + rows, None, :] + hb[None, :, :]).squeeze(-1).cpu()
        else:
            for i in range(0, len(a), rows):
                blk = a[i:i + rows]
                pa = blk[:, None, :].expand(-1, len(b), -1).reshape(-1, self.dim)
                pb = b[None, :, :].expand(len(blk), -1, -1).reshape(-1, self.dim)
                out[i:i + rows] = self.logits(pa, pb).view(len(blk), len(b)).cpu()
        return torch.sigmoid(out).numpy()

    @torch.no_grad()
    def score_candidates(self, queries, base, idx, queries_are_source: bool = True) -> np.ndarray:
        """(n, c) probabilities of the pairs of queries[i] and base[idx[i, j]] (rescoring k-NN
        candidates). The source goes first: (queries[i], base[..]) when QUERIES_ARE_SOURCE, else
        (base[..], queries[i])."""
        idx = np.asarray(idx, dtype=np.int64)
        base = np.asarray(base, dtype=np.float32)
        rows = max(1, PAIR_FLOATS // max(1, idx.shape[1] * self.hidden))
        out = np.empty(idx.shape, dtype=np.float32)
        for i in range(0, len(idx), rows):
            blk = idx[i:i + rows]
            q = np.repeat(np.asarray(queries[i:i + rows], np.float32), blk.shape[1], axis=0)
            pairs = (q, base[blk.ravel()]) if queries_are_source else (base[blk.ravel()], q)
            out[i:i + rows] = self.score(*pairs).reshape(blk.shape)
        return out

    # ------------------------------------------------------------------ persistence
    def config(self) -> dict:
        return {"format_version": FORMAT_VERSION, "kind": "pair_classifier", "dim": self.dim,
                "hidden": self.hidden, "layers": self.layers, "features": self.features, **self.extra}

    def save(self, path: str) -> None:
        """Write the model directory; files are renamed into place, config.json last (it marks a
        whole model)."""
        save_torch_file({k: v.detach().cpu() for k, v in self.module.state_dict().items()},
                        os.path.join(path, "weights.pt"))
        write_json(os.path.join(path, "config.json"), self.config())


# ---------------------------------------------------------------------------- negatives
def worst_negatives(noisy_a, noisy_b, fraction: float = 0.6) -> tuple[np.ndarray, np.ndarray]:
    """The FRACTION of the pairs (noisy_a[i], noisy_b[i]) of a noisy corpus with the lowest cosine:
    the paper's "worst 60%" negatives (pairs a crawl aligned that are most likely wrong)."""
    from models.bitext.similarity import cosine_pairs

    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], not {fraction}")
    cos = cosine_pairs(noisy_a, noisy_b)
    keep = np.argsort(cos, kind="stable")[:max(1, int(round(fraction * len(cos))))]
    return np.asarray(noisy_a, np.float32)[keep], np.asarray(noisy_b, np.float32)[keep]


def random_negatives(a, b, n: int | None = None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """N (default len(a)) random cross pairs (a[i], b[j]) with j != i, from a line-aligned pair of
    arrays: each a[i] is paired with the b of another line (a seeded random shift of a permutation,
    so no pair is its own translation)."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if len(a) != len(b) or len(a) < 2:
        raise ValueError("random negatives need two line-aligned arrays of at least 2 rows")
    rng = np.random.default_rng(seed)
    n = len(a) if n is None else n
    i = rng.integers(0, len(a), n)
    j = (i + rng.integers(1, len(a), n)) % len(a)           # never i itself
    return a[i], b[j]


def make_negatives(kind: str, a, b, fraction: float = 0.6, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Negatives of KIND: "worst" takes A, B as a noisy corpus, "random" as clean pairs to cross."""
    if kind == "worst":
        return worst_negatives(a, b, fraction)
    if kind == "random":
        return random_negatives(a, b, seed=seed)
    raise ValueError(f"negatives must be one of {NEGATIVES}, not {kind!r}")


# ---------------------------------------------------------------------------- training
def train_pair_classifier(pos_a, pos_b, neg_a, neg_b, epochs: int = 10, lr: float = 1e-3, seed: int = 0,
                          batch_size: int = 128, hidden: int = 512, layers: int = 2, features: str = "concat",
                          weight_decay: float = 0.0, device: str | None = None, extra: dict | None = None
                          ) -> PairClassifier:
    """Adam on binary cross-entropy, positives (label 1) against negatives (label 0). The positive
    class is weighted by n_neg / n_pos so that both count equally whatever their sizes (the worst-60%
    negatives are rarely as many as the clean pairs). Deterministic for a SEED on CPU; the global
    torch random state is left as it was."""
    pos_a, pos_b, neg_a, neg_b = (np.asarray(x, np.float32) for x in (pos_a, pos_b, neg_a, neg_b))
    if len(pos_a) == 0 or len(neg_a) == 0:
        raise ValueError("training needs at least one positive and one negative pair")
    if pos_a.shape != pos_b.shape or neg_a.shape != neg_b.shape or pos_a.shape[1] != neg_a.shape[1]:
        raise ValueError(f"mismatched shapes: positives {pos_a.shape}/{pos_b.shape}, negatives "
                         f"{neg_a.shape}/{neg_b.shape}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        clf = PairClassifier(pos_a.shape[1], hidden, layers, features, device, extra)
    dev = clf.device
    a = torch.from_numpy(np.concatenate([pos_a, neg_a])).to(dev)
    b = torch.from_numpy(np.concatenate([pos_b, neg_b])).to(dev)
    y = torch.cat([torch.ones(len(pos_a)), torch.zeros(len(neg_a))]).to(dev)
    loss_fn = nn.BCEWithLogitsLoss(pos_weight=torch.tensor(len(neg_a) / len(pos_a), device=dev))
    opt = torch.optim.Adam(clf.module.parameters(), lr=lr, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(seed)
    clf.module.train()
    for epoch in range(epochs):
        order = torch.randperm(len(y), generator=gen).to(dev)
        total = 0.0
        for start in range(0, len(y), batch_size):
            idx = order[start:start + batch_size]
            loss = loss_fn(clf.logits(a[idx], b[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        log.info("pair classifier epoch %d/%d: loss %.4f", epoch + 1, epochs, total / len(y))
    clf.module.eval()
    return clf


# ---------------------------------------------------------------------------- loading
def _positive_int(cfg: dict, key: str, path: str) -> int:
    value = cfg.get(key)
    if type(value) is not int or not 0 < value <= 1 << 20:
        raise UsageError(f"{path}: config.json field {key!r} must be a positive integer, not {value!r}")
    return value


def validate_config(cfg, path: str = "config.json") -> dict:
    """The fields a PairClassifier is built from, checked; UsageError on anything else."""
    if not isinstance(cfg, dict):
        raise UsageError(f"{path}: config.json is not a JSON object")
    if cfg.get("format_version") != FORMAT_VERSION:
        raise UsageError(f"{path}: pair classifier format {cfg.get('format_version')!r}, this code reads "
                         f"{FORMAT_VERSION}")
    if cfg.get("kind", "pair_classifier") != "pair_classifier":
        raise UsageError(f"{path}: config.json describes a {cfg.get('kind')!r}, not a pair classifier")
    if cfg.get("features") not in FEATURES:
        raise UsageError(f"{path}: config.json field 'features' must be one of {list(FEATURES)}, "
                         f"not {cfg.get('features')!r}")
    layers = cfg.get("layers")
    if type(layers) is not int or not 1 <= layers <= 16:
        raise UsageError(f"{path}: config.json field 'layers' must be an integer from 1 to 16, not {layers!r}")
    return {"dim": _positive_int(cfg, "dim", path), "hidden": _positive_int(cfg, "hidden", path),
            "layers": layers, "features": cfg["features"]}


def load_pair_classifier(path: str, device: str | None = None) -> PairClassifier:
    """Load a directory written by PairClassifier.save; a bucket URL is copied to the local cache
    first. The weights must be exactly the tensors the config describes."""
    from models.safety import open_model_dir

    path, cfg = open_model_dir(path, FILES, "pair classifier")
    known = validate_config(cfg, path)
    clf = PairClassifier(**known, device=device,
                         extra={k: v for k, v in cfg.items() if k not in {*known, "format_version", "kind"}})
    state = load_tensor_file(os.path.join(path, "weights.pt"))
    expected = {k: tuple(v.shape) for k, v in clf.module.state_dict().items()}
    found = {k: tuple(v.shape) for k, v in state.items()}
    if found != expected:
        wrong = sorted(k for k in expected.keys() | found.keys() if expected.get(k) != found.get(k))
        raise UsageError(f"{path}: weights.pt does not match config.json (tensors missing, extra or of "
                         f"another shape: {', '.join(wrong[:5])}{' ...' if len(wrong) > 5 else ''})")
    clf.module.load_state_dict(state)
    clf.module.eval()
    return clf
