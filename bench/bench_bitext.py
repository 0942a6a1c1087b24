"""Benchmark of the bitext models: alignment recovery (Kim et al. 2019's evaluation), encoding
speed, and the generation job's bitext filter on a bitext with injected misaligned pairs.

    python bench/bench_bitext.py --data ../shared/data [--part align,filter]
        [--encoders runs/bilingual-{lang}-en] [--train PREFIX] [--eval PREFIX] [--nmt runs/multi30k-fr-models]
        [--divergence runs/divergence-en-fr] [--filter_lang fr]

Parts (Markdown on stdout, every figure beside its baseline from the same run):

  align   for each of cs-en, de-en, fr-en with an encoder directory (--encoders, {lang} filled in):
          the Multi30k ``val`` set (1,014 pairs), target side shuffled, each sentence's match
          recovered by cosine, Euclidean, CSLS, margin (ratio, distance) and an MLP trained here on
          --mlp_pairs training pairs (random negatives), vs the Levenshtein and length baselines;
          the error by source length and by the pair's words absent from the encoder's training
          text (--train); and encoding speed (sentences/s on this CPU). --eval PREFIX scores
          other pairs than val, e.g. a split of train held out to choose settings on.
  filter  the generation job on --pairs Multi30k fr-en (--filter_lang) training pairs of which 10% are replaced
          by misaligned ones (a French sentence with another line's English), plus the 100
          labelled OpenSubtitles dev pairs, with and without the bitext filter (the fr-en encoder's
          cosine at a percentile of clean held-out pairs, and the en-fr divergence detector
          --divergence with its own threshold): what the filter rejects of each kind of pair, and
          the paraphrases' mean dual score.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
from fresh_process import job_run  # noqa: E402  (the jobs it measures: bench/fresh_process.py)
PY = sys.executable


def lines(path: str, limit: int | None = None, skip: int = 0) -> list[str]:
    out = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if limit is not None and i >= skip + limit:
                break
            if i >= skip:
                out.append(line.rstrip("\n"))
    return out


WORD = re.compile(r"\w+")
LENGTH_BINS = ((1, 9), (10, 14), (15, 19), (20, None))     # source words
UNSEEN_BINS = ("0", "1", "2", "3+")                         # words of the pair absent from training


def words(sentence: str) -> list[str]:
    return WORD.findall(sentence.lower())


def length_label(n: int) -> str:
    for low, high in LENGTH_BINS:
        if high is None or n <= high:
            return f"{low}-{high}" if high else f"{low}+"
    raise AssertionError(n)


def breakdowns(src: list[str], tgt: list[str], seen_src: set[str], seen_tgt: set[str]) -> dict[str, list[str]]:
    """A label per pair: its source length in words, and how many of its words (both sides) the
    encoder's training text lacks."""
    unseen = [sum(w not in seen_src for w in words(s)) + sum(w not in seen_tgt for w in words(t))
              for s, t in zip(src, tgt)]
    return {"source words": [length_label(len(words(s))) for s in src],
            "unseen words": [str(u) if u < 3 else "3+" for u in unseen]}


def part_align(a, bitext: str) -> None:
    from models.bitext.alignment import markdown, markdown_breakdown, recover_alignment
    from models.bitext.bilingual_encoder import load_bilingual_encoder
    from models.bitext.pair_classifier import make_negatives, train_pair_classifier

    train = a.train or f"{bitext}/train"
    evaluate = a.eval or f"{bitext}/val"
    print(f"\nEvaluation pairs: {evaluate}.*.gz; the encoders' training text: {train}.*.gz")
    for lang in ("cs", "de", "fr"):
        enc_dir = a.encoders.format(lang=lang)
        if not os.path.isfile(os.path.join(enc_dir, "config.json")):
            print(f"\n(no {lang}-en encoder in {enc_dir}: skipped)")
            continue
        enc = load_bilingual_encoder(enc_dir, device="cpu")
        src, tgt = lines(f"{evaluate}.{lang}.gz"), lines(f"{evaluate}.en.gz")
        start = time.perf_counter()
        e_src, e_tgt = enc.encode(src, lang), enc.encode(tgt, "en")
        speed = (len(src) + len(tgt)) / (time.perf_counter() - start)
        tr_src, tr_tgt = lines(f"{train}.{lang}.gz"), lines(f"{train}.en.gz")
        mlp = None
        if a.mlp_pairs:
            pa, pb = enc.encode(tr_src[:a.mlp_pairs], lang), enc.encode(tr_tgt[:a.mlp_pairs], "en")
            mlp = train_pair_classifier(pa, pb, *make_negatives("random", pa, pb, seed=0), epochs=10, seed=0)
        groups = breakdowns(src, tgt, {w for s in tr_src for w in words(s)}, {w for s in tr_tgt for w in words(s)})
        results = recover_alignment(src, tgt, embeddings=(e_src, e_tgt), mlp=mlp, k=4, seed=0, groups=groups)
        results.update(src_lang=lang, tgt_lang="en")
        print()
        print(markdown(results))
        print(f"encoding: {speed:,.0f} sentences/s on this CPU ({len(src) + len(tgt):,} sentences, "
              f"{enc.dim}-dim embeddings)" + (f"; MLP trained on {a.mlp_pairs:,} training pairs" if mlp else ""))
        shown = ("cosine", "csls", "levenshtein")
        for breakdown, order in (("source words", [length_label(lo) for lo, _ in LENGTH_BINS]),
                                 ("unseen words", UNSEEN_BINS)):
            print(f"\nMean error by {breakdown} ({lang}-en):\n")
            print(markdown_breakdown(results, breakdown, shown, order))


