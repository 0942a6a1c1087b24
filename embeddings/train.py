"""Train a paraphrastic sentence encoder on paraphrase pairs (ParaNMT-50M §5).

    paragen-train-embeddings --input runs/example-output --where "rank <= 1" --encoder word+trigram \
        --output runs/example-encoder --dev_sts ../shared/data/sts/stsb/train.tsv

(runs/example-output is what scripts/quickstart.sh writes.)

Loss: margin δ on cosine similarity against the hardest negative of a mega-batch (embeddings/
mining.py); Adam; one checkpoint per epoch under OUT/checkpoints/epoch-N; the epoch with the best
development STS Pearson (the last epoch without a dev set) is copied to OUT, so OUT loads with
models.sentence.sentence_encoder.load_encoder.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from embeddings.data import PairSource, scramble, shuffled
from embeddings.mining import hardest_negatives, margin_loss
from models.sentence.encoders import is_order_sensitive, parse_spec
from models.sentence.sentence_encoder import SentenceEncoder
from common import storage
from common.atomic import copy_file, write_json
from common.cli import UsageError
from paracorpus.schema import manifest_reconciled


@dataclass
class TrainConfig:
    encoder: str = "word"
    dim: int = 300
    hidden: int | None = None
    min_count: int = 1            # words seen fewer times map to <unk>
    min_trigram_count: int = 1
    max_words: int | None = None
    batch_size: int = 100
    megabatch: int = 1            # M: mini-batches pooled for negative mining
    delta: float = 0.4
    lr: float = 1e-3
    epochs: int = 10
    scramble_rate: float = 0.0
    shuffle_buffer: int = 200_000
    max_tokens: int = 100
    seed: int = 1
    device: str | None = None
    progress: bool = True
    extra: dict = field(default_factory=dict)

    def validate(self) -> None:
        parse_spec(self.encoder)
        for name in ("dim", "batch_size", "megabatch", "epochs", "min_count", "min_trigram_count", "shuffle_buffer",
                     "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.batch_size < 2:
            raise ValueError("batch_size must be >= 2: negatives come from the other pairs of a batch")
        if not 0 <= self.scramble_rate <= 1:
            raise ValueError(f"scramble_rate must be in [0, 1], got {self.scramble_rate}")
        if not (self.lr > 0 and self.delta >= 0):
            raise ValueError("lr must be > 0 and delta >= 0")


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def megabatch_step(encoder: SentenceEncoder, optimizer, mega: list[tuple[list[str], list[str]]],
                   batch_size: int, delta: float) -> list[float]:
    """One mega-batch: mine every pair's negatives over the whole mega-batch with the current
    weights, then one Adam step per mini-batch. Returns the mini-batch losses.

    With one mini-batch (M=1) the embeddings that pick the negatives are the ones the loss uses,
    which is plain in-batch mining."""
    n = len(mega)
    t1, t2 = [a for a, _ in mega], [b for _, b in mega]
    pool_tokens = t1 + t2
    losses = []
    if n <= batch_size:                       # M=1: one forward pass, mine on detached embeddings
        e = encoder.embed_tokens(pool_tokens)
        neg1, neg2 = hardest_negatives(e[:n].detach(), e[n:].detach())
        loss = margin_loss(e[:n], e[n:], e[neg1], e[neg2], delta)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return [loss.item()]
    with torch.no_grad():
        e = torch.cat([encoder.embed_tokens(pool_tokens[i:i + 1024]) for i in range(0, 2 * n, 1024)])
        neg1, neg2 = hardest_negatives(e[:n], e[n:])
    for start in range(0, n, batch_size):
        idx = range(start, min(n, start + batch_size))
        b = len(idx)
        batch = [t1[i] for i in idx] + [t2[i] for i in idx] + \
                [pool_tokens[int(neg1[i])] for i in idx] + [pool_tokens[int(neg2[i])] for i in idx]
        out = encoder.embed_tokens(batch)
        loss = margin_loss(out[:b], out[b:2 * b], out[2 * b:3 * b], out[3 * b:], delta)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _megabatches(pairs, size: int):
    buf = []
    for p in pairs:
        buf.append(p)
        if len(buf) == size:
            yield buf
            buf = []
    if len(buf) >= 2:                          # a last single pair has no in-batch negative
        yield buf


def train(source, out: str, cfg: TrainConfig, dev_sts: str | None = None, log=print) -> dict:
    """Train on SOURCE (an iterable of (s1, s2), re-iterated each epoch; a PairSource streams)
    and write the model directory OUT. Returns the training report (also OUT/training.json)."""
    from embeddings.sts import evaluate

    cfg.validate()
    set_seed(cfg.seed)
    t0 = time.time()

    def sentences():
        for a, b in source:
            yield a
            yield b

    encoder = SentenceEncoder.from_corpus(cfg.encoder, sentences(), cfg.min_count, cfg.min_trigram_count,
                                          cfg.max_words, dim=cfg.dim, hidden=cfg.hidden,
                                          max_tokens=cfg.max_tokens, device=cfg.device)
    n_pairs = getattr(source, "stats", {}).get("used") if hasattr(source, "stats") else None
    n_pairs = n_pairs if n_pairs is not None else sum(1 for _ in source)
    if n_pairs < 2:
        raise UsageError(f"need at least 2 training pairs, got {n_pairs}")
    log(f"vocabulary: {len(encoder.words)} words (min count {cfg.min_count}), {len(encoder.trigrams)} trigrams; "
        f"{n_pairs} pairs; encoder {cfg.encoder} ({encoder.out_dim} dims) on {encoder.device}")
    encoder.extra = {"training": {k: v for k, v in asdict(cfg).items() if k not in ("device", "progress")}}
    optimizer = torch.optim.Adam(encoder.module.parameters(), lr=cfg.lr)
    order_rng = random.Random(cfg.seed)
    scramble_rng = random.Random(cfg.seed + 1)
    scramble_rate = cfg.scramble_rate if is_order_sensitive(cfg.encoder) else 0.0
    report = {"config": asdict(cfg), "pairs": n_pairs, "words": len(encoder.words),
              "trigrams": len(encoder.trigrams), "epochs": []}
    if hasattr(source, "stats"):
        report["input"] = dict(source.stats)
    ckpt_root = os.path.join(out, "checkpoints")
    os.makedirs(ckpt_root, exist_ok=True)
    best = None
    mega_size = cfg.batch_size * cfg.megabatch
    for epoch in range(1, cfg.epochs + 1):
        encoder.module.train()
        start, done, losses = time.time(), 0, []
        bar = _progress(n_pairs, f"epoch {epoch}/{cfg.epochs}", cfg.progress)
        for mega in _megabatches(shuffled(source, cfg.shuffle_buffer, order_rng), mega_size):
            toks = [(scramble(encoder.tokenize(a), scramble_rate, scramble_rng),
                     scramble(encoder.tokenize(b), scramble_rate, scramble_rng)) for a, b in mega]
            losses += megabatch_step(encoder, optimizer, toks, cfg.batch_size, cfg.delta)
            done += len(mega)
            bar.update(len(mega))
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}", pairs_s=f"{done / (time.time() - start):.0f}",
                            refresh=False)      # drawn at the bar's mininterval, not at every batch
        bar.close()
        seconds = time.time() - start
        entry = {"epoch": epoch, "loss": float(np.mean(losses)) if losses else None, "pairs": done,
                 "seconds": round(seconds, 2), "pairs_per_s": round(done / max(seconds, 1e-9), 1)}
        path = os.path.join(ckpt_root, f"epoch-{epoch}")
        encoder.save(path)
        if dev_sts:
            dev = evaluate(encoder.similarity, dev_sts)
            entry["dev_pearson"] = dev["mean_of_subsets"]["pearson"]
        report["epochs"].append(entry)
        score = entry.get("dev_pearson", epoch)            # without dev data: the last epoch
        if best is None or score > best[0]:
            best = (score, epoch)
        log(f"epoch {epoch}: loss {entry['loss']:.4f}, {entry['pairs_per_s']:.0f} pairs/s"
            + (f", dev STS Pearson {entry['dev_pearson']:.1f}" if dev_sts else ""))
    report["best_epoch"] = best[1]
    best_dir = os.path.join(ckpt_root, f"epoch-{best[1]}")
    for name in os.listdir(best_dir):
        copy_file(os.path.join(best_dir, name), os.path.join(out, name))
    report["seconds"] = round(time.time() - t0, 1)
    write_json(os.path.join(out, "training.json"), report)
    log(f"best epoch {best[1]} copied to {out} ({report['seconds']:.0f}s)")
    return report


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="pair", disable=not enabled, mininterval=2.0, file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="paragen-train-embeddings", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    ap.add_argument("--input", required=True, metavar="PATH",
                    help="generation/filter output dir (its paraphrases/ is read), a Parquet dir or file, "
                         "or a sentence1<TAB>sentence2 file (.gz ok, globs ok) (required)")
    ap.add_argument("--columns", default="reference,paraphrase",
                    help="the two text columns of Parquet input (default reference,paraphrase)")
    ap.add_argument("--where", action="append", default=[],
                    help="row filter on Parquet input, repeatable (ANDed): e.g. 'rank <= 2', "
                         "'keep and combined_score < 3', \"lang_pair in ('cs-en', 'de-en')\" (default: all rows)")
    ap.add_argument("--max_pairs", type=int, help="use only the first N pairs (default: all)")
    ap.add_argument("--output", required=True, metavar="DIR", help="model directory to write (required)")
    ap.add_argument("--overwrite", action="store_true", help="replace a model already in --output (default: refuse)")
    ap.add_argument("--dev_sts", metavar="DIR",
                    help="STS directory (<year>/<subset>.tsv) for picking the best epoch (default: the last epoch)")
    d = TrainConfig()
    ap.add_argument("--encoder", default=d.encoder, help="word, trigram, lstm, blstm, gran, or parts joined by "
                    f"'+' (concatenated; ':add' sums), e.g. word+trigram (default {d.encoder})")
    for name, typ, help_ in (("dim", int, "embedding size"), ("hidden", int, "LSTM size (default: dim)"),
                             ("min_count", int, "minimum word count"), ("min_trigram_count", int, "minimum trigram count"),
                             ("max_words", int, "cap on the word vocabulary"), ("batch_size", int, "pairs per mini-batch"),
                             ("megabatch", int, "M: mini-batches pooled for negative mining"),
                             ("delta", float, "margin"), ("lr", float, "Adam learning rate"),
                             ("epochs", int, "epochs"), ("scramble_rate", float, "probability of shuffling a sentence's words (recurrent encoders)"),
                             ("shuffle_buffer", int, "pairs held for streaming shuffling"),
                             ("max_tokens", int, "tokens kept per sentence"), ("seed", int, "random seed")):
        default = getattr(d, name)
        shown = "" if "(default" in help_ else f" (default {'none' if default is None else default})"
        ap.add_argument(f"--{name}", type=typ, default=default, help=help_ + shown)
    ap.add_argument("--device", choices=["cpu", "cuda"], help="cpu or cuda (default: cuda when present)")
    ap.add_argument("--no_progress", action="store_true", help="no progress bar (default: a bar on stderr)")
    return ap


def run(argv=None) -> dict:
    a = build_parser().parse_args(argv)
    with storage.first_contact():                      # a store never reached is a mistake, said at once
        source, output, cfg = _check(a)
    print(f"training on {source.describe()}", flush=True)
    if storage.is_local(output):
        report = train(source, output, cfg, a.dev_sts, log=lambda m: print(m, flush=True))
    else:                       # train in a local directory, then upload it, config.json last
        import tempfile

        with tempfile.TemporaryDirectory(prefix="paragen-encoder-") as tmp:
            report = train(source, tmp, cfg, a.dev_sts, log=lambda m: print(m, flush=True))
            storage.upload_dir(tmp, output, last="config.json")
        print(f"uploaded to {output}", flush=True)
    print(json.dumps({k: v for k, v in report.items() if k != "config"}, indent=2))
    return report


def _check(a) -> tuple:
    """(the pairs to train on, the output, the config) of the options A; UsageError for a mistake."""
    from common.cli import check_apart, check_output_location

    cfg = TrainConfig(**{k: getattr(a, k) for k in TrainConfig.__dataclass_fields__
                         if k not in ("progress", "extra")}, progress=not a.no_progress)
    columns = tuple(c.strip() for c in a.columns.split(","))
    try:
        cfg.validate()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if len(columns) != 2:
        raise UsageError("--columns takes two column names")
    output = check_output_location(a.output)
    if storage.isdir(a.input):                     # a run or a Parquet dataset (a TSV file's folder may hold both)
        check_apart(output, a.input)
    if storage.isfile(storage.join(output, "config.json")) and not a.overwrite:
        raise UsageError(f"{output} already holds an encoder; pass --overwrite to replace it")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA GPU is visible on this machine")
    try:
        source = PairSource(a.input, columns, a.where, a.max_pairs)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if a.dev_sts:
        from embeddings.sts import read_sts_dir

        try:
            read_sts_dir(a.dev_sts)                     # fail on a bad dev set before training
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    gm = source.generation_manifest
    if gm is not None and not manifest_reconciled(gm):
        why = "counts do not reconcile (see its _manifest.json)" if gm else "has no _manifest.json (unfinished?)"
        print(f"warning: {a.input}: the generation run {why}", file=sys.stderr, flush=True)
    return source, output, cfg


def main(argv=None) -> int:
    from common.cli import cli_main

    return cli_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
