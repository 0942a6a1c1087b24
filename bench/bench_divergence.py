"""Benchmark of the semantic-divergence detector (Vyas, Niu & Carpuat 2018) on real en-fr data.

    python bench/bench_divergence.py [--data ../shared/data/divergence] [--epochs 2] [--threads 1]
    python bench/bench_divergence.py --model DIR     # a saved detector, no training
    python bench/bench_divergence.py --model DIR --dev my-labels.tsv [--dev other.tsv]

Trains on opensubs-parallel.{en,fr} (10,000 pairs: word alignments (--aligner: fast_align, the
default; agreement; eflomal) -> bilingual dictionary
and SVD word vectors -> synthetic examples, 5 negatives per positive -> interaction model), then
scores the two labelled development sets (commoncrawl, opensubs; 100 pairs each) with the model
and, in the same run, the paper's two baselines: cosine of averaged bilingual word vectors (the
vectors the model starts from) and the length ratio. Every method's threshold is tuned on the
same data it is judged on, so it is cross-validated: stratified 5-fold (tune on 4 folds, macro
F1 on the 5th, mean of the folds), repeated over 10 seeded shuffles and averaged. Also shown:
ROC AUC (no threshold) and the F1 with the threshold tuned on the whole set (an upper bound).
With 100 pairs a set, the F1 moves by several points with the sample: each F1 comes with a 95%
interval from stratified bootstrap resamples of the dev pairs (out-of-fold predictions kept), and
the share of resamples in which the model beats each baseline (a paired comparison).
--model DIR scores a detector saved by `python -m models.bitext.train_divergence` instead of training.
Prints Markdown; the paper's test-set figures (300 pairs each): model 80 / 77, embedding-cosine
baseline 64 / 60 (commoncrawl / opensubs).

One torch thread by default: on a shared 2-core machine a second thread makes training several
times slower, not faster.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PAPER = {"commoncrawl": {"model": 80, "embedding cosine": 64}, "opensubs": {"model": 77, "embedding cosine": 60}}


def stratified_folds(labels: np.ndarray, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """K disjoint index sets, each class dealt round-robin after a shuffle."""
    folds = [[] for _ in range(k)]
    offset = 0
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        for n, i in enumerate(idx):
            folds[(n + offset) % k].append(i)
        offset += len(idx)
    return [np.array(sorted(f)) for f in folds]


def out_of_fold(scores, labels, k: int = 5, repeats: int = 10, seed: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per shuffle of a stratified k-fold split: (the fold of each item, its prediction with the
    threshold tuned on the other k-1 folds)."""
    from models.bitext.divergence import tune_threshold

    scores, labels = np.asarray(scores, float), np.asarray(labels, int)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(repeats):
        fold_of, pred = np.zeros(len(labels), int), np.zeros(len(labels), int)
        for f, test in enumerate(stratified_folds(labels, k, rng)):
            train = np.setdiff1d(np.arange(len(labels)), test)
            th, _ = tune_threshold(scores[train], labels[train])
            fold_of[test], pred[test] = f, (scores[test] >= th).astype(int)
        out.append((fold_of, pred))
    return out


def fold_mean_f1(oof: list[tuple[np.ndarray, np.ndarray]], labels, weights: np.ndarray | None = None) -> np.ndarray:
    """The cross-validated macro F1 (mean over folds, then over shuffles) of out_of_fold's
    predictions; WEIGHTS (B, n), how often each item is drawn in B bootstrap resamples, gives one
    value per resample (None: the sample itself, one value). A class counts in a fold's macro F1
    when it occurs among the fold's labels or predictions, as in models.bitext.divergence.macro_f1."""
    labels = np.asarray(labels, int)
    w = np.ones((1, len(labels))) if weights is None else np.asarray(weights, float)
    per_shuffle = []
    for fold_of, pred in oof:
        per_fold = []
        for f in np.unique(fold_of):
            f1s, present = [], []
            for c in (0, 1):
                tp = w @ ((fold_of == f) & (pred == c) & (labels == c))
                n_pred, n_true = w @ ((fold_of == f) & (pred == c)), w @ ((fold_of == f) & (labels == c))
                denom = n_pred + n_true
                f1s.append(np.divide(2 * tp, denom, out=np.zeros_like(denom), where=denom > 0))
                present.append(denom > 0)
            f1s, present = np.array(f1s), np.array(present)
            per_fold.append((f1s * present).sum(0) / np.maximum(present.sum(0), 1))
        per_shuffle.append(np.mean(per_fold, axis=0))
    return np.mean(per_shuffle, axis=0)


