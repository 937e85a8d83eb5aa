"""A vLLM engine inside a Ray actor on a local Ray cluster: the dispatcher drives it, and weights
synced through Ray's object store reach it (learner / engine parity afterwards)."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest
import pytest_asyncio

from rstar2.agent.loop import AgentSettings
from rstar2.config import OptimConfig
from rstar2.learner.protocol import TrainSequence
from rstar2.learner.torch_backend import TorchLearner, TorchLearnerSettings
from rstar2.rollout.dispatch import Dispatcher, run_scheduled
from rstar2.rollout.engine import EngineDown
from rstar2.sync.buckets import sync_weights
from sandbox_pool import PoolConfig, SandboxPool
from scheduler.core import SchedulerSettings
from tests.helpers.tool_model import SCRIPTS
from tests.helpers.vllm_setup import engine_config, tool_template

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None or importlib.util.find_spec("ray") is None,
        reason="vllm and ray needed",
    ),
    pytest.mark.asyncio(loop_scope="module"),
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def ray_engine(tool_model_dir: Path):
    import ray

    from rstar2.rollout.ray_engine import RayEngine

    config = engine_config(tool_model_dir, blocks=128)  # sets VLLM_CACHE_ROOT before ray starts
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    engine = await RayEngine.create(config)
    yield engine
    await engine.aclose()
    ray.shutdown()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sandbox():
    async with SandboxPool(PoolConfig(num_workers=1)) as pool:
        yield pool


async def test_dispatcher_and_weight_sync_through_ray(ray_engine, sandbox, tool_model_dir: Path):
    template = tool_template(tool_model_dir)
    greedy = AgentSettings(max_turns=3, max_response_tokens=300, temperature=0.0)
    ids = template.encode_prompt([{"role": "user", "content": SCRIPTS[0].problem}])
    settings = SchedulerSettings(policy="kv_affinity", block_size_tokens=ray_engine.block_size)
    async with Dispatcher([ray_engine], settings) as dispatcher:
        traj = await run_scheduled(dispatcher, sandbox, template, ids, greedy)
        assert traj.num_tool_calls == 1 and "\\boxed{42}" in traj.response_text
        assert ray_engine.kv_stats().capacity_tokens > 0

        learner = TorchLearner(
            TorchLearnerSettings(
                model_path=str(tool_model_dir), optim=OptimConfig(lr=1e-3, warmup_steps=0)
            )
        )
        seq = TrainSequence(
            traj.prompt_ids + traj.response_ids,
            [0] * len(traj.prompt_ids) + traj.loss_mask,
            [0.0] * len(traj.prompt_ids) + traj.logprobs,
            -1.0,
        )
        before = await ray_engine.weight_checksum()
        learner.train_step([seq])
        stats = await sync_weights(learner, [ray_engine], bucket_bytes=256 * 1024)
        assert stats.buckets > 1 and await ray_engine.weight_checksum() != before

        sampled = AgentSettings(max_turns=3, max_response_tokens=300, temperature=1.0)
        trajs = await asyncio.gather(
            *(run_scheduled(dispatcher, sandbox, template, ids, sampled) for _ in range(4))
        )
    seqs = [
        TrainSequence(
            t.prompt_ids + t.response_ids,
            [0] * len(t.prompt_ids) + t.loss_mask,
            [0.0] * len(t.prompt_ids) + t.logprobs,
        )
        for t in trajs
    ]
    gaps = [
        abs(a - b)
        for s, lp in zip(seqs, learner.compute_logprobs(seqs), strict=True)
        for a, b, m in zip(s.old_logprobs, lp, s.loss_mask, strict=True)
        if m
    ]
    assert max(gaps) <= 1e-3


async def test_a_killed_engine_actor_is_an_engine_down_to_the_weight_sync(
    ray_engine, tool_model_dir: Path
) -> None:
    """Last in this module: it kills the module's engine. The weight sync drops the dead actor
    as it drops a dead in-process engine (the runtime then restarts it); no Ray error escapes."""
    import ray

    learner = TorchLearner(
        TorchLearnerSettings(
            model_path=str(tool_model_dir), optim=OptimConfig(lr=1e-3, warmup_steps=0)
        )
    )
    ray.kill(ray_engine.actor)
    stats = await sync_weights(learner, [ray_engine], bucket_bytes=256 * 1024)
    assert stats.failed == (0,)
    with pytest.raises(EngineDown, match=r"the engine actor is gone \(a checksum\)"):
        await ray_engine.weight_checksum()
