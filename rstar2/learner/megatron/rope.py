"""Rotary position embedding for packed rows, by each token's position in its own sequence
(pure torch): the same angles and rotation as transformers' and megatron's default RoPE."""

from __future__ import annotations

import torch


def rope_inverse_frequencies(theta: float, head_dim: int, device: torch.device) -> torch.Tensor:
    """The default RoPE frequencies (transformers' and megatron's formula), fp32."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim
    return 1.0 / (theta**exponents)


def rope_tables(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` of every token's rotation (``[T, 1, head_dim]`` in ``dtype``), from
    its position in its own sequence (``positions``: ``[T]``); angles in fp32."""
    angles = positions.float()[:, None] * inv_freq[None]
    angles = torch.cat((angles, angles), dim=-1)[:, None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``t`` (``[T, heads, head_dim]``) rotated by the tables (the rotate-half convention)."""
    first, second = torch.chunk(t, 2, dim=-1)
    return t * cos + torch.cat((-second, first), dim=-1) * sin
