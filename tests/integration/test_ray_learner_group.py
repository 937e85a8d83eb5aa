"""A learner of two ranks as a Ray learner group (gloo on CPU): the same steps as one process
on the whole batch, and a group checkpoint that resumes bit for bit."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from rstar2.config import OptimConfig, TorchLearnerConfig
from rstar2.learner.ray_learner import RayLearner
from rstar2.learner.torch_backend import TorchLearner, TorchLearnerSettings
from tests.helpers.learner_data import full_weights, random_batch, tiny_model

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray needed"),
    pytest.mark.timeout(600),
]


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _settings(model_dir: Path, ranks: int) -> TorchLearnerSettings:
    return TorchLearnerSettings(
        model_path=str(model_dir),
        optim=OptimConfig(lr=1e-3, warmup_steps=2),
        learner=TorchLearnerConfig(
            micro_batch_tokens_per_gpu=64, activation_checkpointing=False, num_ranks=ranks
        ),
        device="cpu",
    )


def test_two_ranks_equal_one_process_and_resume_bit_exactly(local_ray, tmp_path: Path) -> None:
    model_dir = tiny_model(tmp_path / "m")
    batch = random_batch(7, seed=4)  # odd: the ranks hold 4 and 3 sequences
    single = TorchLearner(_settings(model_dir, 1))
    group = RayLearner.create(_settings(model_dir, 2), num_cpus=0, num_threads=1)
    assert group.num_ranks == 2
    lp_single, lp_group = single.compute_logprobs(batch), group.compute_logprobs(batch)
    pairs = zip(lp_single, lp_group, strict=True)
    gap = max(abs(a - b) for x, y in pairs for a, b in zip(x, y, strict=True))
    assert gap < 1e-6
    first = group.train_step(batch)
    ref = single.train_step(batch)
    for key in ("pg_loss", "grad_norm", "tokens", "clip_frac_low", "clip_frac_high"):
        assert first[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-9), key
    group.save(tmp_path / "ckpt")
    going_on, going_on_weights = group.train_step(batch), full_weights(group)
    single.train_step(batch)
    ref_weights = full_weights(single)
    assert sorted(going_on_weights) == sorted(ref_weights)
    lr = 1e-3
    for name, w in ref_weights.items():  # as the megatron parity test: sign-ambiguous Adam
        diff = (going_on_weights[name] - w).abs()  # entries aside, within 1e-5 of the scale
        assert diff.max().item() <= 2 * lr, name
        assert int((diff > 1e-5 * w.abs().max()).sum()) <= max(1, w.numel() // 1000), name
    group.close()
    resumed = RayLearner.create(_settings(model_dir, 2), num_cpus=0, num_threads=1)
    try:
        resumed.load(tmp_path / "ckpt")
        assert resumed.step == 1
        assert resumed.train_step(batch) == going_on
        weights = full_weights(resumed)
        assert all(torch.equal(weights[n], w) for n, w in going_on_weights.items())
    finally:
        resumed.close()


def test_a_layout_the_model_cannot_take_is_a_config_error(local_ray, tmp_path: Path) -> None:
    """Raised in a rank at start-up, it reaches the caller as the ConfigError it is."""
    pytest.importorskip("megatron.core")
    from rstar2.config import ConfigError, MegatronLearnerConfig
    from rstar2.learner.megatron.learner import MegatronLearnerSettings

    model_dir = tiny_model(tmp_path / "m")  # 4 attention heads
    section = MegatronLearnerConfig(backend="megatron", tensor_parallel_size=3, num_ranks=3)
    settings = MegatronLearnerSettings(model_path=str(model_dir), learner=section, device="cpu")
    with pytest.raises(ConfigError, match=r"learner\.tensor_parallel_size: the model's"):
        RayLearner.create(settings, num_cpus=0, num_threads=1)
