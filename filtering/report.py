"""Statistics report of a filter run: Markdown + JSON + PNG plots.

- rows kept and rejected per reason (exact, from the job's counts);
- each score's distribution (histogram, kept vs rejected), with its rule's thresholds drawn as
  labelled vertical lines; integer scores get one bin per integer; the y axis is logarithmic where
  the classes differ 100x or one would be unreadable (``use_log_scale``);
- length distributions of references vs paraphrases, as shares of each side's sentences;
- unigram and trigram entropy (bits) and repetition rates of references vs paraphrases
  (Wieting et al. 2017, Table 9): the share of sentences in which a word of >= 3 characters,
  or a word trigram, occurs more than once;
- average IDF (documents = all references and paraphrases);
- diversity per output rank (ParaBank 2, Table 1): mean 1-BLEU, bag-of-pieces ∩/∪ and tree edit
  distance, where those scores were computed.
Text statistics use at most ``max_rows`` rows (the first, in partition order); counts use all.
Plots leave out NaN and infinite values and say how many. The decisions (bins, scale,
threshold lines) are plain functions; ``plot_histogram`` returns the Figure (Agg), ``save_png``
writes it.
"""
from __future__ import annotations

import math
import os
from collections import Counter

import numpy as np

from common.text import tokenize
from common.atomic import replacing, write_json, write_text


def entropy(counts: Counter) -> float:
    total = sum(counts.values())
    if not total:
        return 0.0
    p = np.array(list(counts.values()), dtype=np.float64) / total
    return float(-(p * np.log2(p)).sum())


def text_stats(sentences: list[str]) -> dict:
    toks = [tokenize(s) for s in sentences]
    uni, tri = Counter(), Counter()
    rep_word = rep_tri = 0
    for t in toks:
        uni.update(t)
        grams = [tuple(t[i:i + 3]) for i in range(len(t) - 2)]
        tri.update(grams)
        long_words = Counter(w for w in t if len(w) >= 3)
        rep_word += any(c > 1 for c in long_words.values())
        rep_tri += any(c > 1 for c in Counter(grams).values())
    n = max(len(toks), 1)
    return {"sentences": len(toks), "mean_length": float(np.mean([len(t) for t in toks])) if toks else 0.0,
            "unigram_entropy": entropy(uni), "trigram_entropy": entropy(tri),
            "word_repetition_rate": rep_word / n, "trigram_repetition_rate": rep_tri / n,
            "types": len(uni)}, toks


def average_idf(doc_tokens: list[list[str]], corpora: dict[str, list[list[str]]]) -> dict[str, float]:
    df = Counter()
    for t in doc_tokens:
        df.update(set(t))
    n = len(doc_tokens)
    out = {}
    for name, toks in corpora.items():
        vals = [math.log(n / df[w]) for t in toks for w in t if df[w]]
        out[name] = float(np.mean(vals)) if vals else 0.0
    return out


# ---- plots: the decisions are plain functions (tested without rendering), the drawing is below.

MAX_INTEGER_BINS = 60   # integer scores spanning more integers get integer-aligned bins of several
LOG_RATIO = 100         # classes whose sizes differ this much (or more) are drawn on a log axis
READABLE_SHARE = 0.01   # a class whose tallest bar is under this share of the axis height is unreadable


def split_finite(values) -> tuple[np.ndarray, int]:
    """The finite values of VALUES (float array; None counts as NaN) and how many were left out."""
    v = np.asarray([np.nan if x is None else x for x in values] if isinstance(values, list) else values,
                   dtype=np.float64).ravel()
    keep = np.isfinite(v)
    return v[keep], int((~keep).sum())


def is_integer_valued(values: np.ndarray) -> bool:
    """Whether every finite value of VALUES is an integer (and there is at least one)."""
    v, _ = split_finite(values)
    return bool(v.size) and bool(np.all(v == np.round(v)))


