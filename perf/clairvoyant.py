"""What knowing every trajectory's length in advance would buy kv_affinity: a reference for the
makespan targets against :func:`scheduler.sim.makespan_lower_bound`.

    python -m perf.clairvoyant [--trace paper|skewed|FILE ...] [--quick] [--out FILE]

A real scheduler cannot know how long a trajectory will be; this one is told. The same policy
(kv_affinity with its defaults) and the same simulator replay the trace once in its own order,
then once per point of a grid with the longest trajectories moved to the front: the
``longest`` fraction of them, spread at random over the first ``within`` fraction of the
order (:func:`front_load`). Each case is one of the settings the targets name: 640K and 256K KV
tokens per engine at the default step cost, and the H200's measured cost and KV. Prints a
table per trace (the makespan over the bound in the trace's own order, at the grid's best point,
and that point's recomputed share), then one JSON line with every point.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perf.rollout_sim import GENERATED, CostFileError, load_cost
from scheduler.core import SchedulerSettings
from scheduler.sim import SimSettings, makespan_lower_bound, simulate
from scheduler.trace import TraceError, TraceRow, load_trace

H200_COST = Path(__file__).parent / "results" / "step-cost-h200.json"
H200_KV_TOKENS = 460_558  # what vLLM left for KV on the H200 at the 14B recipe's settings
GRID = [
    (longest, within)
    for longest in (0.05, 0.1, 0.2, 0.3, 0.5)
    for within in (0.3, 0.5, 0.7, 0.9)
    if within > longest
]
QUICK_GRID = [(0.1, 0.9), (0.2, 0.7), (0.3, 0.7)]


@dataclass(frozen=True)
class Point:
    longest: float  # 0: the trace's own order
    within: float
    makespan_vs_bound: float
    recomputed_fraction: float
    preemptions: int


def front_load(
    rows: list[TraceRow], longest: float, within: float, seed: int = 1
) -> list[TraceRow]:
    """``rows`` reordered: the ``longest`` fraction by response tokens (ties in trace order)
    shuffled with the others that fill the first ``within`` fraction of the order; the rest
    keep their order after them. A permutation of ``rows``."""
    if not 0 < longest < within <= 1:
        raise ValueError("need 0 < longest < within <= 1")
    by_length = sorted(range(len(rows)), key=lambda i: -rows[i].response_tokens)
    chosen = set(by_length[: int(longest * len(rows))])
    head_size = int(within * len(rows))
    others = [r for i, r in enumerate(rows) if i not in chosen]
    fill = head_size - len(chosen)
    head = [rows[i] for i in sorted(chosen)] + others[:fill]
    random.Random(seed).shuffle(head)
    return head + others[fill:]


def cases() -> dict[str, SimSettings]:
    """The settings the makespan targets name."""
    return {
        "640K": SimSettings(),
        "256K": SimSettings(kv_tokens=262_144),
        "h200": SimSettings(kv_tokens=H200_KV_TOKENS, cost=load_cost(str(H200_COST))),
    }


def _point(rows: list[TraceRow], s: SimSettings, longest: float, within: float) -> Point:
    order = front_load(rows, longest, within) if longest else rows
    r = simulate(order, s, SchedulerSettings())
    return Point(
        longest,
        within,
        r.makespan_s / makespan_lower_bound(rows, s).makespan_s,
        r.recomputed_tokens / max(r.generated_tokens, 1),
        r.preemptions,
    )


def run(rows: list[TraceRow], grid: list[tuple[float, float]]) -> dict[str, list[Point]]:
    """Per case: the trace's own order first, then each grid point."""
    return {
        name: [_point(rows, s, 0.0, 0.0)] + [_point(rows, s, lo, w) for lo, w in grid]
        for name, s in cases().items()
    }


def _rows(trace: str) -> list[TraceRow]:
    return GENERATED[trace]() if trace in GENERATED else load_trace(trace)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perf.clairvoyant", description=__doc__)
    parser.add_argument("--trace", nargs="+", default=["paper", "skewed"])
    parser.add_argument("--quick", action="store_true", help=f"grid of {len(QUICK_GRID)} points")
    parser.add_argument("--out", help="also write the JSON line here")
    args = parser.parse_args(argv)
    grid = QUICK_GRID if args.quick else GRID
    out: dict[str, Any] = {"benchmark": "clairvoyant", "grid": grid, "traces": {}}
    for trace in args.trace:
        try:
            rows = _rows(trace)
            started = time.perf_counter()
            result = run(rows, grid)
        except (TraceError, CostFileError, OSError) as exc:
            print(f"perf.clairvoyant: {exc}", file=sys.stderr)
            return 2
        print(f"{trace}: {len(rows)} trajectories, {time.perf_counter() - started:.0f} s")
        print(f"  {'case':<6}{'own order':>11}{'best told':>11}  {'at (longest, within)':<22}rec")
        for name, points in result.items():
            best = min(points[1:], key=lambda p: p.makespan_vs_bound)
            where = f"({best.longest}, {best.within})"
            print(
                f"  {name:<6}{points[0].makespan_vs_bound:>10.3f}x{best.makespan_vs_bound:>10.3f}x"
                f"  {where:<22}{100 * best.recomputed_fraction:.2f}%"
            )
        out["traces"][trace] = {n: [vars(p) for p in ps] for n, ps in result.items()}
    line = json.dumps(out)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
