"""The classifier: He & Lin's (2016) pairwise word-interaction model (BiLSTM, similarity cube,
focus layer, deep CNN) and an ensemble of such models trained from different seeds."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from models.bitext.divergence.config import DivergenceConfig

N_CHANNELS = 13             # 3 measures x 4 views of the BiLSTM states + the same-string channel


def greedy_matching(sim: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """He & Lin's focus selection: repeatedly take the most similar remaining word pair and drop
    its row and column. Computed batch-wide by rounds: every pair that is the maximum of its row
    and of its column among the remaining ones is one greedy would take (nothing left in its row
    or column beats it), so each round takes all of them at once; the result equals the one-at-a-
    time greedy matching (ties broken by position). SIM, VALID: (B, L1, L2). Returns a bool mask."""
    chosen = torch.zeros_like(valid)
    avail = valid.clone()
    while bool(avail.any()):
        s = sim.masked_fill(~avail, float("-inf"))
        pick = avail & (s == s.amax(2, keepdim=True)) & (s == s.amax(1, keepdim=True))
        pick &= pick.cumsum(2) == 1                        # ties: first in its row,
        pick &= pick.cumsum(1) == 1                        # then first in its column
        if not bool(pick.any()):                           # cannot happen with finite sims; stay safe
            break
        chosen |= pick
        avail &= ~pick.any(2, keepdim=True) & ~pick.any(1, keepdim=True)
    return chosen


class InteractionModel(nn.Module):
    """Pairwise word interactions -> P(equivalent) (He & Lin 2016, as used by Vyas et al. 2018).

    forward(src_ids, src_len, tgt_ids, tgt_len, same) -> logits (B, 2), class 1 = equivalent.
    Padding never changes a pair's output: the BiLSTM runs on packed sequences, the cube is zero
    outside each pair's L1 x L2 region and stays so after every conv (re-masked), max-pools use
    ceil mode over non-negative values, and the last pool is a max over the valid region only."""

    def __init__(self, n_src: int, n_tgt: int, dim: int = 200, hidden: int = 64,
                 channels: Sequence[int] = (16, 32, 64, 64), dense: int = 128, focus_weight: float = 0.1,
                 dropout: float = 0.1, src_vectors: np.ndarray | None = None, tgt_vectors: np.ndarray | None = None,
                 freeze_embeddings: bool = False):
        super().__init__()
        self.hidden, self.focus_weight = hidden, focus_weight
        # sparse gradients: a batch touches a few hundred of the tables' rows (SparseAdam updates those)
        self.src_embed = nn.Embedding(n_src, dim, padding_idx=0, sparse=True)
        self.tgt_embed = nn.Embedding(n_tgt, dim, padding_idx=0, sparse=True)
        for emb, vec in ((self.src_embed, src_vectors), (self.tgt_embed, tgt_vectors)):
            if vec is not None:
                if vec.shape != emb.weight.shape:
                    raise ValueError(f"initial vectors {vec.shape} do not fit the table {tuple(emb.weight.shape)}")
                with torch.no_grad():
                    emb.weight.copy_(torch.as_tensor(vec))
            emb.weight.requires_grad_(not freeze_embeddings)
        self.lstm = nn.LSTM(dim, hidden, batch_first=True, bidirectional=True)
        convs, c_in = [], N_CHANNELS
        for c_out in channels:
            convs.append(nn.Conv2d(c_in, c_out, 3, padding=1))
            c_in = c_out
        self.convs = nn.ModuleList(convs)
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(c_in, dense), nn.ReLU(), nn.Dropout(dropout),
                                  nn.Linear(dense, 2))

    def states(self, embed: nn.Embedding, ids: torch.Tensor, lengths: torch.Tensor):
        """(forward, backward) BiLSTM states (B, L, hidden), zero past each length."""
        packed = nn.utils.rnn.pack_padded_sequence(embed(ids), lengths.cpu().clamp(min=1), batch_first=True,
                                                   enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=ids.shape[1])
        return out[..., :self.hidden], out[..., self.hidden:]

    def cube(self, s_states, t_states, same: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The similarity cube (B, 13, L1, L2) and the cosines of the concatenated and summed views
        (the focus layer's guides). L2 distances are divided by sqrt(2 hidden) and dot products by
        hidden so that every channel is O(1), as the CNN's inputs should be."""
        (sf, sb), (tf, tb) = s_states, t_states
        views = [(sf, tf), (sb, tb), (torch.cat([sf, sb], -1), torch.cat([tf, tb], -1)), (sf + sb, tf + tb)]
        chans, cosines = [], []
        for a, b in views:
            dot = a @ b.transpose(1, 2)
            na, nb = a.norm(dim=-1), b.norm(dim=-1)
            cos = dot / (na.unsqueeze(2) * nb.unsqueeze(1)).clamp(min=1e-8)
            sq = (na.unsqueeze(2) ** 2 + nb.unsqueeze(1) ** 2 - 2 * dot).clamp(min=0)
            l2 = torch.sqrt(sq + 1e-6) / math.sqrt(2 * self.hidden)     # eps: a finite gradient at 0
            chans += [cos, l2, dot / self.hidden]
            cosines.append(cos)
        chans.append(same.to(dot.dtype))
        return torch.stack(chans, 1), cosines[2], cosines[3]

    def forward(self, src_ids, src_len, tgt_ids, tgt_len, same: torch.Tensor | None = None) -> torch.Tensor:
        b, l1, l2 = src_ids.shape[0], src_ids.shape[1], tgt_ids.shape[1]
        valid = (torch.arange(l1, device=src_ids.device)[None, :, None] < src_len.to(src_ids.device)[:, None, None]) & \
                (torch.arange(l2, device=src_ids.device)[None, None, :] < tgt_len.to(src_ids.device)[:, None, None])
        if same is None:
            same = torch.zeros(b, l1, l2, device=src_ids.device)
        cube, cos_bi, cos_add = self.cube(self.states(self.src_embed, src_ids, src_len),
                                          self.states(self.tgt_embed, tgt_ids, tgt_len), same)
        with torch.no_grad():                               # focus: which interactions count fully
            focus = greedy_matching(cos_bi, valid) | greedy_matching(cos_add, valid)
            weight = torch.where(focus, 1.0, self.focus_weight) * valid
        x = cube * weight.unsqueeze(1).to(cube.dtype)
        m = valid.unsqueeze(1).to(x.dtype)
        for conv in self.convs:
            x = F.relu(conv(x)) * m
            x, m = F.max_pool2d(x, 2, ceil_mode=True), F.max_pool2d(m, 2, ceil_mode=True)
        pooled = (x * m).amax(dim=(2, 3))                   # x >= 0, padding 0: max over the valid cells
        return self.head(pooled)