def shuffle_spread(oof: list[tuple[np.ndarray, np.ndarray]], labels) -> tuple[float, float]:
    """(mean, std over the shuffles) of out_of_fold's cross-validated macro F1."""
    per_shuffle = [fold_mean_f1([o], labels)[0] for o in oof]
    return float(np.mean(per_shuffle)), float(np.std(per_shuffle))


def cross_validated_f1(scores, labels, k: int = 5, repeats: int = 10, seed: int = 1) -> tuple[float, float]:
    """(mean, std over repeats) of the k-fold macro F1: the threshold tuned on k-1 folds, the F1
    measured on the held-out fold, averaged over the folds."""
    return shuffle_spread(out_of_fold(scores, labels, k, repeats, seed), labels)


def bootstrap_weights(labels, n: int = 2000, seed: int = 1) -> np.ndarray:
    """(N, len(LABELS)) draw counts of N stratified bootstrap resamples of the labelled pairs
    (each class resampled within itself, so every resample keeps the set's class balance)."""
    labels = np.asarray(labels, int)
    rng = np.random.default_rng(seed)
    w = np.zeros((n, len(labels)))
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        draws = idx[rng.integers(0, len(idx), size=(n, len(idx)))]
        np.add.at(w, (np.arange(n)[:, None], draws), 1)
    return w


def roc_auc(scores, labels) -> float:
    from scipy.stats import rankdata

    labels = np.asarray(labels, int)
    ranks = rankdata(scores)
    pos = labels.sum()
    return float((ranks[labels == 1].sum() - pos * (pos + 1) / 2) / (pos * (len(labels) - pos)))


def read_parallel(prefix: str, limit: int | None) -> tuple[list[str], list[str]]:
    """PREFIX.en and PREFIX.fr (or PREFIX.en.gz and PREFIX.fr.gz), line-aligned."""
    import gzip

    out = []
    for lang in ("en", "fr"):
        path = f"{prefix}.{lang}"
        if not os.path.exists(path):
            path += ".gz"
        with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
            out.append([line.rstrip("\n") for line in f][:limit])
    if len(out[0]) != len(out[1]):
        raise SystemExit(f"{prefix}.en and {prefix}.fr differ in length")
    return out[0], out[1]


