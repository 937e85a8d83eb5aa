"""Figures: named numbers with a unit and a direction, and how two runs compare (pure).

A ``ratio`` figure divides by a reference measured in the same run (the fresh-python3 baseline,
round robin, the simulator's lower bound, a plain transformers step): it holds across runs on a
noisy machine. An ``absolute`` figure (ms, tokens/s) holds only on a quiet machine or a GPU.

Where the benchmark measures the figure and its reference in alternating rounds (a drift of the
machine then moves both alike), the figure is the median of the per-round ratios and ``spread``
is how far the rounds scattered around it: a change smaller than the two runs' spreads is noise
and is not flagged, however large (the table says so), and a change past 5% and past the noise is.
"""

from __future__ import annotations

import statistics
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
    spread: float = 0.0  # the rounds' relative scatter around ``value`` (paired ratios only)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Figure:
        return cls(**data)  # a results file from before ``spread`` reads as spread 0


@dataclass(frozen=True)
class Change:
    figure: Figure
    baseline: float
    worse_by: float  # >0: worse than the baseline by this fraction; <0: better
    noise: float = 0.0  # the two runs' spreads together: a move within it is not a change

    @property
    def flagged(self) -> bool:
        return self.worse_by > TOLERANCE and self.worse_by > self.noise

    @property
    def within_noise(self) -> bool:
        return self.worse_by > TOLERANCE and not self.flagged


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
            changes.append(Change(fig, base.value, moved, fig.spread + base.spread))
    return changes


def ratio(name: str, value: float, reference: float, better: Better) -> Figure:
    """``value / reference`` as a ratio figure (``x``), rounded to 3 places. Raises
    ZeroDivisionError on a zero reference (the suite then reports the benchmark's figures as
    failed rather than print a meaningless ratio)."""
    return Figure(name, round(value / reference, 3), "x", better, "ratio")


def paired_ratio(
    name: str, values: Sequence[float], references: Sequence[float], better: Better
) -> Figure:
    """The median of ``values[i] / references[i]`` over rounds measured back to back, with its
    spread: the largest relative distance of a round's ratio from that median. Raises
    ValueError on no rounds or unequal lengths, ZeroDivisionError on a zero reference."""
    if not values or len(values) != len(references):
        raise ValueError(f"{name}: {len(values)} values against {len(references)} references")
    rounds = [v / r for v, r in zip(values, references, strict=True)]
    mid = statistics.median(rounds)
    spread = max(abs(x / mid - 1) for x in rounds) if mid else 0.0
    return Figure(name, round(mid, 3), "x", better, "ratio", round(spread, 3))


def table(figures: Sequence[Figure], changes: Sequence[Change] = ()) -> list[str]:
    """One line per figure; with a comparison, the baseline and the change (flagged: '!')."""
    moved = {c.figure.name: c for c in changes}
    width = max((len(f.name) for f in figures), default=10)
    lines = []
    for fig in figures:
        line = f"{fig.name:<{width}}  {fmt(fig.value):>12} {fig.unit:<8} {fig.kind:<8}"
        change = moved.get(fig.name)
        if change is not None:
            mark = "!" if change.flagged else "~" if change.within_noise else " "
            verdict = "worse" if change.worse_by > 0 else "better"
            line += f" {mark} was {fmt(change.baseline)}, {abs(change.worse_by):.1%} {verdict}"
            if change.within_noise:
                line += f" (within the rounds' ±{change.noise:.1%})"
        lines.append(line.rstrip())
    return lines


def fmt(value: float) -> str:
    """A figure for a table: 3 decimals under 100, 1 above, 3 significant digits at the extremes."""
    if value == 0 or 0.01 <= abs(value) < 1e6:
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 100 else f"{value:,.1f}"
    return f"{value:.3g}"
