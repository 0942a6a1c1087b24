"""Beam search by fairseq's own SequenceGenerator, each source with its own length limit.

SequenceGenerator takes one length limit for a batch, ``max_len_a x src_tokens.size(1) +
max_len_b``: from the *padded* source length, so a source's output could depend on the longest
source it was batched with (a hypothesis that runs to the limit gets more steps beside a long
source). :class:`OwnLimitEnsemble` is fairseq's EnsembleModel with a limit per source: a row at
its source's own limit may only write ``</s>``, exactly as fairseq forces it at the batch's limit,
and the limits follow the rows through fairseq's reorders. The batch's limit (the largest) only
sizes fairseq's buffers, so each source's hypotheses are those it gets decoded alone.
"""
from __future__ import annotations

import torch
from fairseq.sequence_generator import EnsembleModel, SequenceGenerator


class OwnLimitEnsemble(EnsembleModel):
    """fairseq's EnsembleModel (members combined as fairseq combines them) whose rows end at
    LIMITS (one per source of the batch, in pieces, as SequenceGenerator computes its own)."""

    def __init__(self, models, limits: torch.Tensor, eos: int):
        super().__init__(models)
        self.limits, self.eos = limits, eos

    def reorder_encoder_out(self, encoder_outs, new_order):
        # Called with every reorder of the rows (beams expanded, beams chosen, sentences done).
        self.limits = self.limits.index_select(0, new_order)
        return super().reorder_encoder_out(encoder_outs, new_order)

    def forward_decoder(self, tokens, encoder_outs, incremental_states, temperature: float = 1.0):
        lprobs, attn = super().forward_decoder(tokens, encoder_outs, incremental_states, temperature)
        step = tokens.size(1) - 1
        not_eos = torch.ones(lprobs.shape[1], dtype=torch.bool, device=lprobs.device)
        not_eos[self.eos] = False
        ended = (self.limits <= step)[:, None] & not_eos[None, :]
        return lprobs.masked_fill(ended, float("-inf")), attn


def beam_generator(models, tgt_dict, limits: torch.Tensor, beam: int, max_len_a: float,
                   max_len_b: int) -> SequenceGenerator:
    """fairseq's SequenceGenerator over MODELS for one batch whose sources end at LIMITS."""
    return SequenceGenerator(OwnLimitEnsemble(models, limits, tgt_dict.eos()), tgt_dict, beam_size=beam,
                             max_len_a=max_len_a, max_len_b=max_len_b, normalize_scores=True, unk_penalty=0.0)


__all__ = ["OwnLimitEnsemble", "beam_generator"]