def report_dev_sets(devs: dict, detector, embeddings, a) -> None:
    """Print the table: each method's cross-validated macro F1 with its bootstrap interval, the
    upper bound and ROC AUC on each dev set, then how often the model beats each baseline."""
    from models.bitext.divergence import embedding_cosine_scores, length_ratio_scores, tokenize, tune_threshold

    rows, wins = [], []
    for name, dev in devs.items():
        labels = np.array([y for *_, y in dev])
        s_tok = [tokenize(s) for s, _, _ in dev]
        t_tok = [tokenize(t) for _, t, _ in dev]
        methods = {"interaction model": detector.score_tokens(s_tok, t_tok),
                   "embedding cosine": embedding_cosine_scores(s_tok, t_tok, embeddings),
                   "length ratio": length_ratio_scores(s_tok, t_tok)}
        weights = bootstrap_weights(labels, a.bootstrap, a.seed)
        resampled = {}
        for method, scores in methods.items():
            oof = out_of_fold(scores, labels, a.folds, a.repeats, a.seed)
            resampled[method] = fold_mean_f1(oof, labels, weights)
            low, high = np.percentile(resampled[method], [2.5, 97.5])
            rows.append((name, method, *shuffle_spread(oof, labels), low, high,
                         tune_threshold(scores, labels)[1], roc_auc(scores, labels)))
        for baseline in ("embedding cosine", "length ratio"):
            wins.append((name, baseline, float(np.mean(resampled["interaction model"] > resampled[baseline]))))

    print("| dev set | method | macro F1, threshold cross-validated | 95% interval (bootstrap) | macro F1, tuned on "
          "all (upper bound) | ROC AUC | paper (test) |\n|---|---|---:|---:|---:|---:|---:|")
    for name, method, cv, cv_std, low, high, full, auc in rows:
        paper = PAPER.get(name, {}).get("model" if method == "interaction model" else method, "")
        print(f"| {name} | {method} | **{100 * cv:.1f}** ± {100 * cv_std:.1f} | {100 * low:.1f}-{100 * high:.1f} | "
              f"{100 * full:.1f} | {auc:.3f} | {paper} |")
    print(f"\n(± : spread over {a.repeats} shuffles of the {a.folds}-fold split. Interval: 2.5th-97.5th percentile "
          f"of the cross-validated F1 over {a.bootstrap:,} stratified resamples of the dev pairs, thresholds kept.) "
          "The model's cross-validated F1 is above the baseline's in this share of the resamples: "
          + "; ".join(f"{name} vs {baseline} {100 * p:.1f}%" for name, baseline, p in wins) + ".")


def report_members(devs: dict, detector, a) -> None:
    """For an ensemble: each dev set's ROC AUC and cross-validated macro F1 of the mean
    P(equivalent) of its first k members, k = 1 .. all (how much each member adds)."""
    from models.bitext.divergence import tokenize

    singles = detector.member_detectors()
    print("\n| dev set | " + " | ".join(f"first {k}" for k in range(1, len(singles) + 1))
          + " |\n|---|" + "---:|" * len(singles))
    for name, dev in devs.items():
        labels = np.array([y for *_, y in dev])
        s_tok, t_tok = [tokenize(s) for s, _, _ in dev], [tokenize(t) for _, t, _ in dev]
        scores = np.array([d.score_tokens(s_tok, t_tok) for d in singles])
        cells = []
        for k in range(1, len(singles) + 1):
            mean = scores[:k].mean(0)
            cv, _ = cross_validated_f1(mean, labels, a.folds, a.repeats, a.seed)
            cells.append(f"{100 * cv:.1f} ({roc_auc(mean, labels):.3f})")
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    print(f"\n(Members' seeds {', '.join(str(d.cfg.seed) for d in singles)}; each cell: the cross-validated macro F1 "
          "(ROC AUC) of the mean P(equivalent) of the first k members.)")


def report_speed(detector, src: list[str], tgt: list[str]) -> None:
    """Scoring throughput of DETECTOR on SRC/TGT (raw text, tokenised inside), one process."""
    if not src:
        return
    t0 = time.perf_counter()
    detector.score(src, tgt)
    secs = time.perf_counter() - t0
    print(f"\nScoring: {len(src):,} training pairs in {secs:.1f} s, **{len(src) / secs:.0f} pairs/s** "
          f"({detector.cfg.members} member(s), {detector.device}, {os.cpu_count()} CPUs).")


