"""The toy recipe (README command 1) with rollouts one step ahead of the learner
(`rollout.max_staleness_steps: 1`): every step records its staleness, and the run still learns.
The longest test in CI (~7 minutes on 2 cores): it is the recipe itself, SFT and 60 RL steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.timeout(1800)

# measured +20.6 points on a 2-core CI-class machine (the synchronous run: +15.8 to +18.1); the
# issue's bar is 10
MIN_GAIN_POINTS = 10.0


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
    ]
    config = str(REPO / "configs" / "toy" / "cpu.yaml")
    res = run_cli(
        "train", "--config", config, "--run-dir", str(run_dir), "--quiet", *overrides,
        timeout=1700,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward_mean" in r]
    assert len(steps) == 60
    staleness = [r["rollout/staleness_steps"] for r in steps]
    # step 1 is generated on the starting weights; each later one while the step before learned
    # (one update old when that step updated, which the toy's first steps all do)
    assert staleness[0] == 0 and set(staleness) <= {0, 1}
    assert all(s == int(prev["updated"]) for s, prev in zip(staleness[1:], steps, strict=False))
    summary = json.loads((run_dir / "summary.json").read_text())
    gain = summary["eval_gain_points"]["eval/heldout/accuracy"]
    assert gain >= MIN_GAIN_POINTS, summary
