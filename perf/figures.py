"""Figures: named numbers with a unit and a direction, and how two runs compare (pure).

A ``ratio`` figure divides by a reference measured in the same run (the fresh-python3 baseline,
round robin, the simulator's lower bound, a plain transformers step): it holds across runs on a
noisy machine. An ``absolute`` figure (ms, tokens/s) holds only on a quiet machine or a GPU.

A figure measured in rounds may carry its ``noise``: the relative half-width of a distribution-
free ~90% interval of its median over the rounds. A comparison flags a figure worse by more than
5%, or by more than that noise where it is larger: on a 2-core VM whose plain CPU loop varies
~14% from one 150 ms slice to the next, a sub-second sandbox ratio cannot resolve 5%, and the
table says so rather than flag noise.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

Better = Literal["higher", "lower"]
Kind = Literal["ratio", "absolute"]
TOLERANCE = 0.05


@dataclass(frozen=True)
class Figure:
    name: str  # "<benchmark>.<what>", unique in a run
    value: float
    unit: str
    better: Better
    kind: Kind = "absolute"
    noise: float = 0.0  # relative half-width of its ~90% interval; 0: not estimated

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Figure:
        return cls(**data)  # a file written before `noise` existed has none: 0.0


@dataclass(frozen=True)
class Change:
    figure: Figure
    baseline: float
    worse_by: float  # >0: worse than the baseline by this fraction; <0: better
    threshold: float = TOLERANCE  # 5%, or the larger noise of the two runs' figures

    @property
    def flagged(self) -> bool:
        return self.worse_by > self.threshold


def worse_by(value: float, baseline: float, better: Better) -> float:
    """How much worse ``value`` is than ``baseline`` as a fraction (negative: better).

    higher-is-better: 90 against 100 is 0.111 worse (the baseline is 11% above it);
    lower-is-better: 110 ms against 100 ms is 0.10 worse.
    """
    if value == baseline:
        return 0.0
    if better == "higher":
        return float("inf") if value <= 0 else baseline / value - 1
    return float("inf") if baseline <= 0 else value / baseline - 1


def compare(current: Iterable[Figure], baseline: Iterable[Figure]) -> list[Change]:
    """Every figure present in both runs, with how it moved."""
    before = {f.name: f for f in baseline}
    changes = []
    for fig in current:
        base = before.get(fig.name)
        if base is not None:
            moved = worse_by(fig.value, base.value, fig.better)
            threshold = max(TOLERANCE, fig.noise, base.noise)
            changes.append(Change(fig, base.value, moved, threshold))
    return changes


def ratio(name: str, value: float, reference: float, better: Better) -> Figure:
    """``value / reference`` as a ratio figure (``x``), rounded to 3 places. Raises
    ZeroDivisionError on a zero reference (the suite then reports the benchmark's figures as
    failed rather than print a meaningless ratio)."""
    return Figure(name, round(value / reference, 3), "x", better, "ratio")


def table(figures: Sequence[Figure], changes: Sequence[Change] = ()) -> list[str]:
    """One line per figure; with a comparison, the baseline and the change (flagged: '!')."""
    moved = {c.figure.name: c for c in changes}
    width = max((len(f.name) for f in figures), default=10)
    lines = []
    for fig in figures:
        noise = f"±{fig.noise:.0%}" if fig.noise else ""
        line = f"{fig.name:<{width}}  {fmt(fig.value):>12} {fig.unit:<8} {fig.kind:<8} {noise:>5}"
        change = moved.get(fig.name)
        if change is not None:
            mark = "!" if change.flagged else " "
            verdict = "worse" if change.worse_by > 0 else "better"
            line += f" {mark} was {fmt(change.baseline)}, {abs(change.worse_by):.1%} {verdict}"
            if change.threshold > TOLERANCE:
                line += f" (noise {change.threshold:.0%})"
        lines.append(line.rstrip())
    return lines


def fmt(value: float) -> str:
    """A figure for a table: 3 decimals under 100, 1 above, 3 significant digits at the extremes."""
    if value == 0 or 0.01 <= abs(value) < 1e6:
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 100 else f"{value:,.1f}"
    return f"{value:.3g}"


def median_noise(values: Sequence[float]) -> float:
    """The relative half-width (the wider side) of a distribution-free interval of the median
    of ``values``: the narrowest pair of order statistics covering it with >= 90% probability
    (with 4 values, the extremes: 87.5%); 0.0 under 4 values, too few to say."""
    n = len(values)
    if n < 4:
        return 0.0
    xs = sorted(values)
    k = 1  # the largest k whose interval (x_k, x_{n+1-k}) still covers the median >= 90%
    while k + 1 <= n // 2 and 1 - 2 * _binomial_cdf(k + 1, n) >= 0.90:
        k += 1
    mid = xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
    low, high = xs[k - 1], xs[n - k]
    if mid <= 0 or low <= 0:
        return float("inf")
    return max(mid / low - 1, high / mid - 1)


def _binomial_cdf(k: int, n: int) -> float:
    """P(Binomial(n, 1/2) < k): the interval (x_k, x_{n+1-k}) misses the median with twice
    this probability."""
    return sum(math.comb(n, i) for i in range(k)) / 2**n
