"""GRPO advantages over the kept rollouts of each prompt group (pure, vectorised).

``A_i = (r_i - mean(group)) / (std(group) + eps)`` with the unbiased standard deviation (a
group of one has std 0); with ``norm_by_std=False`` only the mean is removed (Dr. GRPO).
"""

from __future__ import annotations

import torch


def grpo_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Per-rollout advantages; ``group_ids[i]`` (0..num_groups-1) names rollout i's prompt."""
    if rewards.shape != group_ids.shape or rewards.dim() != 1:
        raise ValueError("rewards and group_ids must be 1-D and of the same length")
    rewards = rewards.to(torch.float64)
    num_groups = int(group_ids.max().item()) + 1 if group_ids.numel() else 0
    counts = torch.zeros(num_groups, dtype=torch.float64).index_add_(
        0, group_ids, torch.ones_like(rewards)
    )
    sums = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group_ids, rewards)
    mean = sums / counts.clamp(min=1)
    centred = rewards - mean[group_ids]
    if not norm_by_std:
        return centred.to(torch.float32)
    sq = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group_ids, centred**2)
    std = torch.sqrt(sq / (counts - 1).clamp(min=1))
    std = torch.where(counts > 1, std, torch.zeros_like(std))
    return (centred / (std[group_ids] + eps)).to(torch.float32)
