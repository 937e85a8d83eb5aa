"""perf.rl_step_fit: the plan's GPU step inputs recovered from steps the plan itself predicted
with known inputs (two shapes of the same depth, as measured on the H100), and a tied shape's
weights counted once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perf import plan, plan_engine, plan_inputs, rl_step_fit
from perf.plan_step import predict
from perf.rl_step_gpu import trace_rows
from rstar2.config_io import load_config
from scheduler.trace import load_trace

CONFIGS = ["configs/perf/rl_step_qwen3_1p7b.yaml", "configs/perf/rl_step_qwen3_0p6b.yaml"]
H100 = ["--peak-tflops", "989.4", "--hbm-tb-per-s", "3.35", "--gpu-memory-gb", "80"]
TRUE = {
    "learner_mfu": 0.55,
    "learner_layer_overhead_s": 0.003,
    "ipc_gb_per_s": 4.0,
    "ipc_layer_s": 0.01,
    "wake_s": 0.25,
    "engine_step_overhead_s": 0.001,
    "engine_prefill_mfu": 0.4,
}


def _flags(values: dict[str, float]) -> list[str]:
    return [x for k, v in values.items() for x in (plan_inputs.flag(k), str(v))]


def _measured(tmp_path: Path, config: str) -> str:
    """A perf.rl_step_gpu result whose phases are the plan's own prediction at TRUE."""
    cfg = load_config(config)
    name = Path(config).stem.removeprefix("rl_step_")
    trace = tmp_path / f"trace-{name}.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in trace_rows(cfg, 128)))
    a = plan_inputs.assumptions(plan._parser().parse_args(["--config", config, *H100,
                                                           *_flags(TRUE)]), "cuda")  # fmt: skip
    shape = plan_inputs.model_shape(cfg)
    cost = plan_engine.engine_cost(a, shape, 1, None)
    b = predict(cfg, 0, a, shape, load_trace(str(trace)), cost, 1)
    assert b.sync_s is not None and b.learner_s is not None
    phases = {
        "rollout": b.rollout_s,
        "learn": b.learner_s,
        "sleep": 0.05,
        "wake_weights": 0.02,
        "transfer": b.sync_s - TRUE["wake_s"],
        "release_learner": 0.03,
        "wake_kv": TRUE["wake_s"] - 0.1,
    }
    out = tmp_path / f"rl-step-{name}.json"
    out.write_text(json.dumps({"config": config, "measured": {"phases_s": phases},
                               "sync_bytes": shape.weight_bytes(2)}))  # fmt: skip
    return str(out)


def test_the_fit_recovers_the_inputs_that_made_the_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    measured = [_measured(tmp_path, c) for c in CONFIGS]
    argv = [x for m in measured for x in ("--measured", m)] + H100
    assert rl_step_fit.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    words = lines[0].split()
    got = {words[i][2:].replace("-", "_"): float(words[i + 1]) for i in range(0, len(words), 2)}
    assert got.keys() == TRUE.keys()
    for key, value in TRUE.items():
        assert got[key] == pytest.approx(value, rel=0.02), key
    assert all(line.endswith(("1.000", "0.999", "1.001")) for line in lines[1:]), lines


def test_one_step_is_not_enough_to_fit(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        rl_step_fit.main(["--measured", _measured(tmp_path, CONFIGS[0]), *H100])
    assert exc.value.code == 2


def test_the_same_step_twice_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one = _measured(tmp_path, CONFIGS[0])
    assert rl_step_fit.main(["--measured", one, "--measured", one, *H100]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "do not tell the two terms apart" in err[0], err


def test_a_tied_shape_counts_its_embedding_once() -> None:
    tied = plan_inputs.SHAPES["Qwen/Qwen3-1.7B"]
    untied = plan_inputs.SHAPES["Qwen/Qwen3-8B"]
    assert tied.tied and not untied.tied
    assert tied.weight_params == tied.matmul_params  # the LM head is the embedding
    assert untied.weight_params == untied.matmul_params + untied.vocab * untied.hidden
    # Qwen3-1.7B's model card: 1.7B parameters (1.4B without embeddings)
    assert tied.weight_params == pytest.approx(1.72e9, rel=0.02)
