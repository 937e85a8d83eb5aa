"""perf.plan: shapes, datasheets, the engine cost model, the 14B recipe's step breakdown, and a
saved run's rollouts as the plan's trace."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from perf import engine_cost, plan, plan_engine, plan_inputs, plan_step, record
from perf.plan_check import load_run_traces, measured_rollout_s
from perf.record import fit_line
from perf.shapes import DTYPE_BYTES, QWEN3_14B, DecoderShape
from rstar2.config_io import load_config
from scheduler.sim_model import StepCostModel
from scheduler.trace import TraceRow, TraceTurn, row_from_rollout

RECIPE_14B = "configs/rstar2_14b_mi300x.yaml"


def test_qwen3_14b_shape_counts_its_published_parameters():
    shape = plan_inputs.SHAPES["Qwen/Qwen3-14B"]
    assert shape.weight_params == pytest.approx(14.77e9, rel=0.01)  # the model card's 14.8B
    assert shape.kv_bytes_per_token == 40 * 8 * 128 * 2 * 2


def test_a_checkpoint_config_gives_the_same_shape_as_the_table():
    config = dict(QWEN3_14B)
    assert DecoderShape.from_hf_config(config) == plan_inputs.SHAPES["Qwen/Qwen3-14B"]
    del config["head_dim"]  # Llama-style: hidden / heads
    assert DecoderShape.from_hf_config(config).head_dim == 128


def _args(*flags: str):
    return plan._parser().parse_args(["--config", "x", *flags])


def test_the_datasheet_follows_the_accelerator_and_a_flag_overrides_it():
    rocm = plan_inputs.assumptions(_args(), "rocm")
    cuda = plan_inputs.assumptions(_args(), "cuda")
    assert rocm["peak_tflops"].value == 1307.4 and "MI300X" in rocm["peak_tflops"].source
    assert cuda["peak_tflops"].value == 989.4 and "H200" in cuda["gpu_memory_gb"].source
    cpu = plan_inputs.assumptions(_args(), "cpu")
    assert cpu["hbm_tb_per_s"].value is None and "no datasheet" in cpu["hbm_tb_per_s"].source
    given = plan_inputs.assumptions(_args("--peak-tflops", "100"), "cuda")
    assert (
        given["peak_tflops"].value == 100 and "set by --peak-tflops" in given["peak_tflops"].source
    )


def test_engine_cost_divides_over_tensor_parallel_width():
    a = plan_inputs.assumptions(_args("--tp-efficiency", "0.5"), "rocm")
    assert "set by --tp-efficiency" in a["tp_efficiency"].source
    measured = StepCostModel(step_base_s=0.004, per_token_s=4e-5, per_kv_token_s=4e-8)
    shape = plan_inputs.SHAPES["Qwen/Qwen3-14B"]
    one = plan_engine.engine_cost(a, shape, 1, measured)
    four = plan_engine.engine_cost(a, shape, 4, measured)
    assert one == measured
    assert four.per_token_s == pytest.approx(measured.per_token_s / 2)  # 4 GPUs at 50%


def test_without_a_datasheet_the_engine_cost_must_be_measured():
    a = plan_inputs.assumptions(_args(), "cpu")
    with pytest.raises(plan_inputs.PlanInputError, match=r"perf\.engine_cost"):
        plan_engine.engine_cost(a, plan_inputs.SHAPES["Qwen/Qwen3-14B"], 1, None)


def test_the_14b_recipe_breakdown(capsys):
    assert plan.main(["--config", "configs/rstar2_14b_mi300x.yaml"]) == 0
    out = capsys.readouterr().out
    for part in ("rollout (simulated makespan)", "learner (", "weight sync", "one RL step"):
        assert part in out
    assert "steps per week" in out and "paper: 510 on 64 MI300X" in out
    assert "MI300X datasheet (rocm)" in out
    for name in (*plan_inputs.DATASHEET_FIELDS, *plan_inputs.DEFAULTS):
        assert plan_inputs.flag(name) in out  # every assumption, with its flag
    figures = json.loads(out.strip().splitlines()[-1])
    assert figures["step_s"] == pytest.approx(
        figures["rollout_s"] + figures["learner_s"] + figures["sync_s"], abs=0.1
    )


def test_a_model_without_a_shape_is_one_line(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(f"model: {{path: {tmp_path / 'none'}}}\n")
    assert plan.main(["--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.path" in err[0] and "no known shape" in err[0]


def _rollout(group: int, sample: int, runs: list[tuple[int, int]], spans: list) -> dict:
    mask = [m for gen, tool in runs for m in [1] * gen + [0] * tool]
    traj = {"prompt_ids": [1] * 20, "loss_mask": mask, "spans": spans}
    return {"group": group, "sample": sample, "reward": 1.0, "trajectory": traj}


def test_a_saved_rollout_becomes_its_trace_row():
    spans = [
        ["generate", 0.0, 1.0],
        ["tool", 1.0, 1.5],
        ["tool", 1.1, 1.75],  # a parallel call: the turn waits for both
        ["generate", 1.75, 2.0],
    ]
    row = row_from_rollout(_rollout(0, 3, [(30, 12), (5, 0)], spans), "r")
    assert row.prompt_tokens == 20 and row.response_tokens == 35
    assert [(t.gen_tokens, t.tool_tokens) for t in row.turns] == [(30, 12), (5, None)]
    assert row.turns[0].tool_latency_s == pytest.approx(0.75)
    assert row.turns[1].tool_latency_s is None
    with pytest.raises(ValueError, match="generate spans"):
        row_from_rollout(_rollout(0, 0, [(3, 2), (4, 0)], [["generate", 0, 1]]), "r")


def _saved_run(tmp_path: Path) -> tuple[Path, Path]:
    rollouts, run = tmp_path / "rollouts", tmp_path / "run"
    rollouts.mkdir()
    run.mkdir()
    spans = [["generate", 0, 1], ["tool", 1, 1.2], ["generate", 1.2, 2]]
    for step in (1, 2):
        lines = [
            json.dumps(_rollout(g, k, [(40, 10), (20, 0)], spans))
            for g in range(2)
            for k in range(4)
        ]
        (rollouts / f"step_{step:06d}.jsonl").write_text("\n".join(lines) + "\n")
    metrics = [{"step": 1, "time_rollout_s": 2.0}, {"step": 2, "time_rollout_s": 3.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return rollouts, run


def test_a_saved_run_is_read_step_by_step(tmp_path):
    rollouts, run = _saved_run(tmp_path)
    steps, skipped = load_run_traces(rollouts)
    assert sorted(steps) == [1, 2] and len(steps[1]) == 8 and skipped == 0
    assert measured_rollout_s(run) == {1: 2.0, 2: 3.0}
    (rollouts / "step_000003.jsonl").write_text('{"group": 0}\n')
    with pytest.raises(plan_inputs.PlanInputError, match=r"step_000003\.jsonl:1"):
        load_run_traces(rollouts)


def test_the_plan_sets_a_saved_run_beside_its_measured_rollout(tmp_path, capsys):
    rollouts, run = _saved_run(tmp_path)
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"step_base_s": 0.01, "per_token_s": 1e-4, "per_kv_token_s": 1e-9}))
    model = tmp_path / "model"
    model.mkdir()
    shape = {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "vocab_size": 1000,
    }
    (model / "config.json").write_text(json.dumps(shape))
    config = tmp_path / "c.yaml"
    config.write_text(
        f"model: {{path: {model}, dtype: float32}}\n"
        "data: {rollout_batch_num_prompts: 2}\n"
        "rollout: {num_samples_per_prompt: 4, num_engines: 1}\n"
        "cluster: {accelerator: cpu, num_nodes: 1, gpus_per_node: 0}\n"
    )
    argv = ["--config", str(config), "--cost", str(cost), "--rollouts", str(rollouts)]
    assert plan.main([*argv, "--run", str(run)]) == 0
    out = capsys.readouterr().out
    assert "weight sync + engine wake" in out and "not modelled here" in out
    assert "predicted vs measured" in out and "(2 steps)" in out
    # one simulated step: the decode of 2 turns x 8 trajectories with a 0.2 s tool wait
    figures = json.loads(out.strip().splitlines()[-1])
    assert 0.2 < figures["rollout_s"] < 2.0 and figures["sync_s"] is None
    assert plan.main(argv[:2]) == 2  # cpu: no datasheet, so the cost must be measured
    assert "perf.engine_cost" in capsys.readouterr().err


def test_a_measured_cost_is_scaled_from_its_own_tp_to_the_plans():
    a = plan_inputs.assumptions(_args("--tp-efficiency", "0.5"), "rocm")
    measured = StepCostModel(step_base_s=0.004, per_token_s=4e-5, per_kv_token_s=4e-8)
    shape = plan_inputs.SHAPES["Qwen/Qwen3-14B"]
    assert plan_engine.engine_cost(a, shape, 4, measured, measured_tp=4) == measured
    at_two = plan_engine.engine_cost(a, shape, 4, measured, measured_tp=2)
    assert at_two.per_token_s == pytest.approx(measured.per_token_s / 2)  # 2x0.5 -> 4x0.5
    at_one = plan_engine.engine_cost(a, shape, 1, measured, measured_tp=4)
    assert at_one.step_base_s == pytest.approx(measured.step_base_s * 2)


def _engine_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("engine:"))


def test_the_plan_reads_the_tp_a_cost_file_was_measured_at(tmp_path, capsys):
    constants = {"step_base_s": 0.004, "per_token_s": 4e-5, "per_kv_token_s": 4e-8}
    new, old = tmp_path / "tp4.json", tmp_path / "old.json"
    new.write_text(json.dumps({"tensor_parallel_size": 4, "dtype": "bfloat16", "cost": constants}))
    old.write_text(json.dumps(constants))
    # a short trace: what is checked here is the engine's step cost, not the simulated rollout
    trace = tmp_path / "trace.jsonl"
    row = {"prompt_tokens": 200, "turns": [{"gen_tokens": 500}]}
    rows = [{"id": f"t{i}", **row} for i in range(32)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = ["--config", RECIPE_14B, "--trace", str(trace)]
    assert plan.main([*recipe, "--cost", str(new)]) == 0  # the recipe: TP 4
    out = capsys.readouterr().out
    assert "step cost 4.00 ms + 40.00 us/token" in _engine_line(out)  # measured at its TP
    assert "measured at TP 4 (dtype bfloat16)" in out
    assert plan.main([*recipe, "--cost", str(old)]) == 0
    out = capsys.readouterr().out
    assert "step cost 1.25 ms" in _engine_line(out)  # 4 GPUs at 80%
    assert "records no tensor_parallel_size" in out and "--cost-tp" in out
    assert plan.main([*recipe, "--cost", str(old), "--cost-tp", "4"]) == 0
    assert "step cost 4.00 ms" in _engine_line(capsys.readouterr().out)


def test_weight_and_kv_bytes_follow_the_model_dtype():
    cfg = load_config(RECIPE_14B)
    assert cfg.model.dtype == "bfloat16"
    fp32 = cfg.model_copy(update={"model": cfg.model.model_copy(update={"dtype": "float32"})})
    a = plan_inputs.assumptions(_args(), "rocm")
    shape = plan_inputs.SHAPES["Qwen/Qwen3-14B"]
    fixed = a["wake_s"].value + shape.layers * a["ipc_layer_s"].value  # not bytes
    bf16_sync, fp32_sync = plan_step._sync_s(cfg, a, shape), plan_step._sync_s(fp32, a, shape)
    assert bf16_sync is not None and fp32_sync is not None
    assert fp32_sync - fixed == pytest.approx(2 * (bf16_sync - fixed))
    # fp32: twice the weights per GPU and twice the bytes per KV token
    per_gpu = a["gpu_memory_gb"].value * 1e9 * cfg.rollout.gpu_memory_utilization - 15e9
    tp = cfg.rollout.tensor_parallel_size
    expected = (per_gpu - 4 * shape.weight_params / tp) * tp / (2 * shape.kv_bytes_per_token)
    assert plan_engine.engine_kv_tokens(a, shape, fp32) == int(expected)
    assert plan_engine.dtype_bytes(fp32) == 4 and DTYPE_BYTES["fp8"] == 1
    datasheet = plan_engine.engine_cost(a, shape, 1, None, nbytes=4)
    assert datasheet.step_base_s == pytest.approx(
        plan_engine.engine_cost(a, shape, 1, None, nbytes=2).step_base_s * 2
    )


def test_an_engine_without_kv_space_is_one_line_naming_what_to_change(capsys):
    assert plan.main(["--config", RECIPE_14B, "--engine-activation-gb", "1000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--engine-activation-gb" in err[0]
    assert "rollout.tensor_parallel_size" in err[0]
    # KV for a few tokens only: the simulator refuses the trajectories (a SchedulerError)
    assert plan.main(["--config", RECIPE_14B, "--gpu-memory-gb", "28.05"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs" in err[0] and "max_response_tokens" in err[0]


def test_engine_cost_refuses_a_fit_over_one_distinct_point(capsys):
    with pytest.raises(SystemExit) as exit_:
        engine_cost.main(["--config", "x", "--decode-batches", "8", "8"])
    assert exit_.value.code == 2
    assert "--decode-batches: give at least two distinct values" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        engine_cost.main(["--config", "x", "--prefill-lengths", "128"])
    assert "--prefill-lengths" in capsys.readouterr().err
    with pytest.raises(ValueError, match="at least two distinct x"):
        fit_line([(8, 0.1), (8, 0.2)], "batches")
    assert fit_line([(1, 3.0), (2, 5.0), (3, 7.0)]) == pytest.approx((2.0, 1.0))


def test_a_rollout_with_no_sampled_token_is_skipped(tmp_path):
    assert row_from_rollout(_rollout(0, 0, [], []), "r") is None
    empty = {"group": 0, "sample": 1, "trajectory": {"prompt_ids": [1], "loss_mask": [0, 0]}}
    assert row_from_rollout(empty, "r") is None
    rollouts = tmp_path / "rollouts"
    rollouts.mkdir()
    good = _rollout(0, 0, [(4, 0)], [["generate", 0, 1]])
    (rollouts / "step_000001.jsonl").write_text(json.dumps(empty) + "\n" + json.dumps(good))
    (rollouts / "step_000002.jsonl").write_text(json.dumps(empty) + "\n")
    steps, skipped = load_run_traces(rollouts)
    assert sorted(steps) == [1] and len(steps[1]) == 1 and skipped == 2
    (rollouts / "step_000001.jsonl").write_text(json.dumps(empty) + "\n")
    with pytest.raises(plan_inputs.PlanInputError, match="all 2 saved trajectories have no"):
        load_run_traces(rollouts)


def test_the_last_turns_tool_call_adds_no_default_tool_tokens():
    turns = (TraceTurn(10, 0.1, 5), TraceTurn(20, 0.2), TraceTurn(30, 0.3))
    row = TraceRow("r", 7, turns)
    # the middle call takes the default 128; the last one has no turn after it: none
    assert plan_step._train_tokens(row, 128) == 7 + 60 + 5 + 128
    assert plan_step._train_tokens(TraceRow("r", 7, (TraceTurn(20, 0.3, 0),)), 128) == 27


def test_a_noisy_fitted_cost_constant_is_floored_and_named():
    """perf.record.floor_costs, which perf.engine_cost and perf.step_cost both apply."""
    # a loaded machine fitted a negative prefill slope (the 35aadb1 suite's second engine)
    fitted = {"step_base_s": 5e-3, "per_token_s": -2e-6, "per_kv_token_s": 0.0}
    cost, floored = record.floor_costs(fitted)
    assert cost == {"step_base_s": 5e-3, "per_token_s": 1e-12, "per_kv_token_s": 1e-12}
    assert floored == ["per_token_s", "per_kv_token_s"]
    assert record.floor_costs({"step_base_s": 5e-3}) == ({"step_base_s": 5e-3}, [])
    # no fit at all is floored and named too (NaN compares false with everything)
    assert record.floor_costs({"per_kv_token_s": math.nan}) == (
        {"per_kv_token_s": 1e-12},
        ["per_kv_token_s"],
    )
