"""perf.plan: shapes, the engine cost model, and the 14B recipe's step breakdown."""

from __future__ import annotations

import pytest

from perf import plan
from scheduler.sim import StepCostModel


def test_qwen3_14b_shape_counts_its_published_parameters():
    shape = plan.SHAPES["Qwen/Qwen3-14B"]
    assert shape.weight_params == pytest.approx(14.77e9, rel=0.01)  # the model card's 14.8B
    assert shape.kv_bytes_per_token == 40 * 8 * 128 * 2 * 2


def test_engine_cost_divides_over_tensor_parallel_width():
    args = plan._parser().parse_args(["--config", "x", "--tp-efficiency", "0.5"])
    a = plan._assumptions(args)
    assert "set by --tp-efficiency" in a["tp_efficiency"].source
    measured = StepCostModel(step_base_s=0.004, per_token_s=4e-5, per_kv_token_s=4e-8)
    one = plan.engine_cost(a, plan.SHAPES["Qwen/Qwen3-14B"], 1, measured)
    four = plan.engine_cost(a, plan.SHAPES["Qwen/Qwen3-14B"], 4, measured)
    assert one == measured
    assert four.per_token_s == pytest.approx(measured.per_token_s / 2)  # 4 GPUs at 50%


def test_the_14b_recipe_breakdown(capsys):
    assert plan.main(["--config", "configs/rstar2_14b_mi300x.yaml"]) == 0
    out = capsys.readouterr().out
    for part in ("rollout (simulated makespan)", "learner (", "weight sync", "one RL step"):
        assert part in out
    assert "steps per week" in out and "paper: 510 on 64 MI300X" in out
    for name in plan.DEFAULTS:
        assert "--" + name.replace("_", "-") in out  # every assumption, with its flag


def test_a_model_without_a_known_shape_is_one_line(capsys):
    assert plan.main(["--config", "configs/toy/cpu.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.path" in err[0]
