"""Training a detector: align, build the dictionary and the vectors, sample the synthetic
examples, train each member of the ensemble (cross-entropy, Adam, weights averaged over the last
epoch), tune the threshold on labelled development pairs."""
from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from common.cli import UsageError
from common.text import Vocabulary
from models.bitext.divergence.baselines import BilingualEmbeddings, svd_embeddings
from models.bitext.divergence.config import DivergenceConfig
from models.bitext.divergence.detector import DivergenceDetector
from models.bitext.divergence.lexicon import Dictionary, dictionary_from_counts, link_counts, word_alignments
from models.bitext.divergence.metrics import tune_threshold
from models.bitext.divergence.model import InteractionEnsemble, InteractionModel, member_seed, new_model, \
    share_fixed_tables
from models.bitext.divergence.negatives import Examples, synthetic_examples


@dataclass
class TrainedDivergence:
    """What train_divergence makes: the detector, and the pieces the baselines reuse."""
    detector: DivergenceDetector
    embeddings: BilingualEmbeddings
    dictionary: Dictionary
    report: dict = field(default_factory=dict)


def _set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _length_batches(examples, batch_size: int, rng: random.Random, pool: int = 50) -> list[list[int]]:
    """Shuffled mini-batches of similar lengths: shuffle, sort pools of POOL batches by length,
    cut them into batches, shuffle the batches (little padding, still random)."""
    order = list(range(len(examples)))
    rng.shuffle(order)
    batches = []
    step = batch_size * pool
    for start in range(0, len(order), step):
        chunk = sorted(order[start:start + step], key=lambda i: (len(examples[i][0]), len(examples[i][1])))
        batches += [chunk[k:k + batch_size] for k in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def _progress(total: int, desc: str, enabled: bool):
    import sys

    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="ex", disable=not enabled, mininterval=2.0, file=sys.stderr)


