"""An n-gram estimator that writes ARPA for the ``kenlm`` module to query.

The ``kenlm`` wheel only queries models; its estimator (lmplz) needs a C++ build with Boost. This
writes the same kind of model lmplz does, interpolated Kneser-Ney with one discount per order
(D = n1 / (n1 + 2 n2) from the counts of counts, 0.5 when that is undefined, like lmplz's
--discount_fallback), so the LM filter works from a plain pip install. For large corpora, train
with lmplz and pass the file as the filter's ``model``.

Lower orders use continuation counts (distinct left contexts) except for n-grams that start with
<s>, which keep raw counts (nothing precedes <s>). The unigram distribution is interpolated with
the uniform distribution over the vocabulary plus <unk>.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Iterable

from common.atomic import replacing

BOS, EOS, UNK = "<s>", "</s>", "<unk>"


def _discount(counts: Counter) -> float:
    coc = Counter(c for c in counts.values() if c <= 2)
    n1, n2 = coc[1], coc[2]
    d = n1 / (n1 + 2 * n2) if n1 and n2 else 0.5
    return min(max(d, 0.1), 0.9)


def estimate(sentences: Iterable[list[str]], order: int = 3) -> dict[int, dict[tuple, tuple[float, float | None]]]:
    """{n: {ngram: (log10 prob, log10 backoff or None)}} of an interpolated Kneser-Ney model."""
    if order < 1:
        raise ValueError("order must be >= 1")
    raw = [Counter() for _ in range(order + 1)]            # raw[n][ngram]
    n_sent = 0
    for toks in sentences:
        words = [BOS] + [t for t in toks if t not in (BOS, EOS, UNK) and not any(c.isspace() for c in t)] + [EOS]
        n_sent += 1
        for n in range(1, order + 1):
            for i in range(len(words) - n + 1):
                raw[n][tuple(words[i:i + n])] += 1
    if not n_sent:
        raise ValueError("no sentences to estimate a language model from")
    # adjusted counts: highest order raw; lower orders continuation counts, except <s>-initial
    adj = [Counter() for _ in range(order + 1)]
    adj[order] = raw[order]
    for n in range(order - 1, 0, -1):
        cont = Counter(g[1:] for g in raw[n + 1])
        for g, c in raw[n].items():
            adj[n][g] = c if g[0] == BOS else cont.get(g, 0)
        for g in list(adj[n]):
            if adj[n][g] == 0 and g != (BOS,):
                del adj[n][g]
    probs: dict[int, dict[tuple, float]] = {}
    gammas: dict[int, dict[tuple, float]] = {}
    # unigrams
    d1 = _discount(adj[1])
    uni = {g: c for g, c in adj[1].items() if g != (BOS,)}
    total = sum(uni.values())
    gamma0 = d1 * len(uni) / total
    n_types = len(uni) + 1                                   # + <unk>
    probs[1] = {g: max(c - d1, 0) / total + gamma0 / n_types for g, c in uni.items()}
    probs[1][(UNK,)] = gamma0 / n_types
    for n in range(2, order + 1):
        d = _discount(adj[n])
        ctx_total, ctx_types = defaultdict(int), defaultdict(int)
        for g, c in adj[n].items():
            ctx_total[g[:-1]] += c
            ctx_types[g[:-1]] += 1
        gammas[n - 1] = {h: d * ctx_types[h] / ctx_total[h] for h in ctx_total}
        probs[n] = {}
        for g, c in adj[n].items():
            h = g[:-1]
            lower = _interp(probs, gammas, g[1:])
            probs[n][g] = max(c - d, 0) / ctx_total[h] + gammas[n - 1][h] * lower
    model = {}
    for n in range(1, order + 1):
        model[n] = {}
        for g, p in probs[n].items():
            bo = gammas.get(n, {}).get(g) if n < order else None
            model[n][g] = (math.log10(p), None if bo is None else math.log10(bo))
        if n == 1:
            model[1][(BOS,)] = (-99.0, math.log10(gammas[1][(BOS,)]) if order > 1 and (BOS,) in gammas.get(1, {})
                                else None)
    return model


def _interp(probs, gammas, g: tuple) -> float:
    """p(g[-1] | g[:-1]) by backing off through lower orders (for probabilities not stored)."""
    n = len(g)
    if n == 1:
        return probs[1].get(g, probs[1][(UNK,)])
    if g in probs.get(n, {}):
        return probs[n][g]
    return gammas.get(n - 1, {}).get(g[:-1], 1.0) * _interp(probs, gammas, g[1:])


def write_arpa(sentences: Iterable[list[str]], path: str, order: int = 3) -> str:
    """Estimate on SENTENCES (token lists) and write PATH atomically."""
    model = estimate(sentences, order)
    with replacing(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write("\n\\data\\\n")
        for n in range(1, order + 1):
            f.write(f"ngram {n}={len(model[n])}\n")
        for n in range(1, order + 1):
            f.write(f"\n\\{n}-grams:\n")
            for g in sorted(model[n]):
                lp, bo = model[n][g]
                line = f"{lp:.6f}\t{' '.join(g)}"
                if bo is not None:
                    line += f"\t{bo:.6f}"
                f.write(line + "\n")
        f.write("\n\\end\\\n")
    return path