def integer_bins(values, max_bins: int = MAX_INTEGER_BINS) -> np.ndarray | None:
    """Bin edges for integer-valued VALUES: one bin per integer, edges at k - 0.5; where the values
    span more than MAX_BINS integers, bins of ``ceil(span / max_bins)`` integers each (still edges at
    half-integers, each bin holding the same number of integers). None where VALUES has a
    non-integer finite value or none at all."""
    if not is_integer_valued(values):
        return None
    v, _ = split_finite(values)
    lo, hi = float(v.min()), float(v.max())
    span = hi - lo + 1
    width = max(1.0, float(math.ceil(span / max_bins)))
    n = int(math.ceil(span / width))
    edges = lo - 0.5 + width * np.arange(n + 1, dtype=np.float64)
    if not (np.all(np.isfinite(edges)) and np.all(np.diff(edges) > 0)):
        return None   # integers too large for half-integer edges in float64: ordinary bins
    return edges


def score_bins(values, bins: int = 40) -> np.ndarray | None:
    """Bin edges for VALUES: ``integer_bins`` where every finite value is an integer, else BINS
    equal-width bins over the finite values; None where there is no finite value."""
    v, _ = split_finite(values)
    if not v.size:
        return None
    edges = integer_bins(v)
    if edges is not None:
        return edges
    lo, hi = float(v.min()), float(v.max())
    if not np.isfinite(hi - lo):   # a range wider than float64 holds (about ±1e308): halve, space, double
        return np.linspace(lo / 2, hi / 2, bins + 1) * 2
    return np.histogram_bin_edges(v, bins=bins)


def use_log_scale(kept_counts, rejected_counts, ratio: float = LOG_RATIO,
                  readable_share: float = READABLE_SHARE) -> bool:
    """Whether a kept-vs-rejected histogram needs a logarithmic y axis. KEPT_COUNTS and
    REJECTED_COUNTS are per-bin counts (or totals). Log where both classes have rows and either
    their totals differ by RATIO times or more, or one class's tallest bar would be under
    READABLE_SHARE of the other's on a linear axis (a couple of pixels: unreadable). A class with no
    rows leaves the axis linear."""
    a = np.atleast_1d(np.asarray(kept_counts, dtype=np.float64))
    b = np.atleast_1d(np.asarray(rejected_counts, dtype=np.float64))
    ta, tb = a.sum(), b.sum()
    if ta <= 0 or tb <= 0:
        return False
    if max(ta, tb) / min(ta, tb) >= ratio:
        return True
    pa, pb = a.max(), b.max()
    return bool(min(pa, pb) < readable_share * max(pa, pb))


def threshold_lines(rule) -> list[tuple[float, str]]:
    """(x, label) of each threshold of RULE (an object with ``min`` and ``max``, either None): the
    vertical lines drawn on its score's histogram, e.g. ``[(0.4, "min 0.4"), (1.0, "max 1")]``.
    Empty for no rule or a rule without thresholds."""
    if rule is None:
        return []
    out = []
    for name in ("min", "max"):
        value = getattr(rule, name, None)
        if value is not None and np.isfinite(float(value)):
            out.append((float(value), f"{name} {float(value):g}"))
    return out


def y_label(log: bool, shares: bool = False) -> str:
    if shares:
        return "share of sentences" + (" (log scale)" if log else "")
    return "rows (log scale)" if log else "rows"


def _left_out(n: int) -> str:
    return f"{n} nan/inf left out"


