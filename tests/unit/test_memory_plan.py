"""The memory plan (rstar2.memory_plan): per-GPU figures of both phases for the recipe as
written, and `rstar2 launch` refusing a layout that does not fit, naming the key to change."""

from __future__ import annotations

from pathlib import Path

import pytest

from rstar2.cli import EXIT_USER_ERROR, main
from rstar2.config_io import load_config
from rstar2.memory_plan import GIB, plan_memory
from rstar2.model_shapes import QWEN3_1_7B, QWEN3_14B, DecoderShape
from tests.conftest import REPO

PAPER = str(REPO / "configs" / "rstar2_14b_mi300x.yaml")
SMALL = DecoderShape.from_hf_config(QWEN3_1_7B)


def _learner(*overrides: str) -> dict[str, float]:
    cfg = load_config(None, ["learner.backend=megatron", *overrides])
    plan = plan_memory(cfg, SMALL)
    return {**dict(plan.learner.parts), "peak": plan.learner.peak}


def test_the_learner_state_is_18_bytes_a_parameter_and_the_optimizer_shards_over_dp() -> None:
    one = _learner()
    assert one["weights"] + one["grads"] + one["optimizer"] == pytest.approx(
        18 * SMALL.weight_params
    )
    four = _learner("learner.num_ranks=4", "cluster.ray=true")
    assert four["optimizer"] == pytest.approx(one["optimizer"] / 4)
    assert four["weights"] == one["weights"]


def test_activations_grow_with_tokens_and_checkpointing_keeps_only_layer_inputs() -> None:
    small, large = (_learner(f"learner.micro_batch_tokens_per_gpu={t}") for t in (8192, 16384))
    assert large["logits"] == pytest.approx(2 * small["logits"])
    assert large["activations"] == pytest.approx(2 * small["activations"])
    stored = _learner(
        "learner.micro_batch_tokens_per_gpu=8192", "learner.activation_checkpointing=false"
    )
    assert stored["activations"] > 10 * small["activations"]
    tp2 = _learner(
        "learner.micro_batch_tokens_per_gpu=8192", "learner.tensor_parallel_size=2",
        "learner.num_ranks=2", "cluster.ray=true",
    )  # fmt: skip
    assert tp2["logits"] == pytest.approx(small["logits"] / 2, rel=1e-2)  # vocabulary padded


def test_the_recipe_as_written_fits_its_mi300x_in_both_phases(
    capsys: pytest.CaptureFixture[str],
) -> None:
    plan = plan_memory(load_config(PAPER), DecoderShape.from_hf_config(QWEN3_14B))
    assert plan.device_bytes == 192 * GIB
    assert plan.learner.peak < plan.rollout.peak < plan.device_bytes
    rollout = dict(plan.rollout.parts)
    assert rollout["learner state"] > 20 * GIB  # resident while the engines generate
    assert main(["layout", "--config", PAPER]) == 0
    out = capsys.readouterr().out
    assert "the known shape of Qwen/Qwen3-14B (no config.json here)" in out
    assert "  learner: peak " in out and "  rollout: peak " in out


def _launch(capsys: pytest.CaptureFixture[str], tmp_path: Path, *overrides: str) -> tuple[int, str]:
    code = main(
        ["launch", "slurm", "--config", PAPER, "--dry-run", f"runs_dir={tmp_path}", *overrides]
    )
    out, err = capsys.readouterr()
    return code, out + err


def test_launch_refuses_a_phase_past_the_gpu_naming_the_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # the recipe on 80 GB GPUs: 0.8 of them beside the learner's resident state does not fit
    code, said = _launch(capsys, tmp_path, "cluster.accelerator=cuda")
    assert code == EXIT_USER_ERROR and "rollout.gpu_memory_utilization" in said, said
    assert "use at most 0.7" in said
    code, said = _launch(
        capsys, tmp_path, "cluster.accelerator=cuda", "rollout.gpu_memory_utilization=0.6"
    )
    assert code == 0, said
    code, said = _launch(capsys, tmp_path, "learner.micro_batch_tokens_per_gpu=400000")
    assert code == EXIT_USER_ERROR and "learner.micro_batch_tokens_per_gpu" in said, said
    assert [p.name for p in tmp_path.iterdir()] == ["rstar2-14b"]  # the one launch that fit


def test_a_model_of_unknown_shape_is_launched_with_a_note(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, said = _launch(capsys, tmp_path, "model.path=my-org/unknown-model")
    assert code == 0, said
    assert "note: memory per GPU not checked" in said
