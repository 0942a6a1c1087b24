"""Train a semantic-divergence detector on a parallel corpus, without labels (Vyas et al. 2018).

    paragen-train-divergence --src corpus.en --tgt corpus.fr --src_lang en --tgt_lang fr \
        --output runs/divergence-en-fr --dev ../shared/data/divergence/commoncrawl.dev.tsv

The pairs are word-aligned in both directions (fast_align's model, deterministic: the same data
and --seed give the same detector; --aligner agreement for both directions trained together, also
deterministic; --aligner eflomal for eflomal, which cannot be seeded); every
aligned word pair goes into a bilingual dictionary; each pair is a positive and is given 5
negatives, cross pairs whose length ratio is at most 2 and of which at least half the words of
each side have a translation in the other; a pairwise word-interaction model
(models/bitext/divergence.py) learns to tell them apart. With
--dev (tab-separated, header 'english french label ...', label 1 = equivalent) the decision
threshold is tuned for macro F1 on those pairs; without, it is 0.5. With --members K the model is
trained K times, from seeds --seed, --seed + 1000, ... (each its own negatives, weights and batch
order, on the same alignments), and the detector scores a pair by the mean of the K models'
P(equivalent), the threshold tuned on that mean: one seed's detector is a draw from a wide spread;
two (the default) met commoncrawl F1 >= 80 and ROC AUC >= 0.886 in every seed of five, one member
in two (docs/benchmarks.md). OUT loads with
models.bitext.divergence.load_divergence_detector.

Tune on labelled pairs like the bitext the detector will judge: a threshold moves with the domain
(docs/bitext-models.md). For your own data, label a few hundred of its pairs (equivalent or not)
and pass them; the documented figures tuned on ../shared/data/divergence/commoncrawl.dev.tsv and
report opensubs.dev.tsv as a second domain.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time

import torch

from models.bitext.divergence import (ALIGNERS, MAX_MEMBERS, DivergenceConfig, read_dev_tsv, tokenize,
                                      train_divergence)
from common import storage
from common.cli import UsageError, check_output_location, configure_logging


def read_lines(path: str, limit: int | None = None) -> list[str]:
    """The lines of a text file (.gz ok, local or a bucket URL), without line ends."""
    if not storage.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    with storage.open_input(path) as raw:
        data = raw.read()
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines if limit is None else lines[:limit]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="paragen-train-divergence", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    ap.add_argument("--src", required=True, metavar="FILE", help="source side, one sentence a line (.gz ok) (required)")
    ap.add_argument("--tgt", required=True, metavar="FILE", help="target side, line-aligned with --src (required)")
    ap.add_argument("--src_lang", required=True, help="source language code, e.g. en (required)")
    ap.add_argument("--tgt_lang", required=True, help="target language code, e.g. fr (required)")
    ap.add_argument("--output", required=True, metavar="DIR", help="model directory to write (required)")
    ap.add_argument("--overwrite", action="store_true", help="replace a model already in --output (default: refuse)")
    ap.add_argument("--dev", nargs="+", action="extend", default=[], metavar="TSV",
                    help="labelled pairs to tune the threshold on (english<TAB>french<TAB>label ...; several "
                         "files are pooled), from the domain the detector will judge: a few hundred of your own "
                         "pairs, labelled (default: threshold 0.5)")
    ap.add_argument("--max_pairs", type=int, help="use only the first N pairs (default: all)")
    d = DivergenceConfig()
    for name, typ, help_ in (("epochs", int, "epochs"), ("batch_size", int, "examples per mini-batch"),
                             ("lr", float, "Adam learning rate"), ("seed", int, "random seed (sampling, weights)"),
                             ("dim", int, "word-vector size"), ("hidden", int, "BiLSTM size per direction"),
                             ("dense", int, "size of the dense layer after the CNN"),
                             ("min_count", int, "times a word pair must be aligned to enter the dictionary"),
                             ("max_train_tokens", int, "longest sentence (tokens) trained on"),
                             ("max_tokens", int, "tokens kept per side when scoring"),
                             ("partial_negatives", int, "partial divergences made of each positive (a span of "
                              "one side deleted, replaced or added), besides the cross-pair negatives"),
                             ("average_epochs", int, "keep the mean of the weights over every step of the last N "
                              "epochs (stochastic weight averaging; 0: the last step's weights)")):
        ap.add_argument(f"--{name}", type=typ, default=getattr(d, name), help=f"{help_} (default {getattr(d, name)})")
    ap.add_argument("--members", type=int, default=d.members,
                    help="detectors to train, from seeds --seed, --seed + 1000, ...; the saved detector averages "
                         "their P(equivalent): a better ranking and a steadier F1 (docs/benchmarks.md), at "
                         f"--members times the training and scoring time (default {d.members}, at most "
                         f"{MAX_MEMBERS})")
    ap.add_argument("--channels", default=",".join(map(str, d.channels)),
                    help=f"conv channels of the CNN blocks, comma-separated (default {','.join(map(str, d.channels))})")
    ap.add_argument("--aligner", choices=ALIGNERS, default=d.aligner,
                    help="word aligner for the dictionary and word vectors: fast_align (fast_align's model; "
                         "deterministic: the same --seed, the same detector; the best detector in "
                         "docs/benchmarks.md), agreement (both directions trained together: deterministic, "
                         "eflomal's alignment error, a worse detector on subtitles) or eflomal (seeds itself: "
                         "every training differs) "
                         f"(default {d.aligner})")
    ap.add_argument("--embeddings", choices=["svd", "random"], default=d.embeddings,
                    help="initial word vectors: svd (cross-lingual, from the alignment counts) or random "
                         f"(default {d.embeddings})")
    ap.add_argument("--train_embeddings", action="store_true",
                    help="fine-tune the SVD word vectors with the model (default: keep them fixed; random ones "
                         "are always trained)")
    ap.add_argument("--device", choices=["cpu", "cuda"], help="cpu or cuda (default: cuda when present)")
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: torch's; 1 is fastest on a busy machine)")
    ap.add_argument("--no_progress", action="store_true", help="no progress bar (default: a bar on stderr)")
    return ap


def _config(a) -> DivergenceConfig:
    try:
        channels = tuple(int(c) for c in a.channels.split(",") if c.strip())
    except ValueError:
        raise UsageError(f"--channels {a.channels!r}: expected comma-separated integers") from None
    cfg = DivergenceConfig(src_lang=a.src_lang, tgt_lang=a.tgt_lang, dim=a.dim, hidden=a.hidden, channels=channels,
                           dense=a.dense, max_tokens=a.max_tokens, max_train_tokens=a.max_train_tokens,
                           embeddings=a.embeddings, aligner=a.aligner,
                           freeze_embeddings=a.embeddings == "svd" and not a.train_embeddings, min_count=a.min_count,
                           members=a.members, partial_negatives=a.partial_negatives, epochs=a.epochs,
                           average_epochs=a.average_epochs,
                           batch_size=a.batch_size, lr=a.lr, seed=a.seed,
                           device=a.device,
                           progress=not a.no_progress)
    try:
        cfg.validate()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return cfg


def run(argv=None) -> dict:
    a = build_parser().parse_args(argv)
    cfg = _config(a)
    if a.max_pairs is not None and a.max_pairs < 2:
        raise UsageError("--max_pairs must be >= 2")
    if a.threads is not None:
        if a.threads < 1:
            raise UsageError("--threads must be >= 1")
        torch.set_num_threads(a.threads)
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA GPU is visible on this machine")
    output = check_output_location(a.output)
    if storage.isfile(storage.join(output, "config.json")) and not a.overwrite:
        raise UsageError(f"{output} already holds a model; pass --overwrite to replace it")
    src, tgt = read_lines(a.src, a.max_pairs), read_lines(a.tgt, a.max_pairs)
    if len(src) != len(tgt):
        raise UsageError(f"--src has {len(src)} lines but --tgt has {len(tgt)}: the files must be line-aligned")
    dev = [row for path in a.dev for row in read_dev_tsv(path, a.src_lang, a.tgt_lang)]   # fail before training

    configure_logging()
    log = lambda m: print(m, flush=True)  # noqa: E731
    log(f"training on {len(src)} pairs of {a.src} / {a.tgt}" + (f"; tuning on {len(dev)} dev pairs" if dev else ""))
    t0 = time.time()
    trained = train_divergence([tokenize(s) for s in src], [tokenize(t) for t in tgt], cfg, dev or None, log=log)
    det = trained.detector
    if storage.is_local(output):
        if a.overwrite and os.path.isfile(os.path.join(output, "config.json")):
            os.remove(os.path.join(output, "config.json"))        # incomplete until the new one is written
        det.save(output)
    else:                       # write locally, then upload, config.json last
        import tempfile

        if a.overwrite and storage.isfile(storage.join(output, "config.json")):
            storage.delete(storage.join(output, "config.json"))
        with tempfile.TemporaryDirectory(prefix="paragen-divergence-") as tmp:
            det.save(tmp)
            storage.upload_dir(tmp, output, last="config.json")
    report = {**trained.report, "output": output, "threshold": det.threshold, "seconds": round(time.time() - t0, 1)}
    print(json.dumps(report, indent=2))
    return report


def main(argv=None) -> int:
    from common.cli import cli_main

    return cli_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
