"""HF Qwen2/Qwen3 <-> megatron-core GPTModel weights, as pure functions over tensors.

Guarantees:
- :func:`mcore_shard` gives one (TP rank, PP stage)'s parameters from HF tensors fetched by name,
  reading only that stage's layers, so a large model never has to sit whole on one rank.
- :func:`hf_tensors` turns the TP shards of one megatron parameter back into HF-named full
  tensors; HF -> mcore -> HF is bit-exact (tested), at any TP/PP. Tied embeddings are exported
  once, as ``model.embed_tokens.weight`` (HF and vLLM tie ``lm_head`` to it).

Layouts (megatron-core 0.16, local spec): ``linear_qkv`` is
[(heads + 2 kv_groups) * head_dim, hidden] laid out per KV group as [q of the group; k; v], so a
TP shard is a run of whole groups; ``linear_fc1`` is [gate; up] on every TP shard (a shard is
[gate_r; up_r], not a slice of the full [gate; up]); the vocabulary is padded to
``padded_vocab`` rows and split by rows; ``linear_proj`` and ``linear_fc2`` are split by
columns; norms are replicated. Layer indices are stage-local: global = local + stage offset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

Fetch = Callable[[str], torch.Tensor]


@dataclass(frozen=True, kw_only=True)
class Dims:
    """What the conversion needs to know about the model and its split."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    padded_vocab_size: int
    tied_embeddings: bool
    qkv_bias: bool  # Qwen2 has q/k/v biases; Qwen3 has q/k layernorms instead
    qk_layernorm: bool

    @classmethod
    def from_hf(cls, config: Any, padded_vocab_size: int) -> Dims:
        heads = int(config.num_attention_heads)
        hidden = int(config.hidden_size)
        return cls(
            num_layers=int(config.num_hidden_layers),
            num_heads=heads,
            num_kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(config, "head_dim", None) or hidden // heads),
            hidden_size=hidden,
            vocab_size=int(config.vocab_size),
            padded_vocab_size=padded_vocab_size,
            tied_embeddings=bool(config.tie_word_embeddings),
            qkv_bias=config.model_type == "qwen2",
            qk_layernorm=config.model_type == "qwen3",
        )


@dataclass(frozen=True, kw_only=True)
class Shard:
    """One rank's place: its TP rank of ``tp`` and its PP stage of ``pp``."""

    tp_rank: int = 0
    tp: int = 1
    pp_rank: int = 0
    pp: int = 1

    def layers(self, num_layers: int) -> range:
        per = num_layers // self.pp
        return range(self.pp_rank * per, (self.pp_rank + 1) * per)

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1


# ---- fused layouts ----


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, d: Dims) -> torch.Tensor:
    """HF q/k/v projections (weights or biases) -> megatron's per-group [q; k; v] layout."""
    g, per = d.num_kv_heads, d.num_heads // d.num_kv_heads
    rest = q.shape[1:]
    parts = (
        q.reshape(g, per * d.head_dim, *rest),
        k.reshape(g, d.head_dim, *rest),
        v.reshape(g, d.head_dim, *rest),
    )
    return torch.cat(parts, dim=1).reshape(-1, *rest)


