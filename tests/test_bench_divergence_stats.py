"""The statistics of bench/bench_divergence.py: cross-validated macro F1 and its bootstrap
interval, checked against a direct computation with models.bitext.divergence's own F1 and threshold."""
import importlib.util
import os

import numpy as np
import pytest

from models.bitext.divergence import macro_f1, tune_threshold

_spec = importlib.util.spec_from_file_location(
    "bench_divergence", os.path.join(os.path.dirname(__file__), "..", "bench", "bench_divergence.py"))
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def noisy_scores(seed: int, n: int = 100) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    return rng.normal(size=n) + labels * rng.uniform(0.5, 2), labels


def direct_cross_validated_f1(scores, labels, k=5, repeats=10, seed=1) -> float:
    rng, per_shuffle = np.random.default_rng(seed), []
    for _ in range(repeats):
        per_fold = []
        for test in bench.stratified_folds(labels, k, rng):
            train = np.setdiff1d(np.arange(len(labels)), test)
            threshold, _ = tune_threshold(scores[train], labels[train])
            per_fold.append(macro_f1((scores[test] >= threshold).astype(int), labels[test]))
        per_shuffle.append(np.mean(per_fold))
    return float(np.mean(per_shuffle))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cross_validated_f1_is_the_mean_over_held_out_folds(seed):
    scores, labels = noisy_scores(seed)
    assert bench.cross_validated_f1(scores, labels)[0] == pytest.approx(direct_cross_validated_f1(scores, labels))
    assert bench.cross_validated_f1(labels + 0.1 * np.arange(100) / 100, labels)[0] == 1.0   # separable


def test_bootstrap_weights_keep_each_class_count():
    _, labels = noisy_scores(3)
    w = bench.bootstrap_weights(labels, n=50, seed=7)
    assert w.shape == (50, 100) and np.all(w >= 0)
    assert np.all(w[:, labels == 1].sum(1) == labels.sum()) and np.all(w[:, labels == 0].sum(1) == 100 - labels.sum())
    assert len({tuple(row) for row in w}) == 50                    # resamples differ from each other


def test_weighted_f1_equals_the_f1_of_the_resample_drawn():
    scores, labels = noisy_scores(4)
    oof = bench.out_of_fold(scores, labels, repeats=3)
    w = bench.bootstrap_weights(labels, n=4, seed=2)
    for b in range(4):
        idx = np.repeat(np.arange(100), w[b].astype(int))          # the resample, items repeated
        direct = np.mean([np.mean([macro_f1(pred[idx][fold_of[idx] == f], labels[idx][fold_of[idx] == f])
                                   for f in np.unique(fold_of[idx])]) for fold_of, pred in oof])
        assert bench.fold_mean_f1(oof, labels, w)[b] == pytest.approx(direct)
    assert bench.fold_mean_f1(oof, labels)[0] == pytest.approx(np.mean(
        [bench.fold_mean_f1([o], labels)[0] for o in oof]))