def _generate(args: list[str]) -> tuple[float, dict]:
    start = time.perf_counter()
    done = job_run([PY, "-m", "beam_pipelines.generate", *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    out = args[args.index("--output") + 1]
    return time.perf_counter() - start, json.load(open(os.path.join(out, "_manifest.json")))


def _rows(out: str, table: str) -> list[dict]:
    import pyarrow.parquet as pq

    return [r for f in sorted(__import__("pathlib").Path(out, table).rglob("*.parquet"))
            for r in pq.read_table(f).to_pylist()]


def _tsv_rows(path: str) -> list[tuple[str, str, int]]:
    """(french, english, label) of a divergence dev file (header: english french label agreement)."""
    from models.bitext.divergence import read_dev_tsv

    return [(fr, en, y) for en, fr, y in read_dev_tsv(path, "en", "fr")]


def part_filter(a, bitext: str, tmp: str) -> None:
    """The generation job on a fr-en bitext: the first --pairs Multi30k pairs, 10% of them replaced
    by misaligned pairs, plus the 100 labelled OpenSubtitles dev pairs; without and with the
    bitext filter (fr-en encoder + en-fr divergence detector)."""
    from models.bitext.bilingual_encoder import load_bilingual_encoder
    from models.bitext.divergence import load_divergence_detector
    from models.bitext.similarity import cosine_pairs
    from common.text import tokenize
    from filtering.text_scores import ngram_overlap

    lang = a.filter_lang           # fr: the OpenSubtitles dev pairs (en-fr) join the bitext
    enc_dir = a.encoders.format(lang=lang)
    fr, en = lines(f"{bitext}/train.{lang}.gz", a.pairs), lines(f"{bitext}/train.en.gz", a.pairs)
    rng = random.Random(7)
    injected = set(rng.sample(range(len(fr)), len(fr) // 10))
    other = {i: (i + rng.randrange(1, len(fr))) % len(fr) for i in injected}
    subs = _tsv_rows(os.path.join(a.data, "divergence", "opensubs.dev.tsv")) if lang == "fr" else []
    rows = [(fr[i], en[other[i]] if i in injected else en[i]) for i in range(len(fr))] + [(f, e) for f, e, _ in subs]
    kinds = ["misaligned" if i in injected else "clean" for i in range(len(fr))] + \
        ["subtitles, equivalent" if y else "subtitles, divergent" for _, _, y in subs]
    inp = os.path.join(tmp, "bitext.tsv")
    with open(inp, "w", encoding="utf-8") as f:
        f.writelines(f"{x}\t{y}\n" for x, y in rows)

    enc = load_bilingual_encoder(enc_dir, device="cpu")
    held_fr, held_en = lines(f"{bitext}/val.{lang}.gz", 500), lines(f"{bitext}/val.en.gz", 500)
    clean_cos = cosine_pairs(enc.encode(held_fr, lang), enc.encode(held_en, "en"))
    threshold = float(np.percentile(clean_cos, a.similarity_percentile))
    div = load_divergence_detector(a.divergence)

    base = ["--input", inp, "--src_lang", lang, "--tgt_lang", "en", "--forward_model", f"{a.nmt}/{lang}-en",
            "--backward_model", f"{a.nmt}/en-{lang}", "--preset", "parabank2-cpu", "--num_sets", "2", "--num_samples",
            "5", "--dual_xent_threshold", "-1", "--device", "cpu", "--num_output_shards", "2", "--overwrite"]
    plain_s, plain_manifest = _generate([*base, "--output", os.path.join(tmp, "plain")])
    filt_s, filt_manifest = _generate([*base, "--output", os.path.join(tmp, "filtered"), "--bitext_encoder", enc_dir,
                                       "--bitext_min_similarity", f"{threshold:.6f}", "--divergence_model",
                                       a.divergence])
    assert plain_manifest["counts"]["reconciled"] and filt_manifest["counts"]["reconciled"]
    rejected = {r["input_index"]: r["reason"] for r in _rows(os.path.join(tmp, "filtered"), "rejects")
                if r["stage"] == "bitext_filter"}

    def summary(out):
        """(rows, mean dual score, rows from misaligned pairs, mean unigram overlap of paraphrase and
        reference, the ngram_overlap filter's measure): the dual score judges a candidate against
        the source, so it cannot see a reference that is not the source's translation; the overlap
        can."""
        got = _rows(out, "paraphrases")
        if not got:
            return 0, float("nan"), 0, float("nan")
        overlap = [ngram_overlap(tokenize(r["reference"]), tokenize(r["paraphrase"]), 1) for r in got]
        return (len(got), float(np.mean([r["combined_score"] for r in got])),
                sum(kinds[r["input_index"]] == "misaligned" for r in got), float(np.mean(overlap)))

    plain = summary(os.path.join(tmp, "plain"))
    filt = summary(os.path.join(tmp, "filtered"))
    print()
    print(f"### Bitext filter in the generation job: {len(fr):,} Multi30k {lang}-en pairs ({len(injected)} replaced by "
          f"misaligned ones) + {len(subs)} OpenSubtitles dev pairs")
    print()
    print(f"Bilingual-encoder cosine threshold {threshold:.4f} ({a.similarity_percentile:g}th percentile of 500 "
          f"clean `val` pairs); divergence detector {a.divergence} with its threshold "
          f"{div.threshold:.4f}. Generation: preset parabank2-cpu, S=2 x N=5, {lang}-en models {a.nmt}.")
    print()
    print("| pairs | count | rejected by the bitext filter | of which `bitext_similarity` | of which `divergent` |")
    print("|---|---:|---:|---:|---:|")
    for kind in ("misaligned", "clean", "subtitles, divergent", "subtitles, equivalent"):
        idx = [i for i, k in enumerate(kinds) if k == kind]
        rej = [rejected[i] for i in idx if i in rejected]
        print(f"| {kind} | {len(idx)} | {len(rej)} ({len(rej) / max(len(idx), 1):.0%}) | "
              f"{rej.count('bitext_similarity')} | {rej.count('divergent')} |")
    print()
    print("| run | paraphrase rows | rows from misaligned pairs | mean dual score (combined_score, lower is "
          "better) | mean unigram overlap, paraphrase vs reference | seconds |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (n, score, bad, overlap), secs in (("no bitext filter (baseline)", plain, plain_s),
                                                 ("bitext filter", filt, filt_s)):
        print(f"| {name} | {n:,} | {bad:,} | {score:.3f} | {overlap:.3f} | {secs:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data"))
    ap.add_argument("--part", default="align,filter")
    ap.add_argument("--encoders", default=os.path.join(ROOT, "runs", "bilingual-{lang}-en"))
    ap.add_argument("--nmt", default=os.path.join(ROOT, "runs", "multi30k-fr-models"),
                    help="fr-en/ and en-fr/ NMT models (paragen-train-nmt on Multi30k fr-en; see docs/benchmarks.md); "
                         "LANG-en/ and en-LANG/ with --filter_lang LANG")
    ap.add_argument("--divergence", default=os.path.join(ROOT, "runs", "divergence-en-fr"),
                    help="en-fr divergence detector (paragen-train-divergence; see docs/benchmarks.md)")
    ap.add_argument("--similarity_percentile", type=float, default=5.0,
                    help="the encoder's cosine threshold: this percentile of clean held-out pairs (default 5)")
    ap.add_argument("--train", metavar="PREFIX",
                    help="the encoders' training bitext, PREFIX.<lang>.gz: the MLP's pairs and the words counted as "
                         "seen (default: Multi30k train under --data)")
    ap.add_argument("--eval", metavar="PREFIX",
                    help="the align part's pairs, PREFIX.<lang>.gz (default: Multi30k val under --data)")
    ap.add_argument("--mlp_pairs", type=int, default=5000, help="training pairs of the MLP (0: no MLP)")
    ap.add_argument("--pairs", type=int, default=1000, help="Multi30k pairs of the filter run (default 1000)")
    ap.add_argument("--filter_lang", default="fr", choices=("cs", "de", "fr"),
                    help="the filter part's language besides English (default fr; fr adds the OpenSubtitles dev pairs)")
    ap.add_argument("--workdir", help="write the filter part's input and runs here and keep them (default: a "
                                      "temporary directory)")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    bitext = os.path.join(a.data, "bitext", "multi30k")
    parts = set(a.part.split(","))
    if "align" in parts:
        part_align(a, bitext)
    if "filter" in parts:
        if a.workdir:                  # keep the runs (e.g. to filter them or look at the rows)
            os.makedirs(a.workdir, exist_ok=True)
            part_filter(a, bitext, a.workdir)
        else:
            with tempfile.TemporaryDirectory(prefix="bench-bitext-") as tmp:
                part_filter(a, bitext, tmp)


if __name__ == "__main__":
    main()