def main() -> None:
    import torch

    from common.cli import UsageError
    from models.bitext.divergence import (ALIGNERS, BilingualEmbeddings, DivergenceConfig, load_divergence_detector,
                                          read_dev_tsv, tokenize, train_divergence)

    d = DivergenceConfig()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data", "divergence"),
                    help="folder with opensubs-parallel.{en,fr} and {commoncrawl,opensubs}.dev.tsv")
    ap.add_argument("--dev", action="append", default=[], metavar="TSV",
                    help="a labelled set to score (header 'english french label ...', label 1 = equivalent), any "
                         "file name; repeat for several (default: commoncrawl.dev.tsv and opensubs.dev.tsv in --data)")
    ap.add_argument("--max_pairs", type=int, help="train on the first N parallel pairs (default: all)")
    ap.add_argument("--extra", action="append", default=[], metavar="PREFIX",
                    help="more en-fr training pairs: PREFIX.en and PREFIX.fr (.gz ok), e.g. "
                         "../shared/data/bitext/multi30k/train (default: none)")
    ap.add_argument("--epochs", type=int, default=d.epochs, help=f"training epochs (default {d.epochs})")
    ap.add_argument("--dim", type=int, default=d.dim, help=f"word-vector size (default {d.dim})")
    ap.add_argument("--hidden", type=int, default=d.hidden, help=f"BiLSTM size per direction (default {d.hidden})")
    ap.add_argument("--channels", default=",".join(map(str, d.channels)),
                    help=f"CNN channels (default {','.join(map(str, d.channels))})")
    ap.add_argument("--train_embeddings", action="store_true", help="fine-tune the SVD word vectors (default: fixed)")
    ap.add_argument("--embeddings", choices=["svd", "random"], default="svd")
    ap.add_argument("--aligner", choices=ALIGNERS, default=d.aligner,
                    help=f"word aligner (default {d.aligner}; eflomal cannot be seeded)")
    ap.add_argument("--batch_size", type=int, default=d.batch_size)
    ap.add_argument("--lr", type=float, default=d.lr)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--partial_negatives", type=int, default=d.partial_negatives,
                    help=f"partial divergences made of each positive (default {d.partial_negatives})")
    ap.add_argument("--average_epochs", type=int, default=d.average_epochs,
                    help=f"weights averaged over the last N epochs' steps, 0 = none (default {d.average_epochs})")
    ap.add_argument("--members", type=int, default=d.members,
                    help=f"detectors averaged, seeds --seed, --seed + 1000, ... (default {d.members}); prints "
                         "also the figures of the first k members for every k")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=10, help="shuffles of the cross-validation (default 10)")
    ap.add_argument("--save", metavar="DIR", help="also save the trained detector here")
    ap.add_argument("--model", metavar="DIR",
                    help="score with this saved detector (python -m models.bitext.train_divergence) instead of training "
                         "one; the embedding-cosine baseline then uses its word vectors")
    ap.add_argument("--speed_pairs", type=int, default=2000,
                    help="time scoring on this many of the training pairs (default 2000; 0: no timing)")
    ap.add_argument("--bootstrap", type=int, default=2000,
                    help="stratified bootstrap resamples of each dev set for the 95%% intervals (default 2000)")
    a = ap.parse_args()
    if a.model and (a.save or a.extra or a.max_pairs):
        ap.error("--model scores a saved detector: --save, --extra and --max_pairs are for training one")
    if a.speed_pairs < 0:
        ap.error(f"--speed_pairs must be at least 0, got {a.speed_pairs}")
    if a.bootstrap < 1:
        ap.error(f"--bootstrap must be at least 1, got {a.bootstrap}")
    torch.set_num_threads(a.threads)
    cfg = DivergenceConfig(dim=a.dim, hidden=a.hidden, channels=tuple(int(c) for c in a.channels.split(",")),
                           epochs=a.epochs, batch_size=a.batch_size, lr=a.lr, seed=a.seed, device="cpu",
                           members=a.members, partial_negatives=a.partial_negatives, average_epochs=a.average_epochs,
                           embeddings=a.embeddings, aligner=a.aligner,
                           freeze_embeddings=a.embeddings == "svd" and not a.train_embeddings, progress=False)
    paths = a.dev or [os.path.join(a.data, f"{name}.dev.tsv") for name in ("commoncrawl", "opensubs")]
    devs = {}
    for path in paths:
        name = os.path.basename(path).split(".")[0] or path
        if name in devs:
            name = path                              # two files of the same name: keep them apart
        try:
            devs[name] = read_dev_tsv(path)
        except (OSError, ValueError, UsageError) as exc:
            ap.error(f"--dev {path}: {exc}")
    dev_sets = ", ".join(f"{k} ({len(v)})" for k, v in devs.items())
    if a.model:
        try:
            detector = load_divergence_detector(a.model, device="cpu")
        except (OSError, UsageError) as exc:
            ap.error(str(exc))
        embeddings = BilingualEmbeddings(detector.src_words, detector.tgt_words,
                                         detector.model.src_embed.weight.detach().numpy(),
                                         detector.model.tgt_embed.weight.detach().numpy())
        print(f"# bench_divergence: the saved detector {a.model}, dev sets {dev_sets}\n", flush=True)
        report_dev_sets(devs, detector, embeddings, a)
        if detector.cfg.members > 1:
            report_members(devs, detector, a)
        parallel = os.path.join(a.data, "opensubs-parallel")
        if a.speed_pairs and os.path.exists(parallel + ".en"):
            report_speed(detector, *read_parallel(parallel, a.speed_pairs))
        return
    src, tgt = read_parallel(os.path.join(a.data, "opensubs-parallel"), a.max_pairs)
    for prefix in a.extra:
        more_src, more_tgt = read_parallel(prefix, None)
        src, tgt = src + more_src, tgt + more_tgt
    print(f"# bench_divergence: {len(src):,} en-fr training pairs"
          f"{' (with ' + ', '.join(a.extra) + ')' if a.extra else ''}, dev sets {dev_sets}, {os.cpu_count()} "
          f"CPUs, {a.threads} torch thread(s)\n", flush=True)
    log = lambda m: print(f"  {m}", file=sys.stderr, flush=True)  # noqa: E731

    t0 = time.time()
    src_tok, tgt_tok = [tokenize(s) for s in src], [tokenize(t) for t in tgt]
    from models.bitext.divergence import word_alignments
    t_align = time.time()
    alignments = word_alignments(src_tok, tgt_tok, a.seed, aligner=a.aligner)
    align_s = time.time() - t_align
    trained = train_divergence(src_tok, tgt_tok, cfg, alignments=alignments, log=log)
    total_s = time.time() - t0
    if a.save:
        trained.detector.save(a.save)
    report_dev_sets(devs, trained.detector, trained.embeddings, a)
    if cfg.members > 1:
        report_members(devs, trained.detector, a)
    if a.speed_pairs:
        report_speed(trained.detector, src[:a.speed_pairs], tgt[:a.speed_pairs])

    r = trained.report
    syn = r["synthetic"]
    print(f"\nSynthetic data: {syn['positives']:,} positives (pairs of <= {cfg.max_train_tokens} tokens a side), "
          f"{syn['negatives']:,} negatives ({syn['short_positives']} positives got fewer than "
          f"{syn['negatives_per_positive']}); dictionary {r['dictionary_pairs']:,} word pairs; vocabularies "
          f"{r['src_words']:,} en / {r['tgt_words']:,} fr; held-out synthetic accuracy "
          f"{r.get('heldout_accuracy', r['epochs'][-1].get('heldout_accuracy', float('nan'))):.3f}"
          + (f" (the first of {cfg.members} members)." if cfg.members > 1 else "."))
    vectors = ("random word vectors, trained" if cfg.embeddings == "random" else
               f"SVD word vectors, {'fixed' if cfg.freeze_embeddings else 'fine-tuned'}")
    print(f"\nModel: {cfg.dim}-dim {vectors}, "
          f"BiLSTM {cfg.hidden}, CNN channels {list(cfg.channels)}, {cfg.epochs} epoch(s), batch {cfg.batch_size}, "
          f"Adam lr {cfg.lr}.")
    epochs = "; ".join(", ".join(f"{e['seconds']:.0f}" for e in m["epochs"]) for m in r.get("members", [r]))
    print(f"\nTraining time: **{total_s / 60:.1f} min** in all: {a.aligner} alignment {align_s:.0f} s, dictionary + "
          f"vectors {r['prep_seconds']:.0f} s, epochs {epochs} s (wall clock; the machine is "
          f"shared: load average {os.getloadavg()[0]:.1f} at the end).")
    print(f"\npeak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
