"""One RL step's metric record and console line, assembled from what the step produced.

Pure: the trainer hands over the rollouts, RoC's selection, the learner's metrics and the
phase times; the record's keys are what ``metrics.jsonl``, the sinks and the plots read.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rstar2.sync import SyncStats
from rstar2.trainer.batch import Rollout, Selected, rollout_metrics


@dataclass
class StepClock:
    """Wall time of a step's phases: ``mark(name)`` closes the phase that ran since the last."""

    start: float = field(default_factory=time.perf_counter)
    phases: dict[str, float] = field(default_factory=dict)
    _last: float = 0.0

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = now - (self._last or self.start)
        self._last = now

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def step_record(
    *,
    step: int,
    stage: str,
    stage_step: int,
    groups: Sequence[Sequence[Rollout]],
    selected: Selected,
    learned: dict[str, float],
    clock: StepClock,
    staleness: tuple[int, int] = (0, 0),
    synced: SyncStats | None = None,
    scheduling: dict[str, float] | None = None,
) -> dict[str, Any]:
    """``staleness``: the weight version (learner steps) that generated the rollouts, and how
    many updates behind the learner's weights they were when it learned from them;
    ``scheduling``: the dispatcher's ``sched/*`` metrics over the step's rollouts."""
    rollouts = [r for g in groups for r in g]
    total_tokens = sum(len(r.prompt_ids) + len(r.response_ids) for r in rollouts)
    sampled = sum(sum(r.trajectory.loss_mask) for r in rollouts)
    elapsed = clock.elapsed()
    time_rollout = clock.phases.get("rollout", 0.0)
    return {
        "step": step,
        "stage": stage,
        "stage_step": stage_step,
        **rollout_metrics(groups),
        **selected.metrics,
        **{f"actor/{k}": v for k, v in learned.items() if k != "step"},
        "updated": bool(selected.sequences),
        "rollout/weight_version": staleness[0],
        "rollout/staleness_steps": staleness[1],
        **(scheduling or {}),
        **(synced.metrics() if synced is not None else {}),
        "time_rollout_s": time_rollout,
        "time_generate_s": sum(r.trajectory.time_generate_s for r in rollouts),
        "time_tool_s": sum(r.trajectory.time_tool_s for r in rollouts),
        "time_reward_s": sum(r.time_reward_s for r in rollouts),
        "time_learn_s": clock.phases.get("learn", 0.0),
        "time_ahead_wait_s": clock.phases.get("ahead", 0.0),
        "time_sync_s": clock.phases.get("sync", 0.0),
        "time_step_s": elapsed,
        "tokens_per_s": total_tokens / elapsed if elapsed > 0 else 0.0,
        "gen_tokens_per_s": sampled / time_rollout if time_rollout > 0 else 0.0,
    }


def summary_line(r: dict[str, Any], total_steps: int) -> str:
    return (
        f"step {r['step']}/{total_steps} [{r['stage']}] reward {r['reward_mean']:.3f} | kept "
        f"{r['num_prompts_kept']:.0f}/{r['num_prompts']:.0f} prompts | tool "
        f"{r['tool_calls_per_traj']:.2f}/traj err {r['tool_error_ratio']:.2f} | len "
        f"{r['response_tokens_mean']:.0f} | rollout {r['time_rollout_s']:.1f}s learn "
        f"{r['time_learn_s']:.1f}s sync {r['time_sync_s']:.2f}s"
    )
