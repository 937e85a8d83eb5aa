"""Save a benchmark's JSON line into ``perf/results/`` with the hardware and commit it ran on.

python -m perf.rollout_sim ... | tee out.txt
python -m perf.record out.txt rollout-sim-cpu        # writes perf/results/rollout-sim-cpu.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def hardware() -> dict[str, Any]:
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cores": os.cpu_count(), "memory_gib": round(memory_gib), "cpu": platform.machine()}


def commit() -> str:
    proc = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=RESULTS.parent.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip() or "unknown"


FLOOR_S = 1e-12  # a fitted cost constant below this is noise: floored, and named in ``floored``


def floor_costs(fitted: dict[str, float]) -> tuple[dict[str, float], list[str]]:
    """Each fitted constant floored at :data:`FLOOR_S` (the simulator needs positive prices),
    and the names of those that were below it, in order (a NaN, no fit at all, is one)."""
    low = [name for name, value in fitted.items() if not value >= FLOOR_S]
    return ({name: FLOOR_S if name in low else value for name, value in fitted.items()}, low)


def fit_line(points: list[tuple[float, float]], what: str = "points") -> tuple[float, float]:
    """Least-squares line of y over x: (slope, intercept). ValueError (naming ``what``) when
    the points have fewer than two distinct x: no line fits them."""
    if len({x for x, _ in points}) < 2:
        xs = sorted({x for x, _ in points})
        raise ValueError(f"{what}: a line needs at least two distinct x values, got {xs}")
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    den = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / den
    return slope, my - slope * mx


def record(result: dict[str, Any], name: str) -> Path:
    """Write ``result`` plus hardware, commit and date to ``perf/results/<name>.json``."""
    out = {
        **result,
        "hardware": result.get("hardware", hardware()),
        "commit": commit(),
        "date": datetime.date.today().isoformat(),
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", help="a benchmark's printed output (its last line is the JSON)")
    parser.add_argument("name", help="file name under perf/results/, without .json")
    args = parser.parse_args(argv)
    lines = [x for x in Path(args.output).read_text().splitlines() if x.startswith("{")]
    if not lines:
        parser.error(f"{args.output} has no JSON line")
    print(record(json.loads(lines[-1]), args.name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
