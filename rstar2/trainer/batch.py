"""From finished rollouts to the learner's batch: GRPO-RoC selection and advantages (pure).

A step's rollouts come as groups, one per prompt, each the ``num_samples_per_prompt`` (2G)
samples in sample order. :func:`select` keeps, per group, what
:func:`rstar2.algo.roc.downsample` keeps (with ``do_down_sampling`` off: every group whole,
still dropping equal-reward groups when ``reject_equal_reward`` is on), computes GRPO
advantages over the kept rollouts of each group, and flattens them into
:class:`~rstar2.learner.protocol.TrainSequence` s. Its metrics describe what RoC did.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

from rstar2.agent.loop import Trajectory
from rstar2.algo.advantage import grpo_advantages
from rstar2.algo.roc import TraceStats, all_rewards_equal, downsample, penalty_terms
from rstar2.config import AlgorithmConfig, AugmentationConfig
from rstar2.learner.protocol import TrainSequence


@dataclass
class Rollout:
    """One finished trajectory (the agent loop's own :class:`Trajectory`, not a copy) with its
    place in the step (``group``: the prompt, ``sample``: which of its samples) and its reward.

    JSON-serialisable (:meth:`to_json` / :meth:`from_json`): the record/replay seam writes it.
    """

    group: int
    sample: int
    trajectory: Trajectory
    reward: float
    time_reward_s: float = 0.0

    @property
    def prompt_ids(self) -> list[int]:
        return self.trajectory.prompt_ids

    @property
    def response_ids(self) -> list[int]:
        return self.trajectory.response_ids

    @property
    def stats(self) -> TraceStats:
        t = self.trajectory
        return TraceStats(
            reward=self.reward,
            num_tool_calls=t.num_tool_calls,
            num_tool_errors=t.num_tool_errors,
            num_answer_pairs=t.num_answer_pairs,
            num_turns=t.num_turns,
        )

    def sequence(self, advantage: float) -> TrainSequence:
        t = self.trajectory
        n = len(t.prompt_ids)
        return TrainSequence(
            token_ids=t.prompt_ids + t.response_ids,
            loss_mask=[0] * n + t.loss_mask,
            old_logprobs=[0.0] * n + t.logprobs,
            advantage=advantage,
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Rollout:
        """A record of :meth:`to_json`, or of the flat form earlier versions wrote."""
        traj = data.get("trajectory")
        if traj is None:  # flat: the trajectory's fields beside the rollout's
            traj = {k: v for k, v in data.items() if k in _TRAJECTORY_FIELDS}
        missing = _REQUIRED - set(traj)
        missing |= {"group", "sample", "reward"} - set(data)
        if missing:
            raise ValueError(f"a rollout record lacks {sorted(missing)}")
        trajectory = Trajectory(**{k: v for k, v in traj.items() if k in _TRAJECTORY_FIELDS})
        trajectory.tool_calls = [tuple(c) for c in trajectory.tool_calls]  # type: ignore[misc]
        trajectory.spans = [tuple(s) for s in trajectory.spans]  # type: ignore[misc]
        return cls(
            group=int(data["group"]),
            sample=int(data["sample"]),
            trajectory=trajectory,
            reward=float(data["reward"]),
            time_reward_s=float(data.get("time_reward_s", 0.0)),
        )


_TRAJECTORY_FIELDS = {f.name for f in fields(Trajectory)}
_REQUIRED = {
    *("prompt_ids", "response_ids", "loss_mask", "logprobs", "num_turns"),
    *("num_tool_calls", "num_tool_errors", "num_answer_pairs", "finish_reason"),
}


@dataclass
class Selected:
    sequences: list[TrainSequence]
    kept: list[Rollout]
    metrics: dict[str, float]


def select(
    groups: Sequence[Sequence[Rollout]],
    augmentation: AugmentationConfig,
    algorithm: AlgorithmConfig,
    rng: random.Random,
) -> Selected:
    """RoC-select each group, then compute advantages over what is kept (module docstring)."""
    cfg = augmentation.down_sampling_config
    kept_groups: list[list[Rollout]] = []
    dropped_equal = 0
    for group in groups:
        stats = [r.stats for r in group]
        if not group:
            continue
        if cfg.reject_equal_reward and all_rewards_equal(stats):
            dropped_equal += 1
            continue
        if augmentation.do_down_sampling:
            indices = downsample(stats, cfg, rng)
        else:
            indices = list(range(len(group)))
        if indices:
            kept_groups.append([group[i] for i in indices])
    kept = [r for g in kept_groups for r in g]
    sequences: list[TrainSequence] = []
    if kept:
        rewards = torch.tensor([r.reward for r in kept], dtype=torch.float64)
        ids = torch.tensor([gi for gi, g in enumerate(kept_groups) for _ in g])
        adv = grpo_advantages(rewards, ids, norm_by_std=algorithm.norm_adv_by_std)
        sequences = [r.sequence(float(a)) for r, a in zip(kept, adv.tolist(), strict=True)]
    everything = [r for g in groups for r in g]
    metrics = {
        "num_prompts": float(len(groups)),
        "num_prompts_kept": float(len(kept_groups)),
        "num_traj_kept": float(len(kept)),
        "roc/groups_all_equal": float(dropped_equal),
        "roc/groups_dropped_other": float(len(groups) - dropped_equal - len(kept_groups)),
        "roc/kept_reward_mean": _mean([r.reward for r in kept]),
        "roc/kept_tool_error_ratio": _error_ratio(kept),
        "roc/all_tool_error_ratio": _error_ratio(everything),
        "roc/kept_pos_format_penalty": _mean(
            [penalty_terms(r.stats)[1] for r in kept if r.reward > 0]
        ),
        "roc/all_pos_format_penalty": _mean(
            [penalty_terms(r.stats)[1] for r in everything if r.reward > 0]
        ),
    }
    return Selected(sequences, kept, metrics)


def rollout_metrics(groups: Sequence[Sequence[Rollout]]) -> dict[str, float]:
    """Per-step figures over every rollout of the step (before selection)."""
    rollouts = [r for g in groups for r in g]
    calls = sum(r.trajectory.num_tool_calls for r in rollouts)
    return {
        "reward_mean": _mean([r.reward for r in rollouts]),
        "solve_all_ratio": _mean([float(all(r.reward > 0 for r in g)) for g in groups if g]),
        "solve_none_ratio": _mean([float(all(r.reward <= 0 for r in g)) for g in groups if g]),
        "tool_calls_per_traj": _mean([float(r.trajectory.num_tool_calls) for r in rollouts]),
        "tool_error_ratio": sum(r.trajectory.num_tool_errors for r in rollouts) / calls
        if calls
        else 0.0,
        "turns_per_traj": _mean([float(r.trajectory.num_turns) for r in rollouts]),
        "response_tokens_mean": _mean([float(len(r.response_ids)) for r in rollouts]),
        "response_tokens_max": float(max((len(r.response_ids) for r in rollouts), default=0)),
        "length_finish_ratio": _mean(
            [float(r.trajectory.finish_reason == "length") for r in rollouts]
        ),
        "num_trajectories": float(len(rollouts)),
    }


def _error_ratio(rollouts: Sequence[Rollout]) -> float:
    calls = sum(r.trajectory.num_tool_calls for r in rollouts)
    return sum(r.trajectory.num_tool_errors for r in rollouts) / calls if calls else 0.0


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
