"""The toy recipe (README command 1) with rollouts one step ahead of the learner
(`rollout.max_staleness_steps: 1`): every step records its staleness, and the run still learns.
The recipe's SFT, then its first 20 of 60 RL steps: the held-out gain is mostly made by then
(the margin, measured over RL seeds, is in MIN_GAIN_POINTS' comment); the whole 60-step recipe
is README command 1 (scripts/quickstart.sh)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.timeout(1800)

# The bar. Measured on the 2-core VM (2026-12-07), from the recipe's SFT (seed 0,
# held-out 47.0%) with rollouts one step ahead: RL seeds 0, 1, 2, 3 gained +13.2, +15.4,
# +13.7, +15.8 points after 10 steps and +18.2, +17.7, +19.4, +19.6 after 20 (the 60-step
# recipe: +21.0). The recipe's SFT itself is fragile across seeds (seed 1 ends at 0.4%
# held-out, seed 2 at 77.9%: nothing learnt, or little room left), so the test keeps the
# recipe's seed 0 and the RL seeds were varied from its SFT model.
MIN_GAIN_POINTS = 10.0
RL_STEPS = 20


def test_the_toy_recipe_learns_with_rollouts_one_step_ahead(tmp_path: Path) -> None:
    data = tmp_path / "toy-data"
    res = run_cli("data", "toy", "--out", str(data), timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    run_dir = tmp_path / "run"
    overrides = [
        f"model.path={tmp_path / 'toy-base'}",
        f"data.train_datasets=[{data / 'train.jsonl'}]",
        f"sft.data=[{data / 'sft.jsonl'}]",
        "rollout.max_staleness_steps=1",
        f"stages.0.num_steps={RL_STEPS}",
    ]
    config = str(REPO / "configs" / "toy" / "cpu.yaml")
    res = run_cli(
        "train", "--config", config, "--run-dir", str(run_dir), "--quiet", *overrides,
        timeout=1700,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward_mean" in r]
    assert len(steps) == RL_STEPS
    staleness = [r["rollout/staleness_steps"] for r in steps]
    # step 1 is generated on the starting weights; each later one while the step before learned
    # (one update old when that step updated, which the toy's first steps all do)
    assert staleness[0] == 0 and set(staleness) <= {0, 1}
    assert all(s == int(prev["updated"]) for s, prev in zip(staleness[1:], steps, strict=False))
    summary = json.loads((run_dir / "summary.json").read_text())
    gain = summary["eval_gain_points"]["eval/heldout/accuracy"]
    assert gain >= MIN_GAIN_POINTS, summary