def train_divergence(src_tok: Sequence[Sequence[str]], tgt_tok: Sequence[Sequence[str]],
                     cfg: DivergenceConfig | None = None, dev: Sequence[tuple[str, str, int]] | None = None,
                     alignments=None, heldout: float = 0.02, log: Callable[[str], None] = print) -> TrainedDivergence:
    """Train a detector on a tokenised parallel corpus (SRC_TOK[i] translates TGT_TOK[i]):
    align (unless ALIGNMENTS is given), build the dictionary and the embeddings, sample the
    synthetic examples, train the interaction model with cross-entropy (Adam) for cfg.epochs, and
    tune the threshold on DEV ((src, tgt, label) triples, label 1 = equivalent; without DEV the
    threshold is 0.5). HELDOUT of the positives, with their negatives, are kept out of training
    to report accuracy on unseen synthetic pairs. With cfg.members > 1 the steps from the synthetic
    examples on are repeated for each member's seed (member_seed) on the same alignments,
    dictionary and vectors, and the threshold is tuned on the members' mean P(equivalent)."""
    cfg = cfg or DivergenceConfig()
    cfg.validate()
    _set_seed(cfg.seed)
    t0 = time.time()
    if len(src_tok) != len(tgt_tok):
        raise ValueError(f"{len(src_tok)} source sentences but {len(tgt_tok)} target sentences")
    n_given = len(src_tok)
    kept = [i for i, (s, t) in enumerate(zip(src_tok, tgt_tok)) if s and t]
    pairs = [(list(src_tok[i]), list(tgt_tok[i])) for i in kept]
    if len(pairs) < 2:
        raise UsageError(f"need at least 2 non-empty sentence pairs, got {len(pairs)}")
    src_tok, tgt_tok = [s for s, _ in pairs], [t for _, t in pairs]
    align_s = 0.0
    if alignments is None:
        log(f"aligning {len(pairs)} pairs with {cfg.aligner} ...")
        alignments = word_alignments(src_tok, tgt_tok, cfg.seed, aligner=cfg.aligner)
        align_s = time.time() - t0
    else:                                          # given for the pairs as passed: drop the empty ones too
        if any(len(links) != n_given for links in alignments):
            raise ValueError("alignments must have one row per sentence pair")
        alignments = [[links[i] for i in kept] for links in alignments]
    counts = link_counts(src_tok, tgt_tok, alignments)
    dictionary = dictionary_from_counts(counts, cfg.min_count)
    src_words = Vocabulary.build(Counter(w for s in src_tok for w in s))
    tgt_words = Vocabulary.build(Counter(w for t in tgt_tok for w in t))
    embeddings = svd_embeddings(counts, src_words, tgt_words, cfg.dim, cfg.seed)

    short = [(s, t) for s, t in pairs if len(s) <= cfg.max_train_tokens and len(t) <= cfg.max_train_tokens]
    if len(short) < 2:
        raise UsageError(f"fewer than 2 pairs with at most {cfg.max_train_tokens} tokens a side")
    log(f"dictionary: {sum(map(len, dictionary.src_to_tgt.values()))} word pairs; vocabularies "
        f"{len(src_words)} {cfg.src_lang} / {len(tgt_words)} {cfg.tgt_lang}")
    report = {"pairs": len(pairs), "trained_positives": len(short),
              "dictionary_pairs": sum(map(len, dictionary.src_to_tgt.values())),
              "src_words": len(src_words), "tgt_words": len(tgt_words), "align_seconds": round(align_s, 1),
              "prep_seconds": round(time.time() - t0 - align_s, 1)}
    vectors = (embeddings.src_vectors, embeddings.tgt_vectors) if cfg.embeddings == "svd" else (None, None)
    members, member_reports = [], []
    for k in range(cfg.members):
        member_cfg = replace(cfg, members=1, seed=member_seed(cfg.seed, k))
        if cfg.members > 1:
            log(f"member {k + 1} of {cfg.members} (seed {member_cfg.seed})")
        member = _train_member(src_words, tgt_words, member_cfg, vectors, short, dictionary, heldout, log)
        members.append(member.model)
        member_reports.append(member.extra["training"])
    # member 0's figures at the top, as for a single detector; every member's under 'members'
    report.update(member_reports[0])
    if cfg.members > 1:
        report["members"] = member_reports
    model = members[0] if cfg.members == 1 else share_fixed_tables(InteractionEnsemble(members), cfg)
    det = DivergenceDetector(src_words, tgt_words, cfg, model=model)
    if dev:
        scores = det.score([s for s, _, _ in dev], [t for _, t, _ in dev])
        det.threshold, f = tune_threshold(scores, [y for _, _, y in dev])
        report["dev"] = {"pairs": len(dev), "threshold": det.threshold, "macro_f1": f}
        log(f"threshold {det.threshold:.4f} tuned on {len(dev)} dev pairs"
            + (f" (the mean P(equivalent) of {cfg.members} members)" if cfg.members > 1 else "")
            + f": macro F1 {f:.3f}")
    report["train_seconds"] = round(time.time() - t0, 1)
    det.extra = {"training": report}
    return TrainedDivergence(det, embeddings, dictionary, report)