def split_qkv(fused: torch.Tensor, d: Dims) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`fuse_qkv` on the full (TP-gathered) tensor."""
    g, per = d.num_kv_heads, d.num_heads // d.num_kv_heads
    rest = fused.shape[1:]
    grouped = fused.reshape(g, (per + 2) * d.head_dim, *rest)
    q, k, v = torch.split(grouped, [per * d.head_dim, d.head_dim, d.head_dim], dim=1)
    return (
        q.reshape(-1, *rest).contiguous(),
        k.reshape(-1, *rest).contiguous(),
        v.reshape(-1, *rest).contiguous(),
    )


def _pad_vocab(t: torch.Tensor, d: Dims) -> torch.Tensor:
    if t.shape[0] == d.padded_vocab_size:
        return t
    pad = t.new_zeros(d.padded_vocab_size - t.shape[0], *t.shape[1:])
    return torch.cat([t, pad])


# ---- HF -> mcore ----

_NORMS = {
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
    "self_attn.q_norm.weight": "self_attention.q_layernorm.weight",
    "self_attn.k_norm.weight": "self_attention.k_layernorm.weight",
}


def mcore_shard(fetch: Fetch, d: Dims, s: Shard) -> Iterator[tuple[str, torch.Tensor]]:
    """This shard's megatron parameters, named as GPTModel names them on this rank."""
    r, tp = s.tp_rank, s.tp
    if s.first_stage:
        emb = _pad_vocab(fetch("model.embed_tokens.weight"), d)
        yield "embedding.word_embeddings.weight", emb.chunk(tp)[r].clone()
    for local, layer in enumerate(s.layers(d.num_layers)):
        hf, mc = f"model.layers.{layer}.", f"decoder.layers.{local}."
        for hf_name, mc_name in _NORMS.items():
            if "_norm." in hf_name and not d.qk_layernorm:  # Qwen2 has no q/k norms
                continue
            yield mc + mc_name, fetch(hf + hf_name).clone()
        kinds = ["weight", "bias"] if d.qkv_bias else ["weight"]
        for kind in kinds:
            q, k, v = (fetch(f"{hf}self_attn.{p}_proj.{kind}") for p in "qkv")
            qkv = fuse_qkv(q, k, v, d)
            yield f"{mc}self_attention.linear_qkv.{kind}", qkv.chunk(tp)[r].clone()
        proj = fetch(hf + "self_attn.o_proj.weight")
        yield mc + "self_attention.linear_proj.weight", proj.chunk(tp, dim=1)[r].clone()
        gate = fetch(hf + "mlp.gate_proj.weight").chunk(tp)[r]
        up = fetch(hf + "mlp.up_proj.weight").chunk(tp)[r]
        yield mc + "mlp.linear_fc1.weight", torch.cat([gate, up])
        down = fetch(hf + "mlp.down_proj.weight")
        yield mc + "mlp.linear_fc2.weight", down.chunk(tp, dim=1)[r].clone()
    if s.last_stage:
        yield "decoder.final_layernorm.weight", fetch("model.norm.weight").clone()
        if not d.tied_embeddings or not s.first_stage:  # tied over stages: the last holds a copy
            head = "model.embed_tokens.weight" if d.tied_embeddings else "lm_head.weight"
            out = _pad_vocab(fetch(head), d)
            yield "output_layer.weight", out.chunk(tp)[r].clone()


# ---- mcore -> HF ----


def hf_tensors(
    name: str, shards: list[torch.Tensor], d: Dims, layer_offset: int = 0
) -> list[tuple[str, torch.Tensor]]:
    """HF-named full tensors from the TP ``shards`` (in TP-rank order) of the megatron
    parameter ``name`` of a stage whose first layer is ``layer_offset``."""
    if name == "embedding.word_embeddings.weight":
        return [("model.embed_tokens.weight", torch.cat(shards)[: d.vocab_size])]
    if name == "output_layer.weight":  # tied: the embedding's copy on the last stage
        return [] if d.tied_embeddings else [("lm_head.weight", torch.cat(shards)[: d.vocab_size])]
    if name == "decoder.final_layernorm.weight":
        return [("model.norm.weight", shards[0])]
    parts = name.split(".")
    if parts[:2] != ["decoder", "layers"]:
        raise KeyError(f"not a GPTModel parameter this conversion knows: {name}")
    layer, rest = int(parts[2]) + layer_offset, ".".join(parts[3:])
    hf = f"model.layers.{layer}."
    for hf_name, mc_name in _NORMS.items():
        if rest == mc_name:
            return [(hf + hf_name, shards[0])]
    if rest.startswith("self_attention.linear_qkv."):
        kind = rest.rsplit(".", 1)[1]
        q, k, v = split_qkv(torch.cat(shards), d)
        return [
            (f"{hf}self_attn.{p}_proj.{kind}", t) for p, t in zip("qkv", (q, k, v), strict=True)
        ]
    if rest == "self_attention.linear_proj.weight":
        return [(hf + "self_attn.o_proj.weight", torch.cat(shards, dim=1))]
    if rest == "mlp.linear_fc1.weight":
        halves = [shard.chunk(2) for shard in shards]
        gate = torch.cat([h[0] for h in halves])
        up = torch.cat([h[1] for h in halves])
        return [(hf + "mlp.gate_proj.weight", gate), (hf + "mlp.up_proj.weight", up)]
    if rest == "mlp.linear_fc2.weight":
        return [(hf + "mlp.down_proj.weight", torch.cat(shards, dim=1))]
    raise KeyError(f"not a GPTModel parameter this conversion knows: {name}")
