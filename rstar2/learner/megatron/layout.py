"""A tensor/pipeline-parallel layout checked against a model's shape and the world size.

Pure: no torch.distributed, no megatron import. :func:`check_layout` either returns the
:class:`Layout` every rank will build, or raises :class:`~rstar2.config.ConfigError` naming the
key to change, so a layout that cannot work is reported before a cluster is booked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rstar2.config import ConfigError, MegatronLearnerConfig


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The dimensions of a decoder-only model that a TP/PP layout must divide."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    hidden_size: int
    ffn_hidden_size: int
    vocab_size: int

    @classmethod
    def from_hf(cls, config: Any) -> ModelShape:
        """From a transformers Qwen2/Qwen3 config (or anything with its attribute names)."""
        heads = int(config.num_attention_heads)
        return cls(
            num_layers=int(config.num_hidden_layers),
            num_heads=heads,
            num_kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            hidden_size=int(config.hidden_size),
            ffn_hidden_size=int(config.intermediate_size),
            vocab_size=int(config.vocab_size),
        )


@dataclass(frozen=True, kw_only=True)
class Layout:
    """How ``world_size`` ranks split the model: TP x PP x DP, layers per pipeline stage."""

    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int
    layers_per_stage: int
    padded_vocab_size: int  # the vocabulary padded so every TP rank holds an equal slice
    sequence_parallel: bool = False

    @property
    def world_size(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel * self.data_parallel


def check_layout(
    section: MegatronLearnerConfig, shape: ModelShape, world_size: int, *, vocab_multiple: int = 128
) -> Layout:
    """The layout ``section`` asks for on ``world_size`` ranks, or a ConfigError naming the key.

    The vocabulary is padded to a multiple of ``vocab_multiple`` x TP (megatron's
    ``make_vocab_size_divisible_by``); padded rows are never sampled targets."""
    tp, pp = section.tensor_parallel_size, section.pipeline_parallel_size
    tp_key, pp_key = "learner.tensor_parallel_size", "learner.pipeline_parallel_size"
    for what, count in (
        ("attention heads", shape.num_heads),
        ("key/value heads", shape.num_kv_heads),
        ("MLP width (intermediate_size)", shape.ffn_hidden_size),
    ):
        if count % tp:
            raise ConfigError(tp_key, f"the model's {count} {what} do not divide by TP={tp}")
    if shape.num_layers % pp:
        raise ConfigError(pp_key, f"the model's {shape.num_layers} layers do not divide by PP={pp}")
    if section.sequence_parallel and tp == 1:
        raise ConfigError(
            "learner.sequence_parallel", "splits the sequence over TP ranks: needs TP > 1"
        )
    if world_size % (tp * pp):
        raise ConfigError(
            tp_key,
            f"{world_size} learner ranks are not a multiple of TP x PP = {tp} x {pp} = {tp * pp}",
        )
    step = vocab_multiple * tp
    return Layout(
        tensor_parallel=tp,
        pipeline_parallel=pp,
        data_parallel=world_size // (tp * pp),
        layers_per_stage=shape.num_layers // pp,
        padded_vocab_size=-(-shape.vocab_size // step) * step,
        sequence_parallel=section.sequence_parallel,
    )
