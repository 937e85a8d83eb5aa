"""Learner / engine parity on CPU (fp32): the learner's log-probs of sampled multi-turn
trajectories equal vLLM's sampling log-probs, before and after a train step and a weight sync."""

from __future__ import annotations

import asyncio
import importlib.util
from dataclasses import replace
from pathlib import Path

import pytest
import pytest_asyncio

from rstar2.agent.loop import AgentSettings, Trajectory, run_trajectory
from rstar2.agent.template import ChatTemplate
from rstar2.config import OptimConfig, TorchLearnerConfig
from rstar2.learner.protocol import TrainSequence
from rstar2.learner.torch_backend import TorchLearner, TorchLearnerSettings
from rstar2.sync.buckets import sync_weights
from tests.helpers.tool_model import SCRIPTS
from tests.helpers.vllm_setup import engine_config

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed"),
    pytest.mark.asyncio(loop_scope="module"),
]
BUCKET = 256 * 1024  # several buckets for the tiny model
SAMPLED = AgentSettings(max_turns=3, max_response_tokens=300, temperature=1.0, seed=3)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tool_model_dir: Path):
    from rstar2.rollout.vllm_engine import VLLMEngine

    eng = await VLLMEngine.create(engine_config(tool_model_dir, blocks=128))
    yield eng
    await eng.aclose()


async def _sample(engine, sandbox, template: ChatTemplate, n: int) -> list[Trajectory]:
    prompts = [
        template.encode_prompt([{"role": "user", "content": SCRIPTS[i % 3].problem}])
        for i in range(n)
    ]
    return list(
        await asyncio.gather(
            *(
                run_trajectory(engine, sandbox, template, p, replace(SAMPLED, seed=3 + 100 * i))
                for i, p in enumerate(prompts)
            )
        )
    )


def _sequences(trajs: list[Trajectory], advantages: list[float]) -> list[TrainSequence]:
    out = []
    for t, adv in zip(trajs, advantages, strict=True):
        pad = [0] * len(t.prompt_ids)
        out.append(
            TrainSequence(
                t.prompt_ids + t.response_ids,
                pad + t.loss_mask,
                [0.0] * len(pad) + t.logprobs,
                adv,
            )
        )
    return out


def _max_gap(seqs: list[TrainSequence], learner_lps: list[list[float]]) -> float:
    return max(
        abs(a - b)
        for s, lp in zip(seqs, learner_lps, strict=True)
        for a, b, m in zip(s.old_logprobs, lp, s.loss_mask, strict=True)
        if m
    )


async def test_learner_matches_engine_before_and_after_a_step_and_sync(
    engine, sandbox, template, tool_model_dir: Path
):
    learner = TorchLearner(
        TorchLearnerSettings(
            model_path=str(tool_model_dir),
            optim=OptimConfig(lr=1e-3, warmup_steps=0),
            learner=TorchLearnerConfig(micro_batch_tokens_per_gpu=2048),
        )
    )
    trajs = await _sample(engine, sandbox, template, 12)
    assert sum(t.num_turns > 1 for t in trajs) >= 6  # multi-turn: tool responses in between
    seqs = _sequences(trajs, [1.0 if i % 2 else -1.0 for i in range(len(trajs))])
    gap = _max_gap(seqs, learner.compute_logprobs(seqs))
    print(f"parity before the step: max |engine - learner| = {gap:.2e} over "
          f"{sum(sum(s.loss_mask) for s in seqs)} sampled tokens")  # fmt: skip
    assert gap <= 1e-3

    before = await engine.weight_checksum()
    learner.train_step(seqs)
    stats = await sync_weights(learner, [engine], bucket_bytes=BUCKET)
    assert stats.buckets > 1
    assert await engine.weight_checksum() != before

    fresh = await _sample(engine, sandbox, template, 12)
    new = _sequences(fresh, [0.0] * len(fresh))
    gap_after = _max_gap(new, learner.compute_logprobs(new))
    print(f"parity after step + sync: {gap_after:.2e}")
    assert gap_after <= 1e-3
    # the sync mattered: the old sequences now score differently on both sides
    moved = _max_gap(seqs, learner.compute_logprobs(seqs))
    assert moved > 1e-2


async def test_the_sync_audit_finds_equal_weights_after_a_sync_and_a_stale_engine(
    engine, tool_model_dir: Path, tmp_path: Path
):
    """rstar2.sync.audit against real engines: a synced engine's checksum equals an engine's
    loaded from the learner's export, and an engine left behind a step is caught."""
    from rstar2.sync import audit
    from tests.helpers.learner_data import random_batch

    learner = TorchLearner(
        TorchLearnerSettings(
            model_path=str(tool_model_dir),
            optim=OptimConfig(lr=1e-3, warmup_steps=0),
            learner=TorchLearnerConfig(micro_batch_tokens_per_gpu=2048),
        )
    )
    config = engine_config(tool_model_dir, blocks=64)
    await sync_weights(learner, [engine], bucket_bytes=BUCKET)
    await audit.record(tmp_path, [engine], learner, config)  # step 0
    learner.train_step(random_batch(4, seed=1))
    await sync_weights(learner, [engine], bucket_bytes=BUCKET)
    await audit.record(tmp_path, [engine], learner, config)  # step 1
    learner.train_step(random_batch(4, seed=2))
    await audit.record(tmp_path, [engine], learner, config)  # step 2: not synced
    rows = await audit.audit(tmp_path)
    assert [(r.step, r.how, r.ok) for r in rows] == [
        (0, "fresh engine", True),
        (1, "loaded into the audit engine", True),
        (2, "loaded into the audit engine", False),
        (2, "fresh engine", False),
    ]
    assert audit.main([str(tmp_path / "nothing")]) == 2  # no index: one line, no traceback
