"""One shape for the steps of both jobs.

A step is plain Python that works on a batch of pairs, testable without Beam on a list and with a
fake translator: the generation job's cleaning, bitext filter, piece limits, dual cross-entropy
and paraphrasing (paracorpus/steps.py), the filter job's filters (filtering/filters.py).

    Step          NAME (the stage a reject names), PARAMS (accepted parameters and defaults),
                  setup() (load models, once per worker), fit() (train on a sample, driver side),
                  apply(items) -> StepResult (kept items, rejects, rows made, counters)
    ScoringStep   a Step that scores: SCORES {score: direction}, score(batch) -> {score: floats};
                  its Rules (thresholds) decide, and apply() rejects an item at its first failed
                  rule, with the reason REASONS names for that score and the value in the detail

A direction says which way a score is kept:
    "high"     keep when score >= min (only min may be set)
    "low"      keep when score <= max (only max may be set)
    "between"  keep when min <= score <= max (either or both)
A NaN score (a model that could not judge the row) never fails a rule.

The generation job drops what a step rejects (the reject goes to the rejects table with its
reason); the filter job keeps every row and records the rules it failed (``decide``). Beam sees
steps only through one adapter (transforms/steps.py) or inside a work unit (paracorpus/units.py).
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

DIRECTIONS = ("high", "low", "between")


@dataclass(frozen=True)
class Rule:
    """Thresholds of one score. ``check`` refuses a bound against the score's direction."""
    score: str
    direction: str
    min: float | None = None
    max: float | None = None

    def check(self, where: str = "") -> "Rule":
        where = where or self.score
        if self.direction not in DIRECTIONS:
            raise ValueError(f"{where}: direction must be one of {', '.join(DIRECTIONS)}, not {self.direction!r}")
        for name in ("min", "max"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or math.isnan(value)):
                raise ValueError(f"{where}: threshold must be a number, got {value!r}")
        if self.direction == "high" and self.max is not None:
            raise ValueError(f"{where}: {self.score} is kept high; only min may be set")
        if self.direction == "low" and self.min is not None:
            raise ValueError(f"{where}: {self.score} is kept low; only max may be set")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"{where}: min {self.min} is above max {self.max}")
        return self

    def describe(self) -> str:
        parts = ([f">= {self.min:g}"] if self.min is not None else []) + \
                ([f"<= {self.max:g}"] if self.max is not None else [])
        return f"{self.score} {' and '.join(parts)}"

    def failures(self, values: np.ndarray) -> list[tuple[int, str, float, float]]:
        """(row, "<" or ">", value, bound) of each row of VALUES outside the bounds (NaN passes)."""
        out = []
        with np.errstate(invalid="ignore"):
            if self.min is not None:
                out += [(int(i), "<", float(values[i]), self.min) for i in np.nonzero(values < self.min)[0]]
            if self.max is not None:
                out += [(int(i), ">", float(values[i]), self.max) for i in np.nonzero(values > self.max)[0]]
        return out


def decide(scores: dict[str, np.ndarray], rules: Sequence[Rule], n: int) -> tuple[np.ndarray, list[list[str]]]:
    """(keep, reasons) of N rows: each failed bound adds 'score<min' or 'score>max' to its row's
    reasons, in rule order; a row is kept when it failed none."""
    reasons: list[list[str]] = [[] for _ in range(n)]
    for rule in rules:
        for i, op, _value, _bound in rule.failures(scores[rule.score]):
            reasons[i].append(f"{rule.score}{op}{'min' if op == '<' else 'max'}")
    return np.array([not r for r in reasons], dtype=bool), reasons


@dataclass
class Rejected:
    """An item a step dropped: the step's stage, why (a reason of the rejects contract) and the
    evidence."""
    item: object
    stage: str
    reason: str
    detail: str


@dataclass
class StepResult:
    kept: list = field(default_factory=list)          # items passed on to the next step
    rejects: list = field(default_factory=list)       # Rejected
    rows: list = field(default_factory=list)          # output rows a step made (paraphrases)
    counters: Counter = field(default_factory=Counter)

    def absorb(self, other: "StepResult") -> None:
        """Add OTHER's rejects, rows and counters (its kept items are the caller's business)."""
        self.rejects += other.rejects
        self.rows += other.rows
        self.counters.update(other.counters)


class Step:
    NAME = ""
    PARAMS: dict[str, object] = {}          # accepted parameters and their defaults

    def __init__(self, **params):
        unknown = set(params) - set(self.PARAMS)
        if unknown:
            raise ValueError(f"{type(self).__name__} {self.NAME!r}: unknown parameter(s) {', '.join(sorted(unknown))}; "
                             f"accepted: {', '.join(self.PARAMS) or 'none'}")
        self.params = {**self.PARAMS, **params}
        self.check_params()

    def check_params(self) -> None:
        """ValueError for a bad parameter (called on construction, before any data is read)."""

    def fit(self, sample, workdir: str, log=print) -> dict:
        """Train what the step needs on SAMPLE; return parameter updates (e.g. model paths)."""
        return {}

    def needs_fit(self) -> bool:
        """True while a model this step needs has still to be trained on the data."""
        return False

    def setup(self) -> None:
        """Load models (once per worker)."""

    def apply(self, items: list) -> StepResult:
        raise NotImplementedError


class ScoringStep(Step):
    SCORES: dict[str, str] = {}             # score -> direction
    REASONS: dict[str, str] = {}            # score -> reject reason (default: the score's name)

    def __init__(self, rules: Sequence[Rule] = (), **params):
        super().__init__(**params)
        self.rules = [r.check(f"{self.NAME}: {r.score}") for r in rules]
        for r in self.rules:
            if r.score not in self.scores:
                raise ValueError(f"{self.NAME}: no score {r.score!r}; its scores: {', '.join(self.scores)}")
            if r.direction != self.scores[r.score]:
                raise ValueError(f"{self.NAME}: {r.score} is kept {self.scores[r.score]}, not {r.direction}")

    @property
    def scores(self) -> dict[str, str]:
        return dict(self.SCORES)

    def score(self, batch) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def detail(self, score: str, op: str, value: float, bound: float) -> str:
        """The evidence a reject carries (a step may name its measure, e.g. 'cosine')."""
        return f"{score} {value:.4g} {op} {bound:g}"

    def apply(self, items: list) -> StepResult:
        """Score ITEMS and reject each at its first failed rule (rule order); the rest are kept."""
        out = StepResult()
        if not items or not self.rules:
            out.kept = list(items)
            return out
        scores = self.score(items)
        failed: dict[int, Rejected] = {}
        for rule in self.rules:
            values = np.asarray(scores[rule.score], dtype=np.float64)
            if values.shape != (len(items),):
                raise RuntimeError(f"step {self.NAME!r} gave {values.shape} {rule.score} scores for {len(items)} items")
            for i, op, value, bound in rule.failures(values):
                if i not in failed:
                    failed[i] = Rejected(items[i], self.NAME, self.REASONS.get(rule.score, rule.score),
                                         self.detail(rule.score, op, value, bound))
        out.kept = [item for i, item in enumerate(items) if i not in failed]
        out.rejects = [failed[i] for i in sorted(failed)]
        return out


def run_steps(steps: Sequence[Step], items: list) -> StepResult:
    """ITEMS through STEPS in order, each getting what the one before kept; the result's kept
    items are what the last step kept."""
    total = StepResult()
    for step in steps:
        if not items:
            break
        result = step.apply(items)
        total.absorb(result)
        items = result.kept
    total.kept = list(items)
    return total
