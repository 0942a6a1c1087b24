"""Sentence-alignment recovery: how often a similarity finds a sentence's translation among all
the sentences of the other side (the evaluation of Kim et al. 2019, §5).

The target side of a line-aligned bitext is shuffled (seeded); every source sentence is matched
to its most similar target sentence and every target sentence to its most similar source, and the
error rate is the fraction matched to a wrong sentence, in both directions and their mean. A
recovered sentence whose text equals the right one's (a duplicate line) counts as correct: no
similarity can tell two copies apart. Similarities: cosine, euclidean, CSLS and the two LASER
margins over the encoder's embeddings (models/bitext/similarity.py), the MLP pair classifier when given
(models/bitext/pair_classifier.py), and two baselines that need no model: Levenshtein distance between
the raw strings (rapidfuzz) and the difference of character lengths. Ties are broken by the
shuffled order, so a baseline that cannot tell sentences apart scores near chance, not zero.

The command ``paragen-align`` (models/bitext/align.py) runs it on a bitext with a trained encoder.
"""
from __future__ import annotations

import logging
import time
from typing import Sequence

import numpy as np

from models.bitext import similarity
from common.cli import UsageError

log = logging.getLogger("paragen.alignment")

METHODS = similarity.METHODS
BASELINES = ("levenshtein", "length")
MLP_FULL_LIMIT = 2000          # up to this many sentences the MLP scores every pair (n^2 MLP passes)
MLP_CANDIDATES = 32            # above it, the MLP reranks this many cosine neighbours per sentence
EDIT_BLOCK = 1 << 24           # edit distances per rapidfuzz call (int32: 64 MiB)
MAX_LINE_BYTES = 100_000       # input lines are cut here


