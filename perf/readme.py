"""README's Benchmarks tables, generated from the newest suite results in perf/results/.

    python -m perf readme          # rewrite the part of README.md between the perf markers
    python -m perf readme --check  # exit 1 if README.md differs from what the results give

One table per kind of run (the full CPU suite, the GPU suite), each naming the commit, the
hardware and the command that produced it, so a reader can reproduce every row.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from perf.figures import Figure, fmt
from perf.record import RESULTS

README = RESULTS.parent.parent / "README.md"
BEGIN, END = "<!-- perf:begin -->", "<!-- perf:end -->"
# absolute figures worth a README row (every ratio figure gets one)
SHOWN = re.compile(
    r"^(reward\.(median_score|cold_verif_per_core)"
    r"|sandbox\.(embedded|http)\.(print|sympy)\.c1\.p50"
    r"|sandbox\.(embedded|http)\.print\.c8\.throughput"
    r"|roc\.select_and_advantages|scheduler\.decision\.kv_\w+"
    r"|learner\.\w+\.tokens_per_s|rollout\.(trajectories|tokens)_per_s"
    r"|learner_gpu\.\w+\.(tokens_per_s|mfu)|step_cost\.\w+|weight_transfer\.\w+)$"
)


def latest_runs(folder: Path = RESULTS) -> list[dict[str, Any]]:
    """The newest full CPU run and the newest GPU run found in ``folder`` (either may be absent)."""
    runs = []
    for path in sorted(folder.glob("*.json")):
        try:
            run = json.loads(path.read_text())
        except ValueError:
            continue
        whole = not run.get("quick") and not run.get("only") if isinstance(run, dict) else False
        if whole and "figures" in run:
            run["_file"] = path.name
            runs.append(run)
    chosen = []
    for gpu in (False, True):
        of_kind = [r for r in runs if bool(r.get("gpu")) == gpu]
        if of_kind:
            # a day-only date (older runs) sorts before that day's timed ones
            chosen.append(max(of_kind, key=lambda r: (r["date"], r["_file"])))
    return chosen


def section(runs: list[dict[str, Any]]) -> str:
    lines = [BEGIN]
    for run in runs:
        hw = run["hardware"]
        where = hw.get("gpu") or f"{hw.get('cpu_model', hw['cpu'])}, {hw['cores']} cores"
        command = "python -m perf run" + (" --gpu" if run.get("gpu") else "")
        lines += [
            "",
            f"`{command}` at commit `{run['commit']}` on {where} ({run['date'][:10]}; "
            f"`perf/results/{run['_file']}`):",
            "",
            "| figure | value | |",
            "|---|---|---|",
        ]
        for data in run["figures"]:
            fig = Figure.from_json(data)
            if fig.kind == "ratio" or SHOWN.match(fig.name):
                better = "higher is better" if fig.better == "higher" else "lower is better"
                lines.append(f"| `{fig.name}` | {fmt(fig.value)} {fig.unit} | {better} |")
    lines += ["", END]
    return "\n".join(lines)


def render(readme: str, runs: list[dict[str, Any]]) -> str:
    start, end = readme.index(BEGIN), readme.index(END) + len(END)
    return readme[:start] + section(runs) + readme[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m perf readme", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--check", action="store_true", help="only check that README is current")
    args = parser.parse_args(argv)
    text = README.read_text()
    new = render(text, latest_runs())
    if args.check:
        return 0 if new == text else 1
    README.write_text(new)
    return 0