def _train_member(src_words: Vocabulary, tgt_words: Vocabulary, cfg: DivergenceConfig, vectors, short,
                  dictionary: Dictionary, heldout: float, log: Callable[[str], None]) -> DivergenceDetector:
    """One interaction model trained with cfg.seed: its own synthetic negatives, held-out split,
    initial weights and batch order (an ensemble member differs from the others in all four). The
    detector's extra['training'] says how it went."""
    _set_seed(cfg.seed)
    examples = synthetic_examples(short, dictionary, cfg.negatives_per_positive, cfg.max_length_ratio,
                                  cfg.min_coverage, cfg.seed, cfg.max_tries, cfg.partial_negatives)
    train_ex, held_ex = _split_heldout(examples, heldout, cfg.seed)
    log(f"synthetic data: {examples.stats['positives']} positives, {examples.stats['negatives']} negatives "
        f"({examples.stats['short_positives']} positives short of {cfg.negatives_per_positive}; "
        f"{examples.stats['partial_negatives']} of them partial); "
        f"{len(train_ex)} to train, {len(held_ex)} held out")
    det = DivergenceDetector(src_words, tgt_words, cfg, model=new_model(cfg, len(src_words), len(tgt_words), *vectors))
    optimizers = _optimizers(det.model, cfg.lr)
    mean = WeightMean(det.model)
    rng = random.Random(cfg.seed)
    report = {"seed": cfg.seed, "synthetic": dict(examples.stats), "epochs": []}
    for epoch in range(1, cfg.epochs + 1):
        averaging = epoch > cfg.epochs - cfg.average_epochs
        det.model.train()
        start, losses = time.time(), []
        bar = _progress(len(train_ex), f"epoch {epoch}/{cfg.epochs}", cfg.progress)
        for idx in _length_batches(train_ex, cfg.batch_size, rng):
            batch = [train_ex[i] for i in idx]
            labels = torch.tensor([y for _, _, y in batch], dtype=torch.long, device=det.device)
            loss = F.cross_entropy(det.logits([s for s, _, _ in batch], [t for _, t, _ in batch]), labels)
            for opt in optimizers:
                opt.zero_grad()
            loss.backward()
            for opt in optimizers:
                opt.step()
            if averaging:
                mean.add()
            losses.append(loss.item())
            bar.update(len(idx))
            # drawn at the bar's mininterval, not at every batch (1,800 lines an epoch in a log)
            bar.set_postfix(loss=f"{np.mean(losses[-100:]):.4f}", refresh=False)
        bar.close()
        entry = {"epoch": epoch, "loss": float(np.mean(losses)), "seconds": round(time.time() - start, 1)}
        if held_ex:
            entry["heldout_accuracy"] = _heldout_accuracy(det, held_ex)
        report["epochs"].append(entry)
        log(f"epoch {epoch}: loss {entry['loss']:.4f}, {entry['seconds']:.0f}s"
            + (f", held-out synthetic accuracy {entry['heldout_accuracy']:.3f}" if held_ex else ""))
    if mean.steps:
        mean.copy_to_model()
        report["averaged_steps"] = mean.steps
        if held_ex:
            report["heldout_accuracy"] = _heldout_accuracy(det, held_ex)
        log(f"weights averaged over the last {mean.steps} steps ({cfg.average_epochs} epoch(s))"
            + (f": held-out synthetic accuracy {report['heldout_accuracy']:.3f}" if held_ex else ""))
    det.extra = {"training": report}
    return det


def _heldout_accuracy(det: "DivergenceDetector", held_ex) -> float:
    p = det.score_tokens([s for s, _, _ in held_ex], [t for _, t, _ in held_ex])
    return float(np.mean((p >= 0.5) == np.array([y for _, _, y in held_ex], bool)))


class WeightMean:
    """The running mean of a model's trained weights, one step at a time (stochastic weight
    averaging, Izmailov et al. 2018, with a constant learning rate). Only the parameters that
    train are averaged: the fixed SVD tables are most of the model's size and would be averaged
    to themselves. (torch.optim.swa_utils.AveragedModel copies and averages every parameter.)"""

    def __init__(self, model: nn.Module):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.mean: list[torch.Tensor] = []
        self.steps = 0

    @torch.no_grad()
    def add(self) -> None:
        self.steps += 1
        if self.steps == 1:
            self.mean = [p.detach().clone() for p in self.params]
        else:
            for m, p in zip(self.mean, self.params):
                m.lerp_(p, 1.0 / self.steps)

    @torch.no_grad()
    def copy_to_model(self) -> None:
        for m, p in zip(self.mean, self.params):
            p.copy_(m)


def _optimizers(model: InteractionModel, lr: float) -> list:
    """Adam for the dense weights, SparseAdam for the embedding tables (when trained): dense
    Adam would update all of both tables at every step, the slowest part of a step."""
    tables = [p for p in (model.src_embed.weight, model.tgt_embed.weight) if p.requires_grad]
    dense = [p for n, p in model.named_parameters() if p.requires_grad and not n.endswith("_embed.weight")]
    return [torch.optim.Adam(dense, lr=lr)] + ([torch.optim.SparseAdam(tables, lr=lr)] if tables else [])


def _split_heldout(examples: Examples, fraction: float, seed: int) -> tuple[list, list]:
    """Split by positive: a held-out positive takes its negatives with it (they share its
    source sentence)."""
    groups, cur = [], []
    for ex in examples:
        if ex[2] == 1 and cur:
            groups.append(cur)
            cur = []
        cur.append(ex)
    if cur:
        groups.append(cur)
    n_held = int(len(groups) * fraction) if len(groups) >= 10 else 0
    held_idx = set(random.Random(seed + 7).sample(range(len(groups)), n_held))
    train = [ex for k, g in enumerate(groups) if k not in held_idx for ex in g]
    held = [ex for k, g in enumerate(groups) if k in held_idx for ex in g]
    return train, held