# ---------------------------------------------------------------------------- baselines
def nearest_by_edit_distance(queries: Sequence[str], base: Sequence[str], workers: int = -1
                             ) -> tuple[np.ndarray, np.ndarray]:
    """(for each query the base string at the smallest Levenshtein distance, for each base string
    the nearest query), from one blocked pass of rapidfuzz.process.cdist (WORKERS threads, -1 =
    all cores). Ties go to the lower index."""
    from rapidfuzz import process
    from rapidfuzz.distance import Levenshtein

    fwd = np.empty(len(queries), dtype=np.int64)
    col_best = np.full(len(base), np.iinfo(np.int32).max, dtype=np.int64)
    col_arg = np.zeros(len(base), dtype=np.int64)
    rows = max(1, EDIT_BLOCK // max(1, len(base)))
    for start in range(0, len(queries), rows):
        dist = process.cdist(queries[start:start + rows], base, scorer=Levenshtein.distance, dtype=np.int32,
                             workers=workers)
        fwd[start:start + rows] = dist.argmin(1)
        low, arg = dist.min(0), dist.argmin(0) + start
        better = low < col_best                         # strict: an earlier query keeps a tie
        col_best[better], col_arg[better] = low[better], arg[better]
    return fwd, col_arg


def nearest_by_length(queries: Sequence[str], base: Sequence[str]) -> np.ndarray:
    """For each query the base string whose character length is nearest (a tie between a shorter
    and a longer one goes to the shorter; among strings of one length, the lowest index)."""
    q = np.array([len(s) for s in queries], dtype=np.int64)
    b = np.array([len(s) for s in base], dtype=np.int64)
    order = np.argsort(b, kind="stable")                # equal lengths keep index order
    lengths = b[order]
    pos = np.searchsorted(lengths, q)                   # first base length >= query length
    hi, lo = np.minimum(pos, len(b) - 1), np.maximum(pos - 1, 0)
    chosen = np.where(np.abs(q - lengths[lo]) <= np.abs(lengths[hi] - q), lengths[lo], lengths[hi])
    return order[np.searchsorted(lengths, chosen)]      # the first base string of that length


# ---------------------------------------------------------------------------- the evaluation
def bootstrap_interval(per_pair_errors: np.ndarray, seed: int = 0, resamples: int = 1000, level: float = 0.95,
                       chunk: int = 50) -> tuple[float, float]:
    """LEVEL percentile interval of the mean of PER_PAIR_ERRORS over bootstrap resamples of the
    pairs: how far the error rate of another sample of pairs this size might fall. Resampled in
    chunks so a million pairs take chunk x n memory, not resamples x n."""
    errors = np.asarray(per_pair_errors, dtype=np.float64)
    if errors.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = np.concatenate([errors[rng.integers(0, errors.size, (min(chunk, resamples - start), errors.size))].mean(1)
                            for start in range(0, resamples, chunk)])
    low, high = np.percentile(means, [50 * (1 - level), 50 * (1 + level)])
    return float(low), float(high)


def _mlp_matches(mlp, e_src, e_tgt, candidates: int | None) -> tuple[np.ndarray, np.ndarray, int | None]:
    """(best target per source, best source per target, candidates used or None for all pairs)."""
    if candidates is None and len(e_src) <= MLP_FULL_LIMIT:
        probs = mlp.score_matrix(e_src, e_tgt)
        return probs.argmax(1), probs.argmax(0), None
    c = min(candidates or MLP_CANDIDATES, len(e_tgt), len(e_src))
    _, fwd_idx = similarity.nearest(e_src, e_tgt, c)
    _, bwd_idx = similarity.nearest(e_tgt, e_src, c)
    fwd = fwd_idx[np.arange(len(e_src)), mlp.score_candidates(e_src, e_tgt, fwd_idx).argmax(1)]
    bwd = bwd_idx[np.arange(len(e_tgt)), mlp.score_candidates(e_tgt, e_src, bwd_idx, queries_are_source=False
                                                              ).argmax(1)]
    return fwd, bwd, c


def recover_alignment(src: Sequence[str], tgt: Sequence[str], encoder=None, embeddings=None,
                      methods: Sequence[str] = METHODS, k: int = 4, mlp=None, seed: int = 0,
                      baselines: Sequence[str] = BASELINES, src_lang: str | None = None, tgt_lang: str | None = None,
                      workers: int = -1, mlp_candidates: int | None = None, exact: bool | None = None,
                      threads: int | None = None, groups: dict[str, Sequence] | None = None) -> dict:
    """Error rates of recovering the alignment of SRC[i] <-> TGT[i] after shuffling TGT (SEED).

    Embeddings come from ENCODER (``encode(sentences, lang)``, languages from its cfg unless
    SRC_LANG / TGT_LANG are given) or from EMBEDDINGS, a pair of arrays line-aligned with SRC and
    TGT (shuffled here with the sentences). K: neighbours of CSLS and the margins. MLP: a
    PairClassifier; with MLP_CANDIDATES None it scores every pair up to MLP_FULL_LIMIT sentences
    and reranks the MLP_CANDIDATES nearest by cosine above; an integer always reranks that many.
    GROUPS: {breakdown name: a label per pair}, e.g. {"source words": ["1-9", "10-14", ...]}; each
    method's error is then also given per label, in "by": {breakdown: {label: {"pairs", "mean"}}}.
    Returns {"n", "seed", "k", "methods": {name: {"src2tgt", "tgt2src", "mean", "interval",
    "seconds"[, "by"]}}, ...}; errors are fractions, "interval" the 95% bootstrap interval of "mean"."""
    n = len(src)
    if len(tgt) != n:
        raise UsageError(f"the two sides differ in length: {n} source and {len(tgt)} target sentences")
    if n < 2:
        raise UsageError(f"alignment recovery needs at least 2 sentence pairs, got {n}")
    unknown = [m for m in methods if m not in METHODS] + [b for b in baselines if b not in BASELINES]
    if unknown:
        raise UsageError(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS + BASELINES)}")
    if encoder is not None and embeddings is not None:
        raise ValueError("give either an encoder or precomputed embeddings, not both")
    groups = {name: np.asarray(labels, dtype=object) for name, labels in (groups or {}).items()}
    for name, labels in groups.items():
        if len(labels) != n:
            raise ValueError(f"breakdown {name!r}: {len(labels)} labels for {n} sentence pairs")
    if (methods or mlp is not None) and encoder is None and embeddings is None:
        raise ValueError("the embedding similarities need an encoder or precomputed embeddings")

    perm = np.random.default_rng(seed).permutation(n)   # shuffled target j is original target perm[j]
    src_text = np.array(src, dtype=object)
    tgt_text = np.array(tgt, dtype=object)
    tgt_shuffled = tgt_text[perm]
    expected_fwd, expected_bwd = tgt_text, src_text[perm]   # the right answers' texts
    results = {"n": n, "seed": seed, "k": k, "methods": {}}

    def record(name: str, fwd: np.ndarray, bwd: np.ndarray, seconds: float, **extra) -> None:
        # a query errs when its pick is not (a copy of) the expected sentence
        fwd_wrong, bwd_wrong = tgt_shuffled[fwd] != expected_fwd, src_text[bwd] != expected_bwd
        e_f, e_b = float(fwd_wrong.mean()), float(bwd_wrong.mean())
        per_pair = fwd_wrong.astype(float)          # pair i: source i's pick, and
        per_pair[perm] += bwd_wrong                 # its target's (shuffled to position j)
        results["methods"][name] = {"src2tgt": e_f, "tgt2src": e_b, "mean": (e_f + e_b) / 2,
                                    "interval": bootstrap_interval(per_pair / 2, seed),
                                    "seconds": round(seconds, 3), **extra}
        if groups:
            results["methods"][name]["by"] = {breakdown: _by_label(per_pair / 2, labels)
                                              for breakdown, labels in groups.items()}
        log.info("%s: error %.2f%% src->tgt, %.2f%% tgt->src (%.1fs)", name, 100 * e_f, 100 * e_b, seconds)

    if methods or mlp is not None:
        e_src, e_tgt = _embeddings(src, tgt_shuffled, perm, encoder, embeddings, src_lang, tgt_lang, results)
        for method in methods:
            t0 = time.perf_counter()
            fwd, bwd = similarity.mine_both(e_src, e_tgt, method, k, exact=exact, threads=threads)
            record(method, fwd.index, bwd.index, time.perf_counter() - t0, exact=fwd.exact and bwd.exact)
        if mlp is not None:
            if mlp.dim != e_src.shape[1]:
                raise UsageError(f"the MLP reads {mlp.dim}-dimensional embeddings, the encoder gives {e_src.shape[1]}")
            t0 = time.perf_counter()
            fwd, bwd, used = _mlp_matches(mlp, e_src, e_tgt, mlp_candidates)
            record("mlp", fwd, bwd, time.perf_counter() - t0, candidates=used)
    if "levenshtein" in baselines:
        t0 = time.perf_counter()
        fwd, bwd = nearest_by_edit_distance(list(src_text), list(tgt_shuffled), workers)
        record("levenshtein", fwd, bwd, time.perf_counter() - t0)
    if "length" in baselines:
        t0 = time.perf_counter()
        fwd, bwd = nearest_by_length(src_text, tgt_shuffled), nearest_by_length(tgt_shuffled, src_text)
        record("length", fwd, bwd, time.perf_counter() - t0)
    return results


