"""From cleaned pairs to paraphrase rows: back-translate, dual-score, cluster, select.

This is the per-pair algorithm of the generation job as plain functions; paracorpus/steps.py wraps
:func:`paraphrase_batch` as the job's last step. A benchmark or a notebook can call it directly
with two :class:`models.nmt.Translator` objects.
"""
from __future__ import annotations

import math
import time
import unicodedata
from contextlib import contextmanager
from dataclasses import dataclass

from common.steps import Rejected
from paracorpus.cleaning import CleanPair
from paracorpus.clustering import cluster_candidates
from paracorpus.config import GenerationConfig
from paracorpus.constraints import draw_constraint_sets
from paracorpus.schema import paraphrase_row


@dataclass
class Candidate:
    text: str
    forward_nll: float
    set_id: int
    banned: tuple
    backward_nll: float | None = None

    @property
    def combined(self) -> float:
        if self.backward_nll is None:
            return self.forward_nll
        return 0.5 * (self.forward_nll + self.backward_nll)


def _words(text: str) -> set[str]:
    out = set()
    for tok in text.split():
        word = "".join(ch for ch in tok if not unicodedata.category(ch).startswith("P")).lower()
        if word:
            out.add(word)
    return out


def violates(text: str, banned: tuple) -> bool:
    """Whole-word check after decoding: a banned word spelled with other pieces still counts."""
    return bool(banned) and not _words(text).isdisjoint(w.lower() for w in banned)


def piece_limits(forward, backward, max_pieces: int) -> tuple[int, int]:
    """(foreign, English) pieces per side a pair may have: MAX_PIECES, and no more than the
    positions of every model that reads or writes that side allow (one position is </s>)."""
    src = [max_pieces, forward.max_source_positions - 1]
    tgt = [max_pieces, forward.max_target_positions - 1]
    if backward is not None:        # backward reads the English side and forced-decodes the foreign one
        src.append(backward.max_target_positions - 1)
        tgt.append(backward.max_source_positions - 1)
    return min(src), min(tgt)


@contextmanager
def timed(counters: dict, stage: str):
    """Add the block's wall time to COUNTERS["ms_" + STAGE] (milliseconds: Beam counters are
    integers): where a worker's time goes, summed over units in the run's manifest."""
    start = time.perf_counter()
    try:
        yield
    finally:
        key = f"ms_{stage}"
        counters[key] = counters.get(key, 0) + round((time.perf_counter() - start) * 1000)


def _candidates(pairs: list[CleanPair], forward, cfg: GenerationConfig, counters: dict):
    """Decode; return per pair a dict text -> best Candidate (distinct texts only)."""
    from models.nmt.engine import SampleRequest

    per_pair: list[dict[str, Candidate]] = [{} for _ in pairs]
    if cfg.mode == "sample":
        requests, owners = [], []
        with timed(counters, "constraints"):
            for pi, p in enumerate(pairs):
                sets = draw_constraint_sets(p.reference, cfg.num_sets, cfg.seed, p.pair_id, cfg.max_banned_words)
                for si, words in enumerate(sets):
                    requests.append(SampleRequest(p.source, f"{p.pair_id}:{si}", words, cfg.num_samples))
                    owners.append((pi, si, words))
        with timed(counters, "sample"):
            hyps = forward.sample(requests, topk=cfg.topk, seed=cfg.seed)
        flat = [(owner, h) for owner, hs in zip(owners, hyps) for h in hs]
    else:
        with timed(counters, "beam_search"):
            hyps = forward.beam_search([p.source for p in pairs], beam=cfg.beam, nbest=cfg.nbest)
        flat = [((pi, -1, ()), h) for pi, hs in enumerate(hyps) for h in hs]
    with timed(counters, "candidates"):
        _collect(flat, per_pair, counters)
    return per_pair


