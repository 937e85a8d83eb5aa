"""Figures: named numbers with a unit and a direction, and how two runs compare (pure).

A ``ratio`` figure divides by a reference measured in the same run (the fresh-python3 baseline,
round robin, the simulator's lower bound, a plain transformers step): it holds across runs on a
noisy machine. An ``absolute`` figure (ms, tokens/s) holds only on a quiet machine or a GPU.
"""

from __future__ import annotations

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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Figure:
        return cls(**data)


@dataclass(frozen=True)
class Change:
    figure: Figure
    baseline: float
    worse_by: float  # >0: worse than the baseline by this fraction; <0: better

    @property
    def flagged(self) -> bool:
        return self.worse_by > TOLERANCE


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
            changes.append(Change(fig, base.value, worse_by(fig.value, base.value, fig.better)))
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
        line = f"{fig.name:<{width}}  {fmt(fig.value):>12} {fig.unit:<8} {fig.kind:<8}"
        change = moved.get(fig.name)
        if change is not None:
            mark = "!" if change.flagged else " "
            verdict = "worse" if change.worse_by > 0 else "better"
            line += f" {mark} was {fmt(change.baseline)}, {abs(change.worse_by):.1%} {verdict}"
        lines.append(line.rstrip())
    return lines


def fmt(value: float) -> str:
    """A figure for a table: 3 decimals under 100, 1 above, 3 significant digits at the extremes."""
    if value == 0 or 0.01 <= abs(value) < 1e6:
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 100 else f"{value:,.1f}"
    return f"{value:.3g}"