def _by_label(errors: np.ndarray, labels: np.ndarray) -> dict:
    """{label: {"pairs", "mean"}}: the pairs of each label and their mean error."""
    out = {}
    for label in dict.fromkeys(labels):
        mask = labels == label
        out[label] = {"pairs": int(mask.sum()), "mean": float(errors[mask].mean())}
    return out


def _embeddings(src, tgt_shuffled, perm, encoder, embeddings, src_lang, tgt_lang, results: dict):
    """(source embeddings, shuffled target embeddings) as float32 arrays."""
    if embeddings is not None:
        e_src, e_tgt = (similarity.as_float32(x) for x in embeddings)
        if len(e_src) != len(src) or len(e_tgt) != len(src) or e_src.shape[1] != e_tgt.shape[1]:
            raise ValueError(f"embeddings of shapes {e_src.shape} and {e_tgt.shape} do not match "
                             f"{len(src)} sentence pairs")
        return e_src, e_tgt[perm]
    src_lang = src_lang or encoder.cfg.src_lang
    tgt_lang = tgt_lang or encoder.cfg.tgt_lang
    results.update(src_lang=src_lang, tgt_lang=tgt_lang)
    t0 = time.perf_counter()
    e_src = similarity.as_float32(encoder.encode(list(src), src_lang))
    e_tgt = similarity.as_float32(encoder.encode(list(tgt_shuffled), tgt_lang))
    results["encode_seconds"] = round(time.perf_counter() - t0, 3)
    log.info("encoded %d + %d sentences in %.1fs", len(e_src), len(e_tgt), results["encode_seconds"])
    return e_src, e_tgt


