"""The torch learner on a GPU (bf16 autocast): skipped where there is no CUDA device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rstar2.config import OptimConfig
from rstar2.learner.protocol import TrainSequence
from rstar2.learner.torch_backend import TorchLearner, TorchLearnerSettings
from tests.helpers.learner_data import random_batch, tiny_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_bf16_training_on_gpu_tracks_fp32(tmp_path: Path) -> None:
    model_dir = tiny_model(tmp_path / "m")
    settings = TorchLearnerSettings(
        model_path=str(model_dir), optim=OptimConfig(lr=3e-3, warmup_steps=0), device="cuda"
    )
    learner = TorchLearner(settings)
    assert next(learner.model.parameters()).dtype == torch.float32  # fp32 master weights
    batch = random_batch(8, seed=0)
    before = learner.compute_logprobs(batch)
    pos = [TrainSequence(s.token_ids, s.loss_mask, before[i], 1.0) for i, s in enumerate(batch)]
    for _ in range(5):
        metrics = learner.train_step(pos)
    assert metrics["grad_norm"] > 0 and learner.step == 5
    low = learner.compute_logprobs(batch)
    learner.bf16_autocast = False
    ref = learner.compute_logprobs(batch)
    gaps = [
        abs(a - b)
        for s, x, y in zip(batch, low, ref, strict=True)
        for a, b, m in zip(x, y, s.loss_mask, strict=True)
        if m
    ]
    print(f"bf16 vs fp32 log-probs on GPU: max {max(gaps):.3e}, mean {sum(gaps) / len(gaps):.3e}")
    assert max(gaps) < 0.1
    mean_before = sum(sum(x) for x in before) / sum(len(x) for x in before)
    mean_after = sum(sum(x) for x in ref) / sum(len(x) for x in ref)
    assert mean_after > mean_before  # the positive-advantage steps raised the likelihood


def test_offload_frees_the_gpu_and_the_next_step_is_unchanged(tmp_path: Path) -> None:
    """Colocated placement's offload: parameters and Adam moments leave the GPU (allocated
    memory falls by at least their size), and the step after a reload equals the step of a
    learner that never offloaded (same GPU, same kernels: bit-equal)."""
    model_dir = tiny_model(tmp_path / "m")
    settings = TorchLearnerSettings(
        model_path=str(model_dir),
        optim=OptimConfig(lr=3e-3, warmup_steps=0),
        device="cuda",
        attn_implementation="eager",  # deterministic backward: two learners agree bit for bit
    )
    batch = random_batch(8, seed=0)
    moved, kept = TorchLearner(settings), TorchLearner(settings)
    for learner in (moved, kept):
        learner.train_step(batch)
    params = sum(p.numel() * p.element_size() for p in moved.model.parameters())
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    moved.offload()
    freed = before - torch.cuda.memory_allocated()
    assert next(moved.model.parameters()).device.type == "cpu"
    assert freed >= 3 * params  # weights + both Adam moments (fp32)
    moved.save(tmp_path / "ckpt")  # written from host memory
    got, want = moved.train_step(batch), kept.train_step(batch)  # reloads first
    assert next(moved.model.parameters()).device.type == "cuda"
    assert got == want
    for (name, a), (_, b) in zip(
        moved.model.named_parameters(), kept.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name
    resumed = TorchLearner(settings)
    resumed.load(tmp_path / "ckpt")
    assert resumed.train_step(batch) == want
    print(f"offload freed {freed / 2**20:.1f} MiB of {before / 2**20:.1f} MiB allocated")
