"""The megatron learner on a GPU (bf16 parameters, fp32 master weights, fused AdamW, flex
attention): against the torch backend on the same weights, learning, and an exact resume.
Skipped where there is no CUDA device or no megatron-core."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from rstar2.config import MegatronLearnerConfig, OptimConfig
from rstar2.learner.megatron.learner import MegatronLearner, MegatronLearnerSettings
from rstar2.learner.protocol import TrainSequence
from rstar2.learner.torch_backend import TorchLearner, TorchLearnerSettings
from tests.helpers.learner_data import random_batch, tiny_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
pytest.importorskip("megatron.core")

OPTIM = OptimConfig(lr=3e-3, warmup_steps=2)


def _megatron(model_dir: Path) -> MegatronLearner:
    settings = MegatronLearnerSettings(
        model_path=str(model_dir),
        optim=OPTIM,
        learner=MegatronLearnerConfig(backend="megatron", activation_checkpointing=False),
        device="cuda",
    )
    return MegatronLearner(settings)


def _gaps(batch: list[TrainSequence], a: list[list[float]], b: list[list[float]]) -> list[float]:
    return [
        abs(x - y)
        for s, u, v in zip(batch, a, b, strict=True)
        for x, y, m in zip(u, v, s.loss_mask, strict=True)
        if m
    ]


def test_megatron_on_gpu_tracks_the_torch_backend_learns_and_resumes(tmp_path: Path) -> None:
    model_dir = tiny_model(tmp_path / "m")
    learner = _megatron(model_dir)
    inner = learner.optimizer.chained_optimizers[0].optimizer
    assert inner.param_groups[0]["fused"] is True  # torch's fused AdamW on the GPU
    assert next(learner.model.parameters()).dtype == torch.bfloat16
    reference = TorchLearner(
        TorchLearnerSettings(model_path=str(model_dir), optim=OPTIM, device="cuda")
    )
    batch = random_batch(8, seed=0)
    before = learner.compute_logprobs(batch)
    ref = reference.compute_logprobs(batch)
    gaps = _gaps(batch, before, ref)
    print(f"megatron bf16 vs torch autocast log-probs: max {max(gaps):.3e}")
    assert max(gaps) < 0.1
    pos = [TrainSequence(s.token_ids, s.loss_mask, before[i], 1.0) for i, s in enumerate(batch)]
    first, ref_first = learner.train_step(pos), reference.train_step(pos)  # the same weights
    pairs = {k: (first[k], ref_first[k]) for k in ("grad_norm", "pg_loss")}
    print(f"first step, megatron vs torch: {pairs}")
    assert first["grad_norm"] == pytest.approx(ref_first["grad_norm"], rel=0.05)
    assert first["pg_loss"] == pytest.approx(ref_first["pg_loss"], rel=0.05, abs=1e-3)
    for _ in range(2):
        learner.train_step(pos)
    learner.save(tmp_path / "ckpt")
    going_on = learner.train_step(pos)
    after = learner.compute_logprobs(batch)
    mean = lambda lps: sum(map(sum, lps)) / sum(map(len, lps))  # noqa: E731
    assert mean(after) > mean(before)  # the positive-advantage steps raised the likelihood
    learner.close()
    resumed = _megatron(model_dir)
    resumed.load(tmp_path / "ckpt")
    assert resumed.train_step(pos) == going_on
    assert resumed.compute_logprobs(batch) == after


def test_the_packed_attention_kernels_agree_on_gpu() -> None:
    """The core attention's GPU kernels (flash varlen where this torch has it, flex attention
    otherwise) against one causal SDPA per sequence, forward and backward, in bf16."""
    import torch.nn.functional as F

    from rstar2.learner.megatron import varlen
    from rstar2.learner.megatron.flex import packed_flex_attention

    torch.manual_seed(0)
    lengths = [300, 77, 645]
    bounds = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    total, scale = bounds[-1], 128**-0.5

    def inputs() -> list[torch.Tensor]:
        shapes = ((total, 16, 128), (total, 8, 128), (total, 8, 128))
        return [
            torch.randn(s, device="cuda", dtype=torch.bfloat16).requires_grad_() for s in shapes
        ]

    def per_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        outs = []
        for a, b in itertools.pairwise(bounds):
            qs, ks, vs = (t[a:b].transpose(0, 1)[None] for t in (q, k, v))
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
            outs.append(o[0].transpose(0, 1))
        return torch.cat(outs)

    base = inputs()
    ref = per_sequence(*base)
    ref.float().pow(2).sum().backward()
    cu = torch.tensor(bounds, dtype=torch.int32, device="cuda")
    kernels = {"flex": lambda q, k, v: packed_flex_attention(q, k, v, bounds, scale)}
    if varlen.available(torch.device("cuda")):
        kernels["varlen"] = lambda q, k, v: varlen.packed_varlen_attention(
            q, k, v, cu, max(lengths), scale
        )
    assert "varlen" in kernels or torch.version.hip is not None  # the H200's torch has it
    for name, kernel in kernels.items():
        mine = [t.detach().clone().requires_grad_() for t in base]
        out = kernel(*mine)
        out.float().pow(2).sum().backward()
        assert (out - ref).abs().max().item() < 2e-2, name
        for g, r in zip((t.grad for t in mine), (t.grad for t in base), strict=True):
            assert g is not None and r is not None
            assert (g - r).abs().max().item() < 5e-2 * r.abs().max().item(), name