def markdown(results: dict, title: str = "") -> str:
    head = title or (f"Alignment recovery: {results['n']:,} sentence pairs"
                     + (f" {results['src_lang']}-{results['tgt_lang']}" if results.get("src_lang") else "")
                     + f", target side shuffled with seed {results['seed']}, k={results['k']}")
    lines = [f"### {head}", "", "| method | src->tgt error % | tgt->src error % | mean error % | 95% interval "
             "(bootstrap over pairs) | s |", "|---|---:|---:|---:|---:|---:|"]
    for name, r in results["methods"].items():
        label = name + (" (baseline)" if name in BASELINES else "")
        if name == "mlp" and r.get("candidates"):
            label += f" (reranks {r['candidates']} cosine neighbours)"
        low, high = r["interval"]
        lines.append(f"| {label} | {100 * r['src2tgt']:.2f} | {100 * r['tgt2src']:.2f} | {100 * r['mean']:.2f} | "
                     f"{100 * low:.2f}-{100 * high:.2f} | {r['seconds']:.1f} |")
    return "\n".join(lines) + "\n"


def markdown_breakdown(results: dict, breakdown: str, methods: Sequence[str], order: Sequence[str] | None = None
                       ) -> str:
    """One row per label of BREAKDOWN (in ORDER, default sorted): its pairs and each of METHODS'
    mean error there, %."""
    first = results["methods"][methods[0]]["by"][breakdown]
    labels = list(order) if order is not None else sorted(first)
    lines = [f"| {breakdown} | pairs | " + " | ".join(f"{m} error %" for m in methods) + " |",
             "|---|---:|" + "---:|" * len(methods)]
    for label in labels:
        if label not in first:
            continue
        cells = [f"{100 * results['methods'][m]['by'][breakdown][label]['mean']:.2f}" for m in methods]
        lines.append(f"| {label} | {first[label]['pairs']:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- command line
def read_lines(path: str, limit: int | None = None) -> list[str]:
    """Lines of a one-sentence-per-line file (plain or compressed by suffix, local or URL), without
    their line ends; at most LIMIT. Every line is kept (blank ones too) so both sides stay aligned;
    a line over MAX_LINE_BYTES is cut there (no sentence is that long; the file may be hostile)."""
    from common.shards import bounded_lines, open_binary

    out, cut = [], 0
    with open_binary(path) as f:
        for number, (raw, overlong) in enumerate(bounded_lines(f, MAX_LINE_BYTES), 1):
            if limit is not None and len(out) >= limit:
                break
            cut += overlong
            try:
                # a cut line may end inside a character: only then are broken bytes dropped
                out.append(raw.decode("utf-8", errors="ignore" if overlong else "strict"))
            except UnicodeDecodeError as exc:
                raise UsageError(f"{path}: line {number} is not UTF-8 (byte {exc.start})") from None
    if cut:
        log.warning("%s: %d line(s) longer than %d bytes were cut", path, cut, MAX_LINE_BYTES)
    return out
