"""Core attention for megatron-core's GPTModel without transformer-engine: RoPE and exact causal
attention on packed (THD) sequences, plugged in through the layer spec.

megatron-core's only TE-free core attention (``DotProductAttention``) materialises S x S scores
and rejects packed input; and its TE-free RoPE for packed input reads the sequence lengths back
from the device in every layer (a host sync each time, measured as GPU idle on the H200). This
module takes the core attention's constructor and ``forward`` arguments (the spec's
``core_attention`` slot) and, from the learner's :class:`PackedRows` (host-side bounds and one
RoPE table per pack, built once per micro-batch; megatron's own RoPE is off):
- rotates queries and keys by each token's position in its own sequence (as transformers does);
- attends within each packed sequence only: on CPU one causal ``scaled_dot_product_attention``
  per sequence (exact); on GPU one flash-attention call over the pack by its cu_seqlens
  (:mod:`rstar2.learner.megatron.varlen`, measured fastest on the H200), or, where this torch
  build lacks it, one flex-attention call with a block-sparse causal-document mask
  (:mod:`rstar2.learner.megatron.flex`).

Shapes (as megatron's attention passes them): ``[T, heads, head_dim]`` in, ``[T, heads *
head_dim]`` out; keys and values have ``num_query_groups`` heads per rank (grouped-query
attention).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig

from rstar2.learner.megatron.rope import rotate


@dataclass
class PackedRows(PackedSeqParams):
    """megatron's packed-sequence parameters (THD) plus what :class:`PackedCoreAttention`
    needs without a device sync: the sequence bounds on the host, and every token's RoPE
    ``cos`` / ``sin`` (``[T, 1, head_dim]``, from :func:`.rope.rope_tables`)."""

    bounds: tuple[int, ...] = ()
    rope_cos: torch.Tensor | None = None
    rope_sin: torch.Tensor | None = None


@cache
def _fused_rotate() -> Any:
    return torch.compile(rotate, dynamic=True)  # one kernel per tensor on GPU


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
        rows = packed_seq_params
        if not isinstance(rows, PackedRows) or rows.rope_cos is None or rows.rope_sin is None:
            raise ValueError("PackedCoreAttention takes the learner's PackedRows (packed input)")
        turn = _fused_rotate() if query.is_cuda else rotate
        query = turn(query, rows.rope_cos, rows.rope_sin)
        key = turn(key, rows.rope_cos, rows.rope_sin)
        out = self._packed(query, key, value, rows)
        return out.reshape(out.shape[0], -1)

    def _packed(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, rows: PackedRows
    ) -> torch.Tensor:
        if query.is_cuda:
            from rstar2.learner.megatron import varlen

            if varlen.available(query.device):
                cu = rows.cu_seqlens_q
                assert cu is not None and rows.max_seqlen_q is not None
                return varlen.packed_varlen_attention(
                    query, key, value, cu, int(rows.max_seqlen_q), self.softmax_scale
                )
            from rstar2.learner.megatron.flex import packed_flex_attention

            return packed_flex_attention(query, key, value, list(rows.bounds), self.softmax_scale)
        outs = []
        for start, end in itertools.pairwise(rows.bounds):
            q, k, v = (t[start:end].transpose(0, 1)[None] for t in (query, key, value))
            outs.append(_sdpa(q, k, v, self.softmax_scale)[0].transpose(0, 1))
        return torch.cat(outs)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal SDPA on [B, H, S, D]; keys/values may have fewer (grouped) heads."""
    return F.scaled_dot_product_attention(
        q, k, v, is_causal=True, scale=scale, enable_gqa=k.shape[1] != q.shape[1]
    )