def plot_histogram(series: dict[str, object], *, title: str, xlabel: str, rule=None, shares: bool = False,
                   bins: int = 40):
    """A histogram of each class of SERIES {label: values} on one axis, as a matplotlib Figure (Agg
    canvas, not yet saved). Bins from ``score_bins`` over all classes together; y axis rows (log
    where ``use_log_scale`` says so, with two classes), or with SHARES each class's share of its
    own sentences (bars sum to 1 per class), for classes of different sizes. RULE's thresholds are
    drawn as labelled vertical lines. Non-finite values are left out and counted in the legend and
    the title."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    parts = {label: split_finite(v) for label, v in series.items()}
    finite = [v for v, _ in parts.values()]
    allv = np.concatenate(finite) if finite else np.array([])
    edges = score_bins(allv, bins=bins)
    left_out = sum(n for _, n in parts.values())
    log = False
    if edges is not None:
        counts = [np.histogram(v, bins=edges)[0] for v in finite]
        log = not shares and len(counts) == 2 and use_log_scale(counts[0], counts[1])
        for (label, (v, missing)), colour in zip(parts.items(), ("tab:blue", "tab:orange", "tab:green", "tab:red")):
            weights = np.full(v.size, 1.0 / v.size) if shares and v.size else None
            text = f"{label} ({v.size}" + (f"; {_left_out(missing)}" if missing else "") + ")"
            ax.hist(v, bins=edges, weights=weights, alpha=0.55, color=colour, label=text, log=log)
    else:
        ax.text(0.5, 0.5, "no finite values", transform=ax.transAxes, ha="center", va="center")
    for (x, label), style in zip(threshold_lines(rule), ("--", ":")):
        ax.axvline(x, color="black", linestyle=style, linewidth=1.2, label=label)
    heading = title + (f"\nrule: {rule.describe()}" if rule is not None and hasattr(rule, "describe") else "")
    if left_out:
        heading += f" ({_left_out(left_out)})"
    ax.set_title(heading, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(y_label(log, shares))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def save_png(fig, path: str) -> str:
    """Write FIG to PATH as a PNG, whole or not at all."""
    with replacing(path) as tmp:
        fig.savefig(tmp, dpi=90, format="png")
    return path


def write_report(scored_files: list[str], out_dir: str, cfg, manifest: dict, max_rows: int = 1_000_000) -> str:
    """The report of the scored files SCORED_FILES (local paths or URLs) in the local OUT_DIR."""
    from common import storage

    os.makedirs(out_dir, exist_ok=True)
    dataset = storage.parquet_dataset(scored_files)
    names = dataset.schema.names
    score_cols = [c for c in cfg.score_columns if c in names]
    cols = ["reference", "paraphrase", "keep"] + [c for c in ("rank", "pair_id") if c in names] + score_cols
    table = dataset.head(max_rows, columns=cols) if dataset.count_rows() > max_rows else dataset.to_table(columns=cols)
    keep = np.array(table.column("keep").to_pylist(), dtype=bool)
    rule_of = {r.score: r for r in cfg.rules}
    rules = {score: r.describe() for score, r in rule_of.items()}
    report = {"rows": manifest["rows_in"], "kept": manifest["kept"], "rejected": manifest["rows_in"] - manifest["kept"],
              "rejected_by_reason": manifest["rejected_by_reason"], "rules": list(rules.values()),
              "rows_in_text_statistics": table.num_rows, "scores": {}, "plots": []}
    for c in score_cols:
        v = np.array([np.nan if x is None else x for x in table.column(c).to_pylist()], dtype=np.float64)
        fin = v[np.isfinite(v)]
        report["scores"][c] = {"mean": float(fin.mean()) if fin.size else None,
                               "median": float(np.median(fin)) if fin.size else None,
                               "p10": float(np.percentile(fin, 10)) if fin.size else None,
                               "p90": float(np.percentile(fin, 90)) if fin.size else None,
                               "missing": int((~np.isfinite(v)).sum()), "rule": rules.get(c)}
        name = f"hist_{c}.png"
        save_png(plot_histogram({"kept": v[keep], "rejected": v[~keep]}, title=f"{c}: kept vs rejected", xlabel=c,
                                rule=rule_of.get(c)), os.path.join(out_dir, name))
        report["plots"].append(name)
    # references repeat once per paraphrase: count each distinct reference once
    refs = list(dict.fromkeys(table.column("reference").to_pylist()))
    paras = table.column("paraphrase").to_pylist()
    kept_paras = [p for p, k in zip(paras, keep) if k]
    ref_stats, ref_toks = text_stats(refs)
    para_stats, para_toks = text_stats(paras)
    kept_stats, kept_toks = text_stats(kept_paras)
    idf = average_idf(ref_toks + para_toks, {"references": ref_toks, "paraphrases": para_toks,
                                            "kept_paraphrases": kept_toks})
    for s, k in ((ref_stats, "references"), (para_stats, "paraphrases"), (kept_stats, "kept_paraphrases")):
        s["average_idf"] = idf[k]
    report["text"] = {"references": ref_stats, "paraphrases": para_stats, "kept_paraphrases": kept_stats}
    save_png(plot_histogram({"references": np.array([len(t) for t in ref_toks], dtype=float),
                             "paraphrases": np.array([len(t) for t in para_toks], dtype=float)},
                            title="sentence length: references vs paraphrases", xlabel="tokens", shares=True,
                            bins=30), os.path.join(out_dir, "lengths.png"))
    report["plots"].append("lengths.png")
    if "rank" in names:
        ranks = np.array(table.column("rank").to_pylist())
        div_cols = [c for c in ("one_minus_bleu", "pieces_iou", "tree_edit_distance") if c in score_cols]
        per_rank = {}
        for r in sorted(set(ranks.tolist())):
            sel = ranks == r
            row = {"rows": int(sel.sum())}
            for c in div_cols:
                v = np.array([np.nan if x is None else x for x in table.column(c).to_pylist()], dtype=float)[sel]
                row[c] = float(np.nanmean(v)) if np.isfinite(v).any() else None
            per_rank[int(r)] = row
        report["diversity_by_rank"] = per_rank
    write_json(os.path.join(out_dir, "report.json"), report)
    return write_text(os.path.join(out_dir, "report.md"), markdown(report))


def _fmt(v, digits=3):
    return "-" if v is None else (f"{v:.{digits}f}" if isinstance(v, float) else str(v))


def markdown(r: dict) -> str:
    lines = ["# Filter report", "", f"Rows: {r['rows']}; kept {r['kept']} ({100 * r['kept'] / max(r['rows'], 1):.1f}%), "
             f"rejected {r['rejected']}.", "", "Rules: " + ("; ".join(r["rules"]) or "none") + ".", "",
             "## Rejections by reason (a row may have several)", "", "| reason | rows |", "|---|---:|"]
    lines += [f"| `{k}` | {v} |" for k, v in r["rejected_by_reason"].items()] or ["| (none) | 0 |"]
    lines += ["", "## Scores", "", "| score | mean | median | p10 | p90 | missing | rule |", "|---|---:|---:|---:|---:|---:|---|"]
    for c, s in r["scores"].items():
        lines.append(f"| {c} | {_fmt(s['mean'])} | {_fmt(s['median'])} | {_fmt(s['p10'])} | {_fmt(s['p90'])} | "
                     f"{s['missing']} | {s['rule'] or '-'} |")
    lines += ["", f"## References vs paraphrases (first {r['rows_in_text_statistics']} rows)", "",
              "| | sentences | mean length | types | unigram entropy | trigram entropy | word repetition | "
              "trigram repetition | average IDF |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in r["text"].items():
        lines.append(f"| {name} | {s['sentences']} | {s['mean_length']:.2f} | {s['types']} | {s['unigram_entropy']:.2f} | "
                     f"{s['trigram_entropy']:.2f} | {100 * s['word_repetition_rate']:.2f}% | "
                     f"{100 * s['trigram_repetition_rate']:.2f}% | {s['average_idf']:.3f} |")
    if r.get("diversity_by_rank"):
        cols = [c for c in ("one_minus_bleu", "pieces_iou", "tree_edit_distance")
                if any(v.get(c) is not None for v in r["diversity_by_rank"].values())]
        lines += ["", "## Diversity by rank (ParaBank 2, Table 1)", "",
                  "| rank | rows | " + " | ".join(cols) + " |", "|---:|---:|" + "---:|" * len(cols)]
        for rank, v in r["diversity_by_rank"].items():
            lines.append(f"| {rank} | {v['rows']} | " + " | ".join(_fmt(v.get(c)) for c in cols) + " |")
    lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in r["plots"]]
    return "\n".join(lines) + "\n"
