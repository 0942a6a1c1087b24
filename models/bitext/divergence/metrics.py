"""Judging a detector on labelled pairs: macro F1, the threshold that maximises it, and the
labelled development files (the divergence sets' TSV)."""
from __future__ import annotations

import numpy as np

from common.cli import UsageError


def macro_f1(pred, labels) -> float:
    """Mean over the classes present in LABELS or PRED of each class's F1 (a class never
    predicted, or never right, has F1 0)."""
    pred, labels = np.asarray(pred).astype(int), np.asarray(labels).astype(int)
    if pred.shape != labels.shape:
        raise ValueError(f"{pred.shape[0]} predictions for {labels.shape[0]} labels")
    classes = sorted(set(pred.tolist()) | set(labels.tolist()))
    if not classes:
        return 0.0
    f1s = []
    for c in classes:
        tp = int(((pred == c) & (labels == c)).sum())
        denom = int((pred == c).sum()) + int((labels == c).sum())
        f1s.append(2 * tp / denom if denom else 0.0)
    return float(np.mean(f1s))


def tune_threshold(scores, labels) -> tuple[float, float]:
    """(threshold, macro F1) maximising the macro F1 of 'equivalent (1) if score >= threshold'
    on (SCORES, LABELS). Candidates: below every score, and midway between consecutive distinct
    scores; the lowest of equally good thresholds wins."""
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels).astype(int)
    if scores.shape != labels.shape or scores.size == 0:
        raise ValueError("tune_threshold needs as many scores as labels, at least one")
    if not np.all(np.isfinite(scores)):
        raise ValueError("scores must be finite")
    u = np.unique(scores)
    candidates = np.concatenate([[u[0] - 1.0], (u[:-1] + u[1:]) / 2, [u[-1] + 1.0]])
    best = (None, -1.0)
    for th in candidates:
        f = macro_f1((scores >= th).astype(int), labels)
        if f > best[1] + 1e-12:
            best = (float(th), f)
    return best


LANGUAGE_NAMES = {"en": "english", "fr": "french", "de": "german", "cs": "czech", "es": "spanish", "it": "italian"}


def read_dev_tsv(path: str, src_lang: str = "en", tgt_lang: str = "fr") -> list[tuple[str, str, int]]:
    """(source, target, label) rows of a labelled development file: tab-separated, no quoting
    (quotes are text), a header naming two text columns then 'label' (the divergence sets:
    'english french label agreement'; label 1 = equivalent). The text columns are swapped when
    the header names them in the other order than SRC_LANG, TGT_LANG."""
    import csv
    import gzip

    from common import storage

    with storage.open_input(path) as raw:
        data = raw.read()
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    reader = csv.reader(data.decode("utf-8").splitlines(), delimiter="\t", quoting=csv.QUOTE_NONE)
    header = next(reader, None)
    if not header or len(header) < 3 or header[2].strip().lower() != "label":
        raise UsageError(f"{path}: expected a header '<source><TAB><target><TAB>label ...', got {header!r}")
    names = [h.strip().lower() for h in header[:2]]
    swap = [LANGUAGE_NAMES.get(tgt_lang, tgt_lang), LANGUAGE_NAMES.get(src_lang, src_lang)] == names
    rows = []
    for n, row in enumerate(reader, 2):
        if not row:
            continue
        if len(row) < 3 or row[2].strip() not in ("0", "1"):
            raise UsageError(f"{path}:{n}: expected source<TAB>target<TAB>label (0 or 1)")
        a, b = (row[1], row[0]) if swap else (row[0], row[1])
        rows.append((a, b, int(row[2])))
    if not rows:
        raise UsageError(f"{path}: no labelled pairs")
    return rows
