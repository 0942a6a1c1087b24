"""Statistics report of a filter run: Markdown + JSON + PNG plots.

- rows kept and rejected per reason (exact, from the job's counts);
- each score's distribution (histogram, kept vs rejected), with its rule;
- length distributions of references vs paraphrases;
- unigram and trigram entropy (bits) and repetition rates of references vs paraphrases
  (Wieting et al. 2017, Table 9): the share of sentences in which a word of >= 3 characters,
  or a word trigram, occurs more than once;
- average IDF (documents = all references and paraphrases);
- diversity per output rank (ParaBank 2, Table 1): mean 1-BLEU, bag-of-pieces ∩/∪ and tree edit
  distance, where those scores were computed.
Text statistics use at most ``max_rows`` rows (the first, in partition order); counts use all.
"""
from __future__ import annotations

import math
import os
from collections import Counter

import numpy as np

from common.text import tokenize
from common.atomic import write_json, write_text


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


def _plot_hist(path: str, title: str, series: dict[str, np.ndarray], bins: int = 40, rule: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    finite = [v[np.isfinite(v)] for v in series.values()]
    allv = np.concatenate(finite) if finite else np.array([])
    edges = np.histogram_bin_edges(allv, bins=bins) if allv.size else bins
    for (label, _), v in zip(series.items(), finite):
        if v.size:
            ax.hist(v, bins=edges, alpha=0.6, label=f"{label} ({v.size})")
    ax.set_title(title + (f"\nrule: {rule}" if rule else ""), fontsize=10)
    ax.set_ylabel("rows")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


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
    rules = {r.score: r.describe() for r in cfg.rules}
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
        _plot_hist(os.path.join(out_dir, name), c, {"kept": v[keep], "rejected": v[~keep]}, rule=rules.get(c, ""))
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
    _plot_hist(os.path.join(out_dir, "lengths.png"), "sentence length (tokens)",
               {"references": np.array([len(t) for t in ref_toks], dtype=float),
                "paraphrases": np.array([len(t) for t in para_toks], dtype=float)}, bins=30)
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