class InteractionEnsemble(nn.Module):
    """Interaction models trained from different seeds on the same data; forward gives the log of
    their mean P(class), in float64 (so P(equivalent) = sigmoid of the difference, as for one model,
    and confident pairs keep their order). With 100 labelled pairs a set a seed moves one model's
    ROC AUC by 0.03-0.08; the mean of five ranked the dev pairs better on average, at the same
    F1 (docs/benchmarks.md). Members with fixed SVD vectors share one pair of tables: the vectors
    are the same for every seed."""

    def __init__(self, members: Sequence[InteractionModel]):
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        self.members = nn.ModuleList(members)

    def forward(self, *inputs) -> torch.Tensor:
        logp = torch.stack([F.log_softmax(m(*inputs).double(), -1) for m in self.members])
        return torch.logsumexp(logp, 0) - math.log(len(self.members))

    @property
    def src_embed(self) -> nn.Embedding:
        return self.members[0].src_embed

    @property
    def tgt_embed(self) -> nn.Embedding:
        return self.members[0].tgt_embed


def member_seed(seed: int, k: int) -> int:
    """The seed of an ensemble's K-th member (0-based): member 0 is the detector that --seed alone
    trains; the others are far from the seeds a user would try next (seed + 1, seed + 2)."""
    return seed + 1000 * k


def new_model(cfg: "DivergenceConfig", n_src: int, n_tgt: int, src_vectors: np.ndarray | None = None,
              tgt_vectors: np.ndarray | None = None) -> nn.Module:
    """The untrained model of CFG: one InteractionModel, or an InteractionEnsemble of cfg.members
    (sharing the word-vector tables when they are fixed)."""
    def one():
        return InteractionModel(n_src, n_tgt, cfg.dim, cfg.hidden, cfg.channels, cfg.dense, cfg.focus_weight,
                                cfg.dropout, src_vectors, tgt_vectors, freeze_embeddings=cfg.freeze_embeddings)
    if cfg.members == 1:
        return one()
    return share_fixed_tables(InteractionEnsemble([one() for _ in range(cfg.members)]), cfg)


def share_fixed_tables(ensemble: InteractionEnsemble, cfg: "DivergenceConfig") -> InteractionEnsemble:
    """Point every member at the first member's word-vector tables when they are fixed (the same
    SVD vectors in all): one copy in memory and in weights.pt."""
    if cfg.freeze_embeddings:
        first = ensemble.members[0]
        for m in ensemble.members[1:]:
            m.src_embed, m.tgt_embed = first.src_embed, first.tgt_embed
    return ensemble
