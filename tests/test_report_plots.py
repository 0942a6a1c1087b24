"""Report plots (filtering/report.py): bins, y scale, threshold lines, labels, non-finite values.
The decisions are checked as plain functions; the drawing on the returned matplotlib Figure."""
from dataclasses import dataclass

import numpy as np
import pytest

from filtering.report import (integer_bins, is_integer_valued, plot_histogram, save_png, score_bins,
                              split_finite, threshold_lines, use_log_scale)


@dataclass
class StubRule:
    """The fields of a filter rule the plots read (filtering.config's rules have the same)."""
    score: str
    direction: str
    min: float | None = None
    max: float | None = None

    def describe(self) -> str:
        return f"{self.score} min={self.min} max={self.max}"


def _vlines(ax) -> dict[str, float]:
    """{label: x} of the vertical lines on AX (lines whose two x data are equal)."""
    out = {}
    for line in ax.get_lines():
        x = np.asarray(line.get_xdata(), dtype=float)
        if x.size == 2 and x[0] == x[1]:
            out[line.get_label()] = float(x[0])
    return out


def _bar_heights(ax) -> np.ndarray:
    return np.array([p.get_height() for p in ax.patches])


# ---- bins

def test_integer_data_gets_one_bin_per_integer_at_half_integers():
    edges = integer_bins(np.array([3, 5, 5, 7, 4, 3], dtype=float))
    np.testing.assert_array_equal(edges, [2.5, 3.5, 4.5, 5.5, 6.5, 7.5])
    counts, _ = np.histogram([3, 5, 5, 7, 4, 3], bins=edges)
    assert counts.tolist() == [2, 1, 2, 0, 1]
    # score_bins takes the same path for integer data, whatever the number of bins asked for
    np.testing.assert_array_equal(score_bins(np.array([3, 5, 7.0]), bins=40), [2.5, 3.5, 4.5, 5.5, 6.5, 7.5])
    np.testing.assert_array_equal(integer_bins(np.array([4.0, 4.0])), [3.5, 4.5])


def test_wide_integer_range_gets_integer_aligned_wider_bins():
    values = np.arange(0, 1000, dtype=float)  # 1000 integers
    edges = integer_bins(values, max_bins=60)
    widths = np.diff(edges)
    assert len(edges) - 1 <= 60
    assert np.all(widths == widths[0]) and widths[0] == np.ceil(1000 / 60) and widths[0] == int(widths[0])
    assert edges[0] == -0.5 and edges[-1] >= 999.5
    assert np.all(np.mod(edges, 1) == 0.5)  # every edge between two integers
    counts, _ = np.histogram(values, bins=edges)
    assert counts.sum() == 1000 and set(counts[:-1].tolist()) == {int(widths[0])}


def test_non_integer_data_gets_ordinary_bins():
    values = np.array([0.1, 0.25, 0.5, 0.75, 0.9])
    assert integer_bins(values) is None and not is_integer_valued(values)
    edges = score_bins(values, bins=40)
    assert len(edges) == 41
    assert edges[0] == pytest.approx(0.1) and edges[-1] == pytest.approx(0.9)
    # one non-integer among integers is enough for ordinary bins
    assert integer_bins(np.array([1.0, 2.0, 2.5])) is None


def test_non_finite_values_are_left_out_and_counted():
    v = np.array([1.0, np.nan, 2.0, np.inf, -np.inf, 3.0])
    finite, left_out = split_finite(v)
    assert finite.tolist() == [1.0, 2.0, 3.0] and left_out == 3
    assert split_finite([1.0, None, 2.0])[1] == 1
    np.testing.assert_array_equal(integer_bins(v), [0.5, 1.5, 2.5, 3.5])
    assert integer_bins(np.array([np.nan, np.inf])) is None and score_bins(np.array([np.nan])) is None


def test_range_wider_than_float64_still_gets_finite_bins():
    edges = score_bins(np.array([-1e308, 0.5, 1e308]), bins=10)
    assert len(edges) == 11 and np.all(np.isfinite(edges)) and np.all(np.diff(edges) > 0)


# ---- y scale

def test_log_scale_for_a_100x_split_not_for_a_close_one():
    assert use_log_scale(1000, 5)
    assert use_log_scale(5, 1000)
    assert not use_log_scale(50, 40)
    assert use_log_scale(np.array([500, 400, 100]), np.array([0, 3, 2]))   # 1000 vs 5 over bins
    assert not use_log_scale(np.array([20, 20, 10]), np.array([10, 20, 10]))
    assert not use_log_scale(1000, 0)  # nothing rejected: nothing to make visible


def test_log_scale_when_one_class_would_be_unreadable():
    # totals 1000 vs 40 (25x), but the rejected are spread thin: tallest bar 1 against 900
    assert use_log_scale(np.array([900, 100]), np.array([1] * 40))
    assert not use_log_scale(np.array([900, 100]), np.array([40, 0]))


# ---- threshold lines

