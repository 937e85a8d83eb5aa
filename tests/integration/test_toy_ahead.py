"""The toy recipe (README command 1) with rollouts one step ahead of the learner
(`rollout.max_staleness_steps: 1`): every step records its staleness, and the run still learns.
RL only, from the recipe's own SFT model (tests/data/toy-sft, made by the recipe's SFT), for the
first 10 of its 60 steps (the margin, measured over RL seeds, is in MIN_GAIN_POINTS' comment);
the whole recipe, SFT included, is README command 1 (scripts/quickstart.sh)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.timeout(900)

# The bar. Measured on the 2-core VM (2026-12-07) from tests/data/toy-sft (held-out
# 47.0%), rollouts one step ahead, exactly as this test runs: RL seeds 0, 1, 2 gained +13.2,
# +15.4, +13.2 points after 10 steps (133-150 s a run alone). Earlier runs from the same model
# (held-out scored every 5 steps): seed 3 +15.9 after 10 steps; +6.6 to +8.6 after 5, under the
# bar; +17.7 to +19.6 after 20; the 60-step recipe +21.0.
MIN_GAIN_POINTS = 10.0
RL_STEPS = 10
SFT_MODEL = REPO / "tests" / "data" / "toy-sft"


def test_the_toy_recipe_learns_with_rollouts_one_step_ahead(tmp_path: Path) -> None:
    data = tmp_path / "toy-data"
    res = run_cli("data", "toy", "--out", str(data), timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    model = tmp_path / "toy-sft"  # a copy: nothing of the run's can land in the repository
    shutil.copytree(SFT_MODEL, model, ignore=shutil.ignore_patterns("README.md"))
    run_dir = tmp_path / "run"
    overrides = [
        f"model.path={model}",
        f"data.train_datasets=[{data / 'train.jsonl'}]",
        "sft.data=[]",  # the model is the recipe's SFT model
        "rollout.max_staleness_steps=1",
        f"stages.0.num_steps={RL_STEPS}",
    ]
    config = str(REPO / "configs" / "toy" / "cpu.yaml")
    res = run_cli(
        "train", "--config", config, "--run-dir", str(run_dir), "--quiet", *overrides,
        timeout=800,
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
