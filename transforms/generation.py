"""DoFns around the NMT models: dual cross-entropy filter and paraphrase generation.

The DoFn receives the pairs of one output shard, decodes them in batches, and loads its models
once per worker process in setup(), on the GPU when there is one.
"""
from __future__ import annotations

import apache_beam as beam

from paracorpus.config import GenerationConfig
from paracorpus.paraphrasing import (CleanPair, dual_xent_scores, paraphrase_batch, piece_limits, reject,
                                     split_by_pieces)
from transforms.io import MAIN_TAG, REJECTS_TAG
from transforms.progress import Progress


def _pairs(batch: list[dict]) -> list[CleanPair]:
    return [CleanPair(r["pair_id"], r["input_shard"], r["input_index"], r["source"], r["reference"])
            for r in batch]


class GenerateForShard(beam.DoFn):
    """(output shard, pairs) -> (main, paraphrase row) | (rejects, reject row), decoding in batches.

    Models are loaded once per worker process in setup(). Batches are cut from a GroupByKey result
    rather than by beam.BatchElements: the DaskRunner drops what a DoFn emits in finish_bundle,
    where BatchElements flushes its last batch.
    """

    def __init__(self, forward_model: str, backward_model: str | None, device: str | None, config_hash: str,
                 cfg: GenerationConfig, precision: str = "auto", torch_threads: int | None = None,
                 expected_pairs: int | None = None):
        self.forward_model, self.backward_model = forward_model, backward_model
        self.device, self.config_hash, self.precision = device, config_hash, precision
        self.torch_threads, self.cfg, self.expected_pairs = torch_threads, cfg, expected_pairs

    def setup(self):
        from models.nmt import load_translator

        if self.torch_threads:      # several worker processes share this machine's cores
            import torch

            torch.set_num_threads(self.torch_threads)
        self.forward = load_translator(self.forward_model, device=self.device, precision=self.precision)
        self.backward = (load_translator(self.backward_model, device=self.device, precision=self.precision)
                         if self.backward_model else None)
        self.piece_limits = piece_limits(self.forward, self.backward, self.cfg.max_pieces)
        self.progress = Progress("generate", rate_of="generate_pairs_in", expected=self.expected_pairs)
        self._reported_precision = False

    def process(self, element):
        if not self._reported_precision:     # counters count inside process(), not setup()
            # which device and precision each worker really decoded with, for the run's manifest
            self.progress.inc(f"workers_{self.forward.device.type}_{self.forward.precision}")
            self._reported_precision = True
        _shard, recs = element
        batch = []
        for rec in recs:
            batch.append(rec)
            if len(batch) == self.cfg.batch_pairs:
                yield from self._process_batch(batch)
                batch = []
        if batch:
            yield from self._process_batch(batch)
        self.progress.flush()

    def _process_batch(self, batch: list[dict]):
        self.progress.inc("generate_pairs_in", len(batch))
        pairs = _pairs(sorted(batch, key=lambda r: r["pair_id"]))
        pairs, too_long = split_by_pieces(pairs, self.forward, self.piece_limits, self.config_hash)
        for r in too_long:
            self.progress.inc(f"rejected_{r['reason']}")
            yield (REJECTS_TAG, r)
        if self.cfg.dual_xent_threshold is not None and self.backward is not None:
            scores = dual_xent_scores(pairs, self.forward, self.backward)
            kept = []
            for pair, score in zip(pairs, scores):
                if score > self.cfg.dual_xent_threshold:
                    self.progress.inc("rejected_dual_xent")
                    yield (REJECTS_TAG, reject(
                        pair, "dual_xent", "dual_xent", f"{score:.3f} > {self.cfg.dual_xent_threshold}",
                        self.config_hash))
                else:
                    kept.append(pair)
            pairs = kept
        if not pairs:
            return
        counters: dict = {}
        rows, rejects = paraphrase_batch(pairs, self.forward, self.backward, self.cfg,
                                         self.config_hash, counters)
        for name, n in counters.items():
            self.progress.inc(name, n)
        self.progress.inc("pairs_generated", len(pairs))
        for r in rejects:
            self.progress.inc(f"rejected_{r['reason']}")
            yield (REJECTS_TAG, r)
        for row in rows:
            yield (MAIN_TAG, row)