def test_threshold_lines_of_min_max_between_and_no_thresholds():
    assert threshold_lines(StubRule("paraphrase_score", "high", min=0.3)) == [(0.3, "min 0.3")]
    assert threshold_lines(StubRule("trigram_overlap", "low", max=0.7)) == [(0.7, "max 0.7")]
    assert threshold_lines(StubRule("paraphrase_score", "between", min=0.4, max=1.0)) == \
        [(0.4, "min 0.4"), (1.0, "max 1")]
    assert threshold_lines(StubRule("length_ratio", "between")) == []
    assert threshold_lines(None) == []


def test_threshold_lines_of_rules_from_a_real_config():
    from filtering.config import parse_config

    cfg = parse_config({"filters": [
        {"name": "length", "thresholds": {"reference_length": {"max": 30}}},
        {"name": "ngram_overlap", "n": [3], "thresholds": {"trigram_overlap": {"max": 0.7}}}]})
    lines = {r.score: threshold_lines(r) for r in cfg.rules}
    assert lines == {"reference_length": [(30.0, "max 30")], "trigram_overlap": [(0.7, "max 0.7")]}


# ---- rendered figures

def test_kept_vs_rejected_plot_log_axis_labels_and_threshold_lines(tmp_path):
    rng = np.random.default_rng(0)
    kept = rng.uniform(0.4, 1.0, 1000)
    rejected = rng.uniform(0.0, 0.4, 5)
    rule = StubRule("paraphrase_score", "between", min=0.4, max=1.0)
    fig = plot_histogram({"kept": kept, "rejected": rejected}, title="paraphrase_score: kept vs rejected",
                         xlabel="paraphrase_score", rule=rule)
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    assert ax.get_xlabel() == "paraphrase_score" and ax.get_ylabel() == "rows (log scale)"
    assert ax.get_title().startswith("paraphrase_score: kept vs rejected")
    assert _vlines(ax) == {"min 0.4": 0.4, "max 1": 1.0}
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "kept (1000)" in legend and "rejected (5)" in legend and "min 0.4" in legend
    # every row is in a bar: the bars of each class add up to its size
    assert _bar_heights(ax).sum() == pytest.approx(1005)
    path = save_png(fig, str(tmp_path / "hist_paraphrase_score.png"))
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["hist_paraphrase_score.png"]  # no temporary left


def test_close_classes_linear_axis_integer_bins_no_rule():
    kept = np.repeat(np.arange(1, 6, dtype=float), 10)        # 50 rows, integers 1..5
    rejected = np.repeat(np.arange(4, 8, dtype=float), 10)    # 40 rows, integers 4..7
    fig = plot_histogram({"kept": kept, "rejected": rejected}, title="tree_edit_distance",
                         xlabel="tree_edit_distance")
    ax = fig.axes[0]
    assert ax.get_yscale() == "linear" and ax.get_ylabel() == "rows"
    assert _vlines(ax) == {}
    lefts = sorted({p.get_x() for p in ax.patches})
    assert lefts == [0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5]        # one bar per integer, centred on it
    assert {p.get_width() for p in ax.patches} == {1.0}


def test_lengths_plot_compares_shares_not_counts():
    refs = np.array([5, 5, 6, 7], dtype=float)                 # 4 references
    paras = np.repeat(np.array([5, 6, 8], dtype=float), 100)   # 300 paraphrases
    fig = plot_histogram({"references": refs, "paraphrases": paras}, title="sentence length",
                         xlabel="tokens", shares=True)
    ax = fig.axes[0]
    assert ax.get_yscale() == "linear"
    assert ax.get_xlabel() == "tokens" and ax.get_ylabel() == "share of sentences"
    assert ax.get_title()
    heights = _bar_heights(ax)
    n = len(heights) // 2
    assert heights[:n].sum() == pytest.approx(1.0) and heights[n:].sum() == pytest.approx(1.0)
    assert heights[:n].max() == pytest.approx(0.5)             # half the references have 5 tokens
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["references (4)", "paraphrases (300)"]


def test_non_finite_values_do_not_crash_and_are_reported(tmp_path):
    kept = np.array([0.1, 0.2, np.nan, np.inf, 0.3])
    rejected = np.array([-np.inf, 0.9])
    fig = plot_histogram({"kept": kept, "rejected": rejected}, title="lm_perplexity", xlabel="lm_perplexity",
                         rule=StubRule("lm_perplexity", "low", max=0.8))
    ax = fig.axes[0]
    assert "3 nan/inf left out" in ax.get_title()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "kept (3; 2 nan/inf left out)" in legend and "rejected (1; 1 nan/inf left out)" in legend
    assert _vlines(ax) == {"max 0.8": 0.8}
    save_png(fig, str(tmp_path / "a.png"))
    # nothing finite at all, or an empty class: still a plot
    fig = plot_histogram({"kept": np.array([np.nan, np.inf]), "rejected": np.array([])}, title="x", xlabel="x")
    assert "2 nan/inf left out" in fig.axes[0].get_title() and fig.axes[0].get_ylabel() == "rows"
    save_png(fig, str(tmp_path / "b.png"))
    fig = plot_histogram({"kept": np.array([1.0, 2.0]), "rejected": np.array([])}, title="x", xlabel="x")
    assert fig.axes[0].get_yscale() == "linear"
    assert "rejected (0)" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    save_png(fig, str(tmp_path / "c.png"))
