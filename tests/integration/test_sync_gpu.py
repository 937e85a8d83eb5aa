"""vLLM's native weight transfer from a Ray learner group into engine actors on GPUs: CUDA IPC
into a colocated engine that slept while the learner stepped (one GPU), and the NCCL broadcast
into an engine on another GPU (two GPUs). After a train step and a sync, the engine's weights
equal, bit for bit, those of a fresh engine of the same dtype loaded from the learner's exported
HF weights (vLLM fuses and pads its parameters: engine against engine), and it samples with the
learner's log-probs. Needs a CUDA build of vLLM and Ray: skipped elsewhere."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch

from rstar2.config import Config, OptimConfig, RolloutConfig, TorchLearnerConfig
from rstar2.learner.protocol import TrainSequence
from rstar2.learner.torch_backend import TorchLearnerSettings
from rstar2.rollout.engine import SamplingSettings
from rstar2.runtime.placement import RayPlacement
from tests.helpers.learner_data import random_batch, tiny_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available()
        or importlib.util.find_spec("vllm") is None
        or importlib.util.find_spec("ray") is None,
        reason="needs a CUDA GPU, a CUDA build of vLLM and Ray",
    ),
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(900),
]
BUCKET = 1 << 20


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def local_ray():
    import os

    import ray

    # the fresh engine starts in this process, which has touched CUDA: vLLM's engine core
    # must be spawned, not forked
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"

    ray.init(include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _config(colocate: bool) -> Config:
    return Config.model_validate(
        {
            "model": {"dtype": "float32"},
            "cluster": {
                "accelerator": "cuda",
                "ray": True,
                "colocate": colocate,
                "gpus_per_node": 2,
            },
        }
    )


async def _sync_then_compare(placement: RayPlacement, model_dir: Path, transfer: str) -> None:
    import asyncio

    from rstar2.rollout.vllm_engine import VLLMEngineConfig

    settings = TorchLearnerSettings(
        model_path=str(model_dir),
        optim=OptimConfig(lr=1e-2, warmup_steps=0),
        learner=TorchLearnerConfig(micro_batch_tokens_per_gpu=1024, activation_checkpointing=False),
        device="cuda",
        bf16_autocast=False,  # fp32 like the engine: the log-probs must agree
        # torch 2.11's fp32 flex-attention decoding kernel has no valid choice for these short
        # packs (InductorError NoValidChoicesError, seen on an H100)
        attn_implementation="eager",
    )
    learner = placement.start_learner(settings)
    engine_config = VLLMEngineConfig(
        model_path=str(model_dir),
        dtype="float32",
        max_model_len=512,
        rollout=RolloutConfig(enforce_eager=True, gpu_memory_utilization=0.3),
        weight_transfer=transfer,  # type: ignore[arg-type]
        sleep_mode=transfer == "ipc",
    )
    async with asyncio.TaskGroup() as tasks:
        engine = await placement.start_engine(engine_config, tasks)
        try:
            sync = placement.weight_sync(learner, [engine], BUCKET)
            await sync.before_learn()  # colocated: the engine sleeps while the learner steps
            metrics = learner.train_step(random_batch(4, seed=1))
            assert metrics["step"] == 1
            stats = await sync.sync()
            assert stats.path == transfer and stats.bytes > 0 and stats.gb_per_s > 0
            await _same_weights_as_a_fresh_engine(engine, learner, engine_config, model_dir)
            prompt = [5, 6, 7, 8]
            gen = await engine.generate(prompt, SamplingSettings(max_tokens=16, seed=3))
            seq = TrainSequence(
                prompt + gen.token_ids,
                [0] * len(prompt) + [1] * len(gen.token_ids),
                [0.0] * len(prompt) + gen.logprobs,
            )
            (mine,) = learner.compute_logprobs([seq])
            gaps = [abs(a - b) for a, b in zip(mine[len(prompt) :], gen.logprobs, strict=True)]
            assert max(gaps) <= 1e-3  # fp32 on both sides, different kernels
        finally:
            await engine.aclose()
            learner.close()


async def _same_weights_as_a_fresh_engine(
    engine: Any, learner: Any, config: Any, folder: Path
) -> None:
    """The synced engine's checksum equals that of an engine started (in this process, same
    dtype) from the learner's exported HF weights."""
    from dataclasses import replace

    from rstar2.rollout.vllm_engine import VLLMEngine

    exported = folder.parent / "exported"
    learner.export_hf(exported)
    fresh = await VLLMEngine.create(
        replace(config, model_path=str(exported), weight_transfer="file", sleep_mode=False)
    )
    try:
        assert await engine.weight_checksum() == await fresh.weight_checksum()
    finally:
        await fresh.aclose()


async def test_ipc_into_a_colocated_engine_that_slept(local_ray, tmp_path: Path) -> None:
    await _sync_then_compare(RayPlacement(_config(True)), tiny_model(tmp_path / "m"), "ipc")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="the split placement needs 2 GPUs")
async def test_nccl_broadcast_into_an_engine_on_another_gpu(local_ray, tmp_path: Path) -> None:
    await _sync_then_compare(RayPlacement(_config(False)), tiny_model(tmp_path / "m"), "nccl")
