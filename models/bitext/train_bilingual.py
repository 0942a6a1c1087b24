"""Train a bilingual sentence encoder (Kim et al. 2019; models/bitext/bilingual_encoder.py) on bitext.

    paragen-train-bilingual --input ../shared/data/bitext/multi30k/train --src_lang cs --tgt_lang en \\
        --dev ../shared/data/bitext/multi30k/val --output runs/bilingual-cs-en --epochs 3

--input is read exactly like the generation job's input: .tsv (src<TAB>tgt) or .parquet files,
globs, directories or Moses prefixes (PREFIX.<src_lang> + PREFIX.<tgt_lang>, .gz ok); records the
reader rejects (bad UTF-8, a missing column, ...) are skipped and counted. --monolingual adds
target-language sentences (one per line) that only feed autoencoding batches. --dev, read the same
way, is held out: its alignment-recovery error is logged after every epoch.

Besides the paper's two losses, translation batches add an in-batch alignment loss
(--align_weight, default 1; 0 for the paper's objective alone): trained on tens of thousands of
pairs rather than millions, the paper's objective leaves the two encoders' spaces unaligned.

OUT holds config.json (written last), weights.pt, spm.model and training.json; it loads with
models.bitext.bilingual_encoder.load_bilingual_encoder. OUT may be a bucket URL: the model is trained in
a local temporary directory, then uploaded, config.json last.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time

from common import storage
from common.cli import UsageError

log = logging.getLogger("paragen.train_bilingual")

MAX_LINE_BYTES = 100_000    # a longer monolingual line is no sentence: skipped


def read_bitext(inputs: list[str], src_lang: str, tgt_lang: str, max_pairs: int | None = None
                ) -> tuple[list[tuple[str, str]], dict]:
    """(pairs, counts) from the --input values; counts: used, rejected (records the shard reader
    flags with an error, by reason), empty (a side blank after whitespace clean-up)."""
    from common.shards import discover_shards, read_shard

    specs = discover_shards(inputs, src_lang, tgt_lang)
    if not specs:
        raise UsageError(f"--input {','.join(inputs)}: no input shards found")
    pairs, rejected, empty = [], {}, 0
    for spec in specs:
        for rec in read_shard(spec):
            if max_pairs is not None and len(pairs) >= max_pairs:
                break
            if rec.error:
                rejected[rec.error] = rejected.get(rec.error, 0) + 1
                continue
            src, tgt = " ".join(rec.source.split()), " ".join(rec.reference.split())
            if not src or not tgt:
                empty += 1
                continue
            pairs.append((src, tgt))
    return pairs, {"shards": len(specs), "used": len(pairs), "rejected": rejected, "empty": empty}


def read_monolingual(path: str) -> tuple[list[str], int]:
    """(sentences, skipped) of a one-sentence-per-line file (plain or compressed, local or URL);
    blank, overlong and undecodable lines are skipped."""
    from common.shards import bounded_lines, open_binary

    if not storage.isfile(path):
        raise FileNotFoundError(f"--monolingual {path}: no such file")
    lines, skipped = [], 0
    with open_binary(path) as f:
        for raw, overlong in bounded_lines(f, MAX_LINE_BYTES):
            try:
                text = "" if overlong else " ".join(raw.decode("utf-8").split())
            except UnicodeDecodeError:
                text = ""
            if text:
                lines.append(text)
            else:
                skipped += 1
    return lines, skipped


DOCUMENTED = {"hidden": 256, "dropout": 0.1, "epochs": 6, "batch_size": 128, "lr": 0.002}


def build_parser() -> argparse.ArgumentParser:
    import dataclasses

    from models.bitext.bilingual_encoder import ALIGN_WEIGHT, BilingualConfig

    # The defaults are the settings behind the documented figures (docs/benchmarks.md, "Alignment
    # recovery"): a user who runs the command as it stands gets those models.
    defaults = {**{f.name: f.default for f in dataclasses.fields(BilingualConfig)}, **DOCUMENTED}
    ap = argparse.ArgumentParser(prog="paragen-train-bilingual", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    ap.add_argument("--input", action="append", required=True, metavar="PATH",
                    help="bitext: .tsv (src<TAB>tgt) or .parquet file, glob, directory, or Moses prefix "
                         "(PREFIX.<src_lang> + PREFIX.<tgt_lang>); .gz/.bz2/.xz/.zst ok; repeat or comma-separate "
                         "(required)")
    ap.add_argument("--src_lang", required=True, help="source language code, e.g. cs (required)")
    ap.add_argument("--tgt_lang", required=True, help="target language code, e.g. en (required)")
    ap.add_argument("--output", required=True, metavar="DIR", help="model directory to write, or a bucket URL "
                    "(required)")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing --output (default: refuse)")
    ap.add_argument("--monolingual", metavar="FILE",
                    help="extra target-language text, one sentence per line (.gz ok), for autoencoding only")
    for name, typ, help_ in (("vocab_size", int, "sentencepiece pieces, shared by both languages"),
                             ("emb_dim", int, "token embedding size"),
                             ("hidden", int, "LSTM size per direction; sentence vectors have 2x this"),
                             ("layers", int, "LSTM layers"), ("max_pieces", int, "pieces kept per sentence"),
                             ("dropout", float, "dropout on token embeddings and decoder states")):
        ap.add_argument(f"--{name}", type=typ, default=defaults[name], help=f"{help_} (default {defaults[name]})")
    ap.add_argument("--epochs", type=int, default=defaults["epochs"],
                    help=f"passes over the bitext (default {defaults['epochs']})")
    ap.add_argument("--batch_size", type=int, default=defaults["batch_size"],
                    help=f"sentences per mini-batch, translation and autoencoding alike "
                         f"(default {defaults['batch_size']})")
    ap.add_argument("--lr", type=float, default=defaults["lr"],
                    help=f"Adam learning rate, decayed along a cosine (default {defaults['lr']})")
    ap.add_argument("--align_weight", type=float, default=ALIGN_WEIGHT,
                    help="weight of the in-batch alignment loss added to translation batches (not in the paper; "
                         "0 trains the paper's objective alone, whose two encoders stay unaligned at small "
                         f"scale: see docs/bitext-models.md) (default {ALIGN_WEIGHT})")
    ap.add_argument("--dev", action="append", metavar="PATH",
                    help="held-out bitext, read like --input: its alignment-recovery error (cosine, CSLS) is "
                         "measured and logged after every epoch (default: none)")
    ap.add_argument("--max_dev_pairs", type=int, default=2000,
                    help="use at most this many --dev pairs (default 2000)")
    ap.add_argument("--max_pairs", type=int, help="use only the first N usable pairs (default: all)")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="auto: cuda when a GPU is visible, else cpu (default auto)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for torch (default: torch's choice)")
    ap.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    ap.add_argument("--no_progress", action="store_true", help="no progress bar (default: a bar on stderr)")
    return ap


def _has_content(path: str) -> bool:
    return storage.isdir(path) and bool([n for n in storage.listdir(path) if not n.startswith(".")])


def run(argv=None) -> dict:
    import torch

    from models.bitext.bilingual_encoder import BilingualConfig, check_training_options, train_bilingual
    from common.cli import check_output_location

    a = build_parser().parse_args(argv)
    try:
        cfg = BilingualConfig(a.src_lang, a.tgt_lang, vocab_size=a.vocab_size, emb_dim=a.emb_dim, hidden=a.hidden,
                              layers=a.layers, max_pieces=a.max_pieces, dropout=a.dropout)
        check_training_options(a.epochs, a.batch_size, a.lr)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if a.max_pairs is not None and a.max_pairs < 1:
        raise UsageError(f"--max_pairs must be >= 1, got {a.max_pairs}")
    if a.max_dev_pairs < 2:
        raise UsageError(f"--max_dev_pairs must be >= 2, got {a.max_dev_pairs}")
    if not 0 <= a.align_weight <= 100:
        raise UsageError(f"--align_weight must be in [0, 100], got {a.align_weight}")
    if a.threads < 0:
        raise UsageError(f"--threads must be >= 0, got {a.threads}")
    if a.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA GPU is visible on this machine")
    output = check_output_location(a.output)
    if _has_content(output) and not a.overwrite:
        raise UsageError(f"{output} already exists and is not empty; pass --overwrite to replace it")
    if a.threads:
        torch.set_num_threads(a.threads)
    t0 = time.time()
    inputs = [x for item in a.input for x in item.split(",") if x]
    try:
        pairs, counts = read_bitext(inputs, a.src_lang, a.tgt_lang, a.max_pairs)
    except ValueError as exc:          # e.g. two shards with one name
        raise UsageError(str(exc)) from None
    if not pairs:
        raise UsageError(f"--input {','.join(inputs)}: no usable {a.src_lang}-{a.tgt_lang} pairs "
                         f"({_skipped(counts)} skipped)")
    dev = []
    if a.dev:
        dev_inputs = [x for item in a.dev for x in item.split(",") if x]
        try:
            dev, _ = read_bitext(dev_inputs, a.src_lang, a.tgt_lang, a.max_dev_pairs)
        except ValueError as exc:
            raise UsageError(f"--dev: {exc}") from None
        if len(dev) < 2:
            raise UsageError(f"--dev {','.join(dev_inputs)}: needs at least 2 usable pairs, found {len(dev)}")
    mono, mono_skipped = read_monolingual(a.monolingual) if a.monolingual else ([], 0)
    log.info("read %d pairs from %d shard(s), %d skipped; %d monolingual sentences (%d lines skipped)",
             len(pairs), counts["shards"], _skipped(counts), len(mono), mono_skipped)
    device = None if a.device == "auto" else a.device
    train = dict(monolingual=mono, epochs=a.epochs, batch_size=a.batch_size, lr=a.lr, device=device, seed=a.seed,
                 log=log.info, progress=not a.no_progress, align_weight=a.align_weight, dev_pairs=dev or None)
    if storage.is_local(output):     # an old model stays readable until save() replaces it
        report = train_bilingual(pairs, output, cfg, **train)
    else:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="paragen-bilingual-") as tmp:
            report = train_bilingual(pairs, tmp, cfg, **train)
            storage.delete(storage.join(output, "config.json"))   # an old model stops being whole first
            storage.upload_dir(tmp, output, last="config.json")
        log.info("uploaded to %s", output)
    report["input"] = {**counts, "monolingual_skipped": mono_skipped}
    report["total_seconds"] = round(time.time() - t0, 1)
    print(_summary(report, a, output), flush=True)
    return report


def _skipped(counts: dict) -> int:
    return sum(counts["rejected"].values()) + counts["empty"]


def _summary(report: dict, a, output: str) -> str:
    counts = report["input"]
    losses = lambda xs: " ".join(f"{x:.3f}" for x in xs)   # noqa: E731
    rejected = ", ".join(f"{k} {v}" for k, v in sorted(counts["rejected"].items())) or "none rejected"
    return (f"bilingual encoder {a.src_lang}-{a.tgt_lang}: {report['pairs']} pairs used, {_skipped(counts)} skipped "
            f"({rejected}; {counts['empty']} empty), {report['monolingual']} monolingual; "
            f"translation loss per epoch {losses(report['translation_loss'])}; "
            f"autoencoding loss per epoch {losses(report['autoencoding_loss'])}; "
            + (f"dev alignment error {_dev_errors(report['epochs'][-1]['dev_error'])}; "
               if "dev_error" in report["epochs"][-1] else "")
            + f"{report['total_seconds']:.0f}s -> {output}")


def _dev_errors(errors: dict) -> str:
    return ", ".join(f"{method} {100 * e:.1f}%" for method, e in errors.items())


def main(argv=None) -> int:
    from common.cli import cli_main, configure_logging

    configure_logging()
    return cli_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
