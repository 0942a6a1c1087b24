"""paragen-align: sentence-alignment recovery of a trained bilingual encoder (and its MLP pair
classifier) on a line-aligned bitext, beside the Levenshtein and length baselines
(models/bitext/alignment.py).

    paragen-align --bitext ../shared/data/bitext/multi30k/val --src_lang cs --tgt_lang en \\
        --encoder runs/bilingual-cs-en --mlp runs/pair-mlp --json runs/align.json
    python -m models.bitext.align --src test.cs.gz --tgt test.en.gz --encoder runs/bilingual-cs-en
"""
from __future__ import annotations

import argparse
import sys

from common.cli import UsageError
from models.bitext.alignment import BASELINES, METHODS, markdown, read_lines, recover_alignment


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="paragen-align", description=__doc__, allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", metavar="FILE", help="source sentences, one per line (plain or .gz)")
    ap.add_argument("--tgt", metavar="FILE", help="their translations, line by line (plain or .gz)")
    ap.add_argument("--bitext", metavar="PREFIX", help="instead of --src/--tgt: PREFIX.<src_lang>.gz and "
                    "PREFIX.<tgt_lang>.gz (needs --src_lang and --tgt_lang)")
    ap.add_argument("--src_lang", help="source language (default: the encoder's)")
    ap.add_argument("--tgt_lang", help="target language (default: the encoder's)")
    ap.add_argument("--encoder", required=True, metavar="DIR", help="bilingual encoder directory (required)")
    ap.add_argument("--mlp", metavar="DIR", help="also score with this MLP pair classifier")
    ap.add_argument("--max_sentences", type=int, metavar="N", help="use the first N pairs only")
    ap.add_argument("--k", type=int, default=4, help="neighbours of CSLS and the margins (default 4)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the shuffle (default 0)")
    ap.add_argument("--methods", default=",".join(METHODS),
                    help=f"comma-separated similarities (default: all of {','.join(METHODS)})")
    ap.add_argument("--no_baselines", action="store_true", help="skip the Levenshtein and length baselines")
    ap.add_argument("--workers", type=int, default=-1, help="threads of the Levenshtein baseline (-1: all cores)")
    ap.add_argument("--threads", type=int, help="faiss threads (default: faiss's, i.e. all cores)")
    ap.add_argument("--device", help="device of the encoder and the MLP (default: cuda if available)")
    ap.add_argument("--json", metavar="FILE", help="also write the results here as JSON")
    return ap


def _input_paths(a) -> tuple[str, str]:
    if a.bitext and (a.src or a.tgt):
        raise UsageError("give either --bitext or --src and --tgt, not both")
    if a.bitext:
        if not (a.src_lang and a.tgt_lang):
            raise UsageError("--bitext needs --src_lang and --tgt_lang")
        return f"{a.bitext}.{a.src_lang}.gz", f"{a.bitext}.{a.tgt_lang}.gz"
    if not (a.src and a.tgt):
        raise UsageError("give --src and --tgt, or --bitext with --src_lang and --tgt_lang")
    return a.src, a.tgt


def run(argv=None) -> dict:
    a = _parser().parse_args(argv)
    if a.k < 1:
        raise UsageError(f"--k must be >= 1, got {a.k}")
    if a.max_sentences is not None and a.max_sentences < 2:
        raise UsageError(f"--max_sentences must be >= 2, got {a.max_sentences}")
    methods = [m for m in a.methods.split(",") if m]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise UsageError(f"--methods: unknown {', '.join(bad)}; choose from {', '.join(METHODS)}")
    src_path, tgt_path = _input_paths(a)
    src, tgt = read_lines(src_path, a.max_sentences), read_lines(tgt_path, a.max_sentences)
    if len(src) != len(tgt):                           # fails before any model loads
        raise UsageError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: not a line-aligned bitext")
    if len(src) < 2:
        raise UsageError(f"{src_path}: alignment recovery needs at least 2 sentence pairs, found {len(src)}")

    from models.bitext.bilingual_encoder import load_bilingual_encoder

    encoder = load_bilingual_encoder(a.encoder, device=a.device)
    mlp = None
    if a.mlp:
        from models.bitext.pair_classifier import load_pair_classifier

        mlp = load_pair_classifier(a.mlp, device=a.device)
    results = recover_alignment(src, tgt, encoder=encoder, methods=methods, k=a.k, mlp=mlp, seed=a.seed,
                                baselines=() if a.no_baselines else BASELINES, src_lang=a.src_lang,
                                tgt_lang=a.tgt_lang, workers=a.workers, threads=a.threads)
    results.update(src=src_path, tgt=tgt_path, encoder=a.encoder, mlp=a.mlp)
    if a.json:
        from common.atomic import write_json

        write_json(a.json, results)
    print(markdown(results), flush=True)
    return results


def main(argv=None) -> int:
    from common.cli import cli_main, configure_logging

    configure_logging()
    return cli_main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
