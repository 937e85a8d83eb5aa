"""perf.rl_step_fit: the plan's GPU step inputs recovered from steps the plan itself predicted
with known inputs (the four benchmark shapes: three of 28 layers, as measured on the H100, and
one of 24), each rollout simulated as the benchmark runs it (no scheduler, vLLM's batch limit);
the engine's batch limit in the plan; and a tied shape's weights counted once."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from perf import plan, plan_engine, plan_inputs, rl_step_fit
from perf.plan_step import predict
from perf.rl_step_gpu import trace_rows
from rstar2.config_io import load_config
from scheduler.trace import load_trace

CONFIGS = [
    "configs/perf/rl_step_qwen3_1p7b.yaml",
    "configs/perf/rl_step_qwen3_0p6b.yaml",
    "configs/perf/rl_step_qwen2p5_1p5b.yaml",
    "configs/perf/rl_step_qwen2p5_0p5b.yaml",
]
# inputs the fit takes as given (the card; the engine's memory beside weights and KV, and its
# prefill GEMMs' efficiency, which no measured step's time can tell apart from the overhead)
GIVEN = ["--peak-tflops", "989.4", "--hbm-tb-per-s", "3.35", "--gpu-memory-gb", "80",
         "--engine-activation-gb", "2", "--engine-prefill-mfu", "0.5"]  # fmt: skip
TRUE = {
    "learner_mfu": 0.55,
    "learner_layer_overhead_s": 0.003,
    "ipc_gb_per_s": 4.0,
    "ipc_layer_s": 0.01,
    "wake_s": 0.25,
    # a host time per step that some steps' GPU time stays under and others' exceeds (so the
    # two engine terms can be told apart), half of it hidden under the GPU's work
    "engine_step_overhead_s": 0.004,
    "engine_host_overlap": 0.5,
}


def _flags(values: dict[str, float]) -> list[str]:
    return [x for k, v in values.items() for x in (plan_inputs.flag(k), str(v))]


def _assumptions(config: str, *argv: str) -> dict[str, plan_inputs.Assumption]:
    return plan_inputs.assumptions(plan._parser().parse_args(["--config", config, *argv]), "cuda")


def _measured(tmp_path: Path, config: str, true: dict[str, float] = TRUE) -> str:
    """A perf.rl_step_gpu result whose phases are the plan's own prediction at ``true``."""
    cfg = load_config(config)
    name = Path(config).stem.removeprefix("rl_step_")
    trace = tmp_path / f"trace-{name}.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in trace_rows(cfg, 128)))
    a = _assumptions(config, *GIVEN, *_flags(true))
    shape = plan_inputs.model_shape(cfg)
    cost = plan_engine.engine_cost(a, shape, 1, None)
    b = predict(cfg, 0, a, shape, load_trace(str(trace)), cost, 1, policy="round_robin")
    assert b.sync_s is not None and b.learner_s is not None
    phases = {
        "rollout": b.rollout_s,
        "learn": b.learner_s,
        "sleep": 0.05,
        "wake_weights": 0.02,
        "transfer": b.sync_s - true["wake_s"],
        "release_learner": 0.03,
        "wake_kv": true["wake_s"] - 0.1,
    }
    out = tmp_path / f"rl-step-{name}.json"
    out.write_text(json.dumps({"config": config, "measured": {"phases_s": phases},
                               "sync_bytes": shape.weight_bytes(2)}))  # fmt: skip
    return str(out)


@pytest.mark.parametrize("configs", [CONFIGS[:3], CONFIGS], ids=["28-layers", "24-and-28"])
def test_the_fit_recovers_the_inputs_that_made_the_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], configs: list[str]
) -> None:
    measured = [_measured(tmp_path, c) for c in configs]
    argv = [x for m in measured for x in ("--measured", m)] + GIVEN
    assert rl_step_fit.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    words = lines[0].split()
    got = {words[i][2:].replace("-", "_"): float(words[i + 1]) for i in range(0, len(words), 2)}
    assert got.keys() == TRUE.keys()
    for key, value in TRUE.items():
        assert got[key] == pytest.approx(value, rel=0.02), key
    # one line per step: measured / predicted with the fit, per part and for the step
    assert len(lines) == 1 + len(configs)
    for line in lines[1:]:
        ratios = dict(re.findall(r"(rollout|learner|sync|step) (\d+\.\d+)", line))
        assert ratios.keys() == {"rollout", "learner", "sync", "step"}, line
        assert all(float(r) == pytest.approx(1.0, abs=0.0015) for r in ratios.values()), line


def test_one_step_is_not_enough_to_fit(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        rl_step_fit.main(["--measured", _measured(tmp_path, CONFIGS[0]), *GIVEN])
    assert exc.value.code == 2


def test_the_same_step_twice_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one = _measured(tmp_path, CONFIGS[0])
    assert rl_step_fit.main(["--measured", one, "--measured", one, *GIVEN]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "do not tell" in err[0], err


def test_steps_whose_gpu_time_always_exceeds_the_host_time_cannot_split_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every step's GPU time above the host time (0.2 ms: under any of these shapes' weight
    read): only (1 - overlap) x host shows in the rollouts, and the fit says so in one line."""
    true = {**TRUE, "engine_step_overhead_s": 0.0002}
    measured = [_measured(tmp_path, c, true) for c in CONFIGS]
    argv = [x for m in measured for x in ("--measured", m)] + GIVEN
    assert rl_step_fit.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "host time from its overlap" in err[0], err


def test_a_tied_shape_counts_its_embedding_once() -> None:
    tied = plan_inputs.SHAPES["Qwen/Qwen3-1.7B"]
    untied = plan_inputs.SHAPES["Qwen/Qwen3-8B"]
    assert tied.tied and not untied.tied
    assert tied.weight_params == tied.matmul_params  # the LM head is the embedding
    assert untied.weight_params == untied.matmul_params + untied.vocab * untied.hidden
    # Qwen3-1.7B's model card: 1.7B parameters (1.4B without embeddings)
    assert tied.weight_params == pytest.approx(1.72e9, rel=0.02)


def test_the_plan_runs_each_engine_at_vllms_batch_limit(tmp_path: Path) -> None:
    """The Qwen2.5-1.5B step's 512 sequences fit the KV at once, but vLLM runs 128 at a time
    (AsyncLLM's default max_num_seqs): four waves of 1,536 steps, not two of 256 sequences."""
    config = CONFIGS[2]
    cfg = load_config(config)
    shape = plan_inputs.model_shape(cfg)
    _measured(tmp_path, config)  # writes the benchmark's trace beside it
    rows = load_trace(str(tmp_path / "trace-qwen2p5_1p5b.jsonl"))

    def rollout_s(*argv: str) -> float:
        a = _assumptions(config, *GIVEN, *_flags(TRUE), *argv)
        assert plan_engine.engine_kv_tokens(a, shape, cfg) > 512 * (128 + 1536)
        cost = plan_engine.engine_cost(a, shape, 1, None)
        return predict(cfg, 0, a, shape, rows, cost, 1, policy="round_robin").rollout_s

    assert plan_inputs.DEFAULTS["engine_max_num_seqs"][0] == 128
    at_128, at_256 = rollout_s(), rollout_s("--engine-max-num-seqs", "256")
    # twice the steps: each step's overhead and weight read paid twice as often, while the
    # sequences' own terms (decode GEMMs, KV reads) are the same in total
    assert 1.3 < at_128 / at_256 < 1.6
