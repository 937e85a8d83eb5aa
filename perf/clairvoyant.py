"""How much of kv_affinity's gap to the makespan bound comes from not knowing lengths at
admission: a reference for the targets against :func:`scheduler.bound.makespan_lower_bound`.

    python -m perf.clairvoyant [--trace paper|skewed|FILE ...] [--quick] [--seeds N] [--out FILE]

A real scheduler cannot know how long a trajectory will be. Here the admission order is chosen
from the trajectories' true lengths; the policy itself is unchanged (kv_affinity with its
defaults, reserving from its own growth model), and so is the simulator. Per case, the trace
is replayed in its own order, longest first, and at each point of a grid that moves the
``longest`` fraction of the trajectories (at least one) to random places among the first
``within`` fraction of the order (:func:`front_load`), once per seed. Cases are the settings
the targets name: 640K and 256K KV tokens per engine at the default step cost, and the H200's
measured cost and KV. Prints a table per trace (the makespan over the bound in the trace's
own order, longest first, and at the best grid point with that point's recomputed share),
then one JSON line with every point, the commit and the hardware.
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

from perf.record import commit, hardware
from perf.rollout_sim import GENERATED, CostFileError, load_cost
from scheduler.bound import makespan_lower_bound
from scheduler.core import SchedulerError, SchedulerSettings
from scheduler.sim import Simulation, simulate
from scheduler.sim_model import SimSettings
from scheduler.trace import TraceError, TraceRow, load_trace

H200_COST = Path(__file__).parent / "results" / "step-cost-h200.json"
H200_KV_TOKENS = 460_558  # what vLLM left for KV on the H200 at the 14B recipe's settings
GRID = [
    (longest, within)
    for longest in (0.02, 0.05, 0.1, 0.2, 0.3)
    for within in (0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
    if within > longest
]
QUICK_GRID = [(0.1, 0.9), (0.2, 0.7), (0.3, 0.7)]


@dataclass(frozen=True)
class Point:
    order: str  # "own", "longest_first" or "front_loaded"
    longest: float  # front_loaded: the fraction moved forward, into the first ``within``
    within: float
    seed: int
    makespan_vs_bound: float
    recomputed_fraction: float
    preemptions: int


def front_load(
    rows: list[TraceRow], longest: float, within: float, seed: int = 1
) -> list[TraceRow]:
    """``rows`` reordered: the ``longest`` fraction by response tokens (at least one; ties in
    trace order) shuffled with the other rows that fill the first ``within`` fraction of the
    order (at least the moved ones); the rest keep their order after them. A permutation."""
    if not 0 < longest < within <= 1:
        raise ValueError("need 0 < longest < within <= 1")
    by_length = sorted(range(len(rows)), key=lambda i: -rows[i].response_tokens)
    chosen = set(by_length[: max(1, int(longest * len(rows)))])
    head_size = max(len(chosen), int(within * len(rows)))
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


@dataclass(frozen=True)
class Order:
    name: str  # "own", "longest_first" or "front_loaded"
    longest: float
    within: float
    seed: int
    rows: list[TraceRow]


def orders(rows: list[TraceRow], grid: list[tuple[float, float]], seeds: int = 1) -> list[Order]:
    """The trace's own order, longest first, then each grid point and seed."""
    out = [
        Order("own", 0.0, 0.0, 0, rows),
        Order("longest_first", 0.0, 0.0, 0, sorted(rows, key=lambda r: -r.response_tokens)),
    ]
    for lo, w in grid:
        for seed in range(1, seeds + 1):
            out.append(Order("front_loaded", lo, w, seed, front_load(rows, lo, w, seed)))
    return out


def run(
    rows: list[TraceRow], grid: list[tuple[float, float]], seeds: int = 1
) -> dict[str, list[Point]]:
    """Per case, a point per order of :func:`orders`, in that order."""
    replays = orders(rows, grid, seeds)
    settings = cases()
    for s in settings.values():  # a row some case refuses fails now, not after the others ran
        Simulation(rows, s, SchedulerSettings())
    out: dict[str, list[Point]] = {}
    for name, s in settings.items():
        bound_s = makespan_lower_bound(rows, s).makespan_s
        out[name] = []
        for o in replays:
            r = simulate(o.rows, s, SchedulerSettings())
            out[name].append(
                Point(
                    o.name,
                    o.longest,
                    o.within,
                    o.seed,
                    r.makespan_s / bound_s,
                    r.recomputed_tokens / max(r.generated_tokens, 1),
                    r.preemptions,
                )
            )
    return out


def _rows(trace: str) -> list[TraceRow]:
    return GENERATED[trace]() if trace in GENERATED else load_trace(trace)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perf.clairvoyant", description=__doc__)
    parser.add_argument("--trace", nargs="+", default=["paper", "skewed"])
    parser.add_argument("--quick", action="store_true", help=f"grid of {len(QUICK_GRID)} points")
    parser.add_argument("--seeds", type=int, default=1, help="orders drawn per grid point")
    parser.add_argument("--out", help="also write the JSON line here")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    grid = QUICK_GRID if args.quick else GRID
    out: dict[str, Any] = {
        "benchmark": "clairvoyant",
        "commit": commit(),
        "hardware": hardware(),
        "grid": grid,
        "seeds": args.seeds,
        "traces": {},
    }
    try:
        traces = {trace: _rows(trace) for trace in args.trace}
        for trace, rows in traces.items():
            started = time.perf_counter()
            result = run(rows, grid, args.seeds)
            _print_table(trace, len(rows), time.perf_counter() - started, result)
            out["traces"][trace] = {
                "trajectories": len(rows),
                "cases": {n: [vars(p) for p in ps] for n, ps in result.items()},
            }
    except (TraceError, CostFileError, SchedulerError, OSError) as exc:
        print(f"perf.clairvoyant: {exc}", file=sys.stderr)
        return 2
    line = json.dumps(out)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0


def _print_table(trace: str, n: int, took_s: float, result: dict[str, list[Point]]) -> None:
    print(f"{trace}: {n} trajectories, {took_s:.0f} s")
    head = f"{'own order':>11}{'longest 1st':>13}{'best grid':>11}"
    print(f"  {'case':<6}{head}  {'(longest, within, seed)':<26}rec")
    for name, points in result.items():
        own, lpt, *grid = points
        best = min(grid, key=lambda p: p.makespan_vs_bound)
        where = f"({best.longest}, {best.within}, {best.seed})"
        print(
            f"  {name:<6}{own.makespan_vs_bound:>10.3f}x{lpt.makespan_vs_bound:>12.3f}x"
            f"{best.makespan_vs_bound:>10.3f}x  {where:<26}{100 * best.recomputed_fraction:.2f}%"
        )


if __name__ == "__main__":
    raise SystemExit(main())