def _collect(flat, per_pair: list[dict], counters: dict) -> None:
    """Each pair's distinct, non-empty candidates that keep its constraints, at their best score."""
    for (pi, si, words), h in flat:
        counters["candidates_decoded"] = counters.get("candidates_decoded", 0) + 1
        text = h.text.strip()
        if not text:
            counters["candidates_empty"] = counters.get("candidates_empty", 0) + 1
            continue
        if violates(text, words):
            counters["candidates_constraint_violation"] = counters.get("candidates_constraint_violation", 0) + 1
            continue
        old = per_pair[pi].get(text)
        if old is None or h.nll < old.forward_nll:
            per_pair[pi][text] = Candidate(text, h.nll, si, words)


def paraphrase_batch(pairs: list[CleanPair], forward, backward, cfg: GenerationConfig,
                     config_hash: str, counters: dict | None = None) -> tuple[list[dict], list[Rejected]]:
    """Paraphrase rows (schema.PARAPHRASE_COLUMNS) and the pairs that got none (Rejected, stage
    'generate') for a batch of pairs."""
    counters = {} if counters is None else counters
    per_pair = _candidates(pairs, forward, cfg, counters)
    if backward is not None:
        # Backward model (en->cs): the candidate is its input, the foreign source its forced output.
        english, foreign, owners = [], [], []
        for pi, cands in enumerate(per_pair):
            for c in cands.values():
                english.append(c.text)
                foreign.append(pairs[pi].source)
                owners.append(c)
        with timed(counters, "score"):
            scores = backward.score(english, foreign) if english else []
        for c, nll in zip(owners, scores):
            c.backward_nll = nll
    with timed(counters, "cluster"):
        rows, rejects = _select(pairs, per_pair, forward, cfg, config_hash, counters)
    return rows, rejects


def _select(pairs, per_pair, forward, cfg: GenerationConfig, config_hash: str, counters: dict):
    """Each pair's surviving candidates clustered, the best of each cluster as rows (or a reject)."""
    rows, rejects = [], []
    for p, cands in zip(pairs, per_pair):
        cands = list(cands.values())
        surviving = [c for c in cands if math.isfinite(c.combined)
                     and (cfg.score_threshold is None or c.combined <= cfg.score_threshold)]
        if not surviving:
            best = min((c.combined for c in cands), default=float("nan"))
            rejects.append(Rejected(p, "generate", "no_candidates",
                                    f"{len(cands)} candidates, best combined score {best:.3f}"))
            continue
        if cfg.mode == "beam" and cfg.nbest == 1:
            chosen = [(surviving[0], 1, 1)]
        else:
            result = cluster_candidates(p.reference, [c.text for c in surviving],
                                        [c.combined for c in surviving], k=cfg.clusters, n=cfg.keep,
                                        segment=forward.pieces)
            chosen = [(surviving[i], result.cluster_of[i], result.cluster_sizes[result.cluster_of[i]])
                      for i in result.selected]
        if not chosen:
            rejects.append(Rejected(p, "generate", "no_paraphrase",
                                    f"all {len(surviving)} surviving candidates in the reference cluster"))
            continue
        for rank, (c, cluster_id, size) in enumerate(chosen, 1):
            rows.append(paraphrase_row(
                pair_id=p.pair_id, src_lang=forward.src_lang, tgt_lang=forward.tgt_lang,
                source=p.source, reference=p.reference, paraphrase=c.text, rank=rank,
                cluster_id=int(cluster_id), cluster_size=int(size),
                forward_nll=c.forward_nll, backward_nll=c.backward_nll,
                combined_score=c.combined, constraint_set=list(c.banned),
                constraint_set_id=c.set_id, num_sampled=len(cands),
                num_surviving=len(surviving), mode=cfg.mode, config_hash=config_hash,
                input_shard=p.input_shard, input_index=p.input_index))
        counters["paraphrases"] = counters.get("paraphrases", 0) + len(chosen)
    return rows, rejects
