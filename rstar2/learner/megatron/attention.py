"""Core attention for megatron-core's GPTModel without transformer-engine: exact causal
attention on packed (THD) sequences, plugged in through the layer spec.

megatron-core's only TE-free core attention (``DotProductAttention``) materialises S x S scores
and rejects packed input. This module takes the same constructor and ``forward`` arguments
(the spec's ``core_attention`` slot) and attends within each packed sequence only:
- CPU: one causal ``scaled_dot_product_attention`` per sequence (exact; matches
  ``DotProductAttention`` on unpacked input to float rounding).
- GPU: one flex-attention call over the whole pack with a block-sparse causal-document mask
  (:mod:`rstar2.learner.megatron.flex`).

Shapes (as megatron's attention passes them): THD ``[T, heads, head_dim]`` in, ``[T, heads *
head_dim]`` out; SBHD ``[S, B, heads, head_dim]`` in, ``[S, B, heads * head_dim]`` out. Keys and
values have ``num_query_groups`` heads per rank (grouped-query attention).
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig


class PackedCoreAttention(MegatronModule):
    """Causal self-attention over packed sequences (see the module docstring)."""

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: Any,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: Any = None,
    ) -> None:
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("PackedCoreAttention does not do context parallelism")
        dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        if dropout:
            raise ValueError("PackedCoreAttention has no dropout (attention_dropout must be 0)")
        self.softmax_scale = softmax_scale or config.kv_channels**-0.5

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        if attention_bias is not None:
            raise ValueError("PackedCoreAttention takes no attention bias")
        if packed_seq_params is not None and packed_seq_params.qkv_format == "thd":
            bounds = packed_seq_params.cu_seqlens_q.tolist()
            out = self._packed(query, key, value, bounds)
            return out.reshape(out.shape[0], -1)
        # SBHD: each of the B rows is one sequence
        s, b = query.shape[:2]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [B, H, S, D]
        out = _sdpa(q, k, v, self.softmax_scale)
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)

    def _packed(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bounds: list[int]
    ) -> torch.Tensor:
        if query.is_cuda:
            from rstar2.learner.megatron.flex import packed_flex_attention

            return packed_flex_attention(query, key, value, bounds, self.softmax_scale)
        outs = []
        for start, end in itertools.pairwise(bounds):
            q, k, v = (t[start:end].transpose(0, 1)[None] for t in (query, key, value))
            outs.append(_sdpa(q, k, v, self.softmax_scale)[0].transpose(0, 1))
        return torch.cat(outs)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal SDPA on [B, H, S, D]; keys/values may have fewer (grouped) heads."""
    return F.scaled_dot_product_attention(
        q, k, v, is_causal=True, scale=scale, enable_gqa=k.shape[1] != q.shape[1]
    )
