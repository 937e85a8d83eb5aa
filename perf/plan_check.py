"""A saved run as the plan's input and yardstick: each step's rollouts (``rstar2 train
--save-rollouts DIR``) as a trace, and the run's measured rollout time per step, so
``perf.plan --rollouts DIR --run RUN`` sets its rollout figure beside what the run took."""

from __future__ import annotations

import json
import re
from pathlib import Path

from perf.plan_inputs import PlanInputError
from scheduler.trace import TraceRow, row_from_rollout

_STEP_FILE = re.compile(r"step_(\d+)\.jsonl$")


def load_run_traces(folder: str | Path) -> tuple[dict[int, list[TraceRow]], int]:
    """(step -> its trajectories as trace rows, how many were skipped). A trajectory with no
    sampled token is skipped (nothing to replay), and so is a step with only those.
    PlanInputError names a missing folder, an empty one, one whose trajectories were all
    skipped, or the first record it cannot read (file and line)."""
    root = Path(folder)
    if not root.is_dir():
        raise PlanInputError(f"--rollouts {root}: not a folder")
    steps: dict[int, list[TraceRow]] = {}
    skipped = 0
    for path in sorted(root.iterdir()):
        match = _STEP_FILE.match(path.name)
        if match is None:
            continue
        step = int(match.group(1))
        rows = []
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            try:
                record = json.loads(line)
                row_id = f"s{step}-g{record['group']}-k{record['sample']}"
                row = row_from_rollout(record, row_id)
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise PlanInputError(f"{path}:{lineno}: {exc}") from None
            if row is None:
                skipped += 1
            else:
                rows.append(row)
        if rows:
            steps[step] = rows
    if not steps and skipped:
        raise PlanInputError(
            f"--rollouts {root}: all {skipped} saved trajectories have no sampled tokens "
            "(loss_mask all 0): nothing to replay; give a run's rollouts that generated"
        )
    if not steps:
        raise PlanInputError(f"--rollouts {root}: no step_NNNNNN.jsonl with rollouts in it")
    return steps, skipped


def measured_rollout_s(run_dir: str | Path) -> dict[int, float]:
    """step -> ``time_rollout_s`` from a run's ``metrics.jsonl`` (the last record of a step
    wins: a resumed run rewrites the steps after its checkpoint)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise PlanInputError(f"--run {run_dir}: no metrics.jsonl there")
    out: dict[int, float] = {}
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PlanInputError(f"{path}:{lineno}: {exc}") from None
        if isinstance(record, dict) and "time_rollout_s" in record and "step" in record:
            out[int(record["step"])] = float(record["time_rollout_s"])
    return out
