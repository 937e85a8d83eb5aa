"""Packed causal attention on GPU through flex attention: one kernel over the whole pack with
a block-sparse mask (same sequence, key not after query), so no S x S score matrix exists and
blocks that cross sequences are skipped. Compiled once per process (shapes are dynamic)."""

from __future__ import annotations

import itertools
from functools import cache, lru_cache
from typing import Any

import torch


@cache
def _kernel() -> Any:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=True)


@lru_cache(maxsize=8)
def _block_mask(bounds: tuple[int, ...], device: str) -> Any:
    """The pack's causal-document mask, built once per pack (every layer reuses it)."""
    from torch.nn.attention.flex_attention import create_block_mask

    total = bounds[-1]
    lengths = torch.tensor([b - a for a, b in itertools.pairwise(bounds)])
    doc = torch.repeat_interleave(torch.arange(len(lengths)), lengths).to(device)

    def causal_document(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    return create_block_mask(causal_document, 1, None, total, total, device=device)


def packed_flex_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    bounds: list[int],
    scale: float,
) -> torch.Tensor:
    """[T, H, D] query, [T, H_kv, D] key/value, sequence ``bounds`` (cu_seqlens) -> [T, H, D]."""
    mask = _block_mask(tuple(bounds), str(query.device))
    q, k, v = (t.transpose(0, 1)[None] for t in (query, key, value))  # [1, H, T, D]
    out = _kernel()(q, k, v, block_mask=mask, scale=scale, enable_gqa=k.shape[1] != q.shape[1])
    return out[0].transpose(0, 1)
