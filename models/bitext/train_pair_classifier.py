"""Train the MLP pair classifier of Kim et al. 2019 (models/bitext/pair_classifier.py) over a bilingual
encoder's embeddings.

    paragen-train-pair-classifier --encoder runs/bilingual-cs-en --input clean.tsv \\
        --src_lang cs --tgt_lang en --negatives random --output runs/pair-mlp-cs-en
    paragen-train-pair-classifier ... --negatives worst --noisy crawled.tsv   # the paper's other variant

Positives are the --input pairs (clean bitext). Negatives, as in the paper: ``random`` crosses the
clean pairs (a source with another line's target); ``worst`` takes the worst-scoring --fraction
(60%) of a noisy corpus (--noisy) by the encoder's cosine. Inputs are read like the generation
job's (common/shards.py). OUT (local or a bucket URL) holds config.json, written last, and
weights.pt; config.json also records the encoder it was trained on and the languages.
"""
from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time

from common import storage
from common.cli import UsageError, check_output_location, cli_main, configure_logging

log = logging.getLogger("paragen.train_pair_classifier")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="paragen-train-pair-classifier", description=__doc__, allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--encoder", required=True, metavar="DIR", help="bilingual encoder (paragen-train-bilingual)")
    ap.add_argument("--input", required=True, action="append", help="clean bitext: the positives (repeatable)")
    ap.add_argument("--src_lang", required=True)
    ap.add_argument("--tgt_lang", required=True)
    ap.add_argument("--output", required=True, metavar="DIR", help="the classifier's directory (or bucket URL)")
    ap.add_argument("--negatives", choices=("random", "worst"), default="random",
                    help="random cross pairs of the clean bitext, or the worst --fraction of --noisy by cosine "
                         "(default random)")
    ap.add_argument("--noisy", action="append", default=[], help="noisy bitext for --negatives worst")
    ap.add_argument("--fraction", type=float, default=0.6, help="worst fraction of --noisy (default 0.6)")
    ap.add_argument("--max_pairs", type=int, default=None, help="at most this many pairs per input (default all)")
    ap.add_argument("--features", choices=("concat", "interaction"), default="concat",
                    help="[a; b] as in the paper, or [a; b; |a-b|; a*b] (default concat)")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--overwrite", action="store_true", help="replace an existing classifier in --output")
    return ap


def run(argv=None) -> dict:
    from models.bitext.bilingual_encoder import load_bilingual_encoder
    from models.bitext.pair_classifier import make_negatives, train_pair_classifier
    from models.bitext.train_bilingual import read_bitext
    from common.names import check_lang_code

    a = build_parser().parse_args(argv)
    src_lang, tgt_lang = check_lang_code(a.src_lang, "--src_lang"), check_lang_code(a.tgt_lang, "--tgt_lang")
    out = check_output_location(a.output)
    if storage.isfile(storage.join(out, "config.json")) and not a.overwrite:
        raise UsageError(f"{out} already holds a model; pass --overwrite to replace it")
    if a.negatives == "worst" and not a.noisy:
        raise UsageError("--negatives worst needs --noisy: the noisy bitext whose worst pairs are the negatives")
    if a.noisy and a.negatives != "worst":
        raise UsageError("--noisy is only used with --negatives worst")
    if not 0 < a.fraction <= 1 or a.epochs < 1:
        raise UsageError("--fraction must be in (0, 1] and --epochs >= 1")
    start = time.time()
    encoder = load_bilingual_encoder(a.encoder)
    if set(encoder.langs) != {src_lang, tgt_lang}:
        raise UsageError(f"--encoder {a.encoder} is a {encoder.langs[0]}-{encoder.langs[1]} encoder, "
                         f"not {src_lang}-{tgt_lang}")
    clean, counts = read_bitext(a.input, src_lang, tgt_lang, a.max_pairs)
    if len(clean) < 2:
        raise UsageError(f"--input: {len(clean)} usable pair(s); training needs at least 2")

    def embed(pairs):   # (source-side, target-side) embeddings in the encoder's own orientation
        src, tgt = [p[0] for p in pairs], [p[1] for p in pairs]
        if encoder.langs[0] != src_lang:
            src, tgt = tgt, src
        return encoder.encode(src, encoder.langs[0]), encoder.encode(tgt, encoder.langs[1])

    pos_a, pos_b = embed(clean)
    if a.negatives == "worst":
        noisy, noisy_counts = read_bitext(a.noisy, src_lang, tgt_lang, a.max_pairs)
        neg_a, neg_b = make_negatives("worst", *embed(noisy), fraction=a.fraction)
        counts["noisy"] = noisy_counts
    else:
        neg_a, neg_b = make_negatives("random", pos_a, pos_b, seed=a.seed)
    extra = {"src_lang": encoder.langs[0], "tgt_lang": encoder.langs[1], "negatives": a.negatives,
             "encoder": storage.absolute(a.encoder), "positives": len(pos_a), "negative_pairs": len(neg_a)}
    clf = train_pair_classifier(pos_a, pos_b, neg_a, neg_b, epochs=a.epochs, lr=a.lr, seed=a.seed,
                                features=a.features, extra=extra)
    with tempfile.TemporaryDirectory(prefix="paragen-mlp-") as tmp:
        clf.save(tmp)
        if storage.is_local(out):
            storage.makedirs(out)
        for name in ("weights.pt", "config.json"):          # config.json last: it marks a whole model
            storage.copy_file(storage.join(tmp, name), storage.join(out, name))
    summary = {"output": out, "positives": len(pos_a), "negatives": len(neg_a), "inputs": counts,
               "seconds": round(time.time() - start, 1)}
    print(f"pair classifier -> {out}: {len(pos_a)} positive and {len(neg_a)} negative ({a.negatives}) pairs, "
          f"{summary['seconds']} s")
    return summary


def main(argv=None) -> int:
    configure_logging()
    return cli_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
