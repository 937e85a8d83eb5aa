"""A megatron-core GPTModel for an HF Qwen2/Qwen3 config, on the local (TE-free) spec with
:class:`~rstar2.learner.megatron.attention.PackedCoreAttention`, or TE's spec where
transformer-engine is installed.

Guarantees: the model computes what ``transformers`` computes for the same config and weights
(RMSNorm, SwiGLU, RoPE, grouped-query attention, Qwen3's q/k norms, Qwen2's q/k/v biases, tied or
untied embeddings), with dropout off; what it cannot express is refused here with the reason
(RoPE scaling, sliding windows, biases it does not have).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from rstar2.learner.megatron.convert import Dims
from rstar2.learner.megatron.layout import Layout

SUPPORTED = ("qwen2", "qwen3")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """What :func:`build_model` builds: the HF config's dimensions, the layout and dtypes."""

    hf_config: Any
    layout: Layout
    params_dtype: torch.dtype = torch.float32
    activation_checkpointing: bool = False

    @property
    def dims(self) -> Dims:
        return Dims.from_hf(self.hf_config, self.layout.padded_vocab_size)


def rope_theta(hf_config: Any) -> float:
    params = getattr(hf_config, "rope_parameters", None) or {}
    theta = params.get("rope_theta") or getattr(hf_config, "rope_theta", None)
    kind = params.get("rope_type", "default")
    if kind != "default":
        raise ValueError(f"RoPE type {kind!r} (rope scaling) is not supported by this backend")
    return float(theta or 10000.0)


def check_model(hf_config: Any) -> None:
    """ValueError naming what this backend cannot build from ``hf_config``."""
    if hf_config.model_type not in SUPPORTED:
        raise ValueError(f"model_type {hf_config.model_type!r}: the backend builds {SUPPORTED}")
    rope_theta(hf_config)
    if getattr(hf_config, "use_sliding_window", False):
        raise ValueError("sliding-window attention is not supported by this backend")
    if hf_config.model_type == "qwen3" and getattr(hf_config, "attention_bias", False):
        raise ValueError("Qwen3 with attention biases is not supported by this backend")
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise ValueError(f"activation {hf_config.hidden_act!r}: the backend builds SwiGLU (silu)")


def transformer_config(spec: ModelSpec) -> Any:
    """megatron-core's TransformerConfig for ``spec`` (fusions off: they need TE or CUDA)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    hf, d, lay = spec.hf_config, spec.dims, spec.layout
    recompute = {"recompute_granularity": "full", "recompute_method": "uniform",
                 "recompute_num_layers": 1} if spec.activation_checkpointing else {}  # fmt: skip
    return TransformerConfig(
        num_layers=d.num_layers,
        hidden_size=d.hidden_size,
        num_attention_heads=d.num_heads,
        num_query_groups=d.num_kv_heads,
        kv_channels=d.head_dim,
        ffn_hidden_size=int(hf.intermediate_size),
        normalization="RMSNorm",
        layernorm_epsilon=float(hf.rms_norm_eps),
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=d.qkv_bias,
        qk_layernorm=d.qk_layernorm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        tensor_model_parallel_size=lay.tensor_parallel,
        pipeline_model_parallel_size=lay.pipeline_parallel,
        sequence_parallel=lay.sequence_parallel,
        params_dtype=spec.params_dtype,
        pipeline_dtype=spec.params_dtype,
        bf16=spec.params_dtype == torch.bfloat16,
        variable_seq_lengths=True,
        moe_token_dispatcher_type="alltoall",
        use_cpu_initialization=True,
        perform_initialization=False,  # every parameter is loaded from the HF weights
        **recompute,
    )


class RMSNorm(torch.nn.RMSNorm):
    """torch's RMSNorm as a megatron norm module: in ``params_dtype``, and with its weight
    marked ``sequence_parallel`` under sequence parallelism, so finalize_model_grads sums its
    gradient over the TP ranks that each saw part of the sequence (megatron's local spec has
    no such norm: its torch norm refuses sequence parallelism)."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
        super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)
        self.weight.sequence_parallel = config.sequence_parallel  # type: ignore[attr-defined]


def layer_spec(spec: ModelSpec) -> Any:
    """The local spec with our packed core attention and norms (TE's spec needs TE)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from rstar2.learner.megatron.attention import PackedCoreAttention

    local = get_gpt_layer_local_spec(qk_layernorm=spec.dims.qk_layernorm, normalization="RMSNorm")
    layer = local.submodules
    layer.self_attention.submodules.core_attention = PackedCoreAttention
    layer.input_layernorm = layer.pre_mlp_layernorm = RMSNorm
    if spec.dims.qk_layernorm:
        layer.self_attention.submodules.q_layernorm = RMSNorm
        layer.self_attention.submodules.k_layernorm = RMSNorm
    return local


def block_spec(spec: ModelSpec, config: Any) -> Any:
    """This stage's decoder layers and its final norm (ours, like the layers' norms)."""
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )

    layers = [layer_spec(spec)] * get_num_layers_to_build(config)
    return TransformerBlockSubmodules(layer_specs=layers, layer_norm=RMSNorm)


def build_model(spec: ModelSpec, *, pre_process: bool, post_process: bool) -> Any:
    """This rank's GPTModel (its pipeline stage, its TP shard), parameters uninitialised until
    loaded (:func:`~rstar2.learner.megatron.convert.mcore_shard`)."""
    from megatron.core.models.gpt import GPTModel

    check_model(spec.hf_config)
    hf = spec.hf_config
    config = transformer_config(spec)
    model = GPTModel(
        config=config,
        transformer_layer_spec=block_spec(spec, config),
        vocab_size=spec.layout.padded_vocab_size,
        max_sequence_length=int(getattr(hf, "max_position_embeddings", 32768)),
        pre_process=pre_process,
        post_process=post_process,
        share_embeddings_and_output_weights=bool(hf.tie_word_embeddings),
        position_embedding_type="none",  # RoPE is applied by PackedCoreAttention
        parallel_output=True,
    )
    _mark_tensor_parallel(model)
    return model


def _mark_tensor_parallel(model: torch.nn.Module) -> None:
    """Tag every TP-sharded weight as megatron's own initialisers would have.

    megatron-core 0.16's parallel layers set ``tensor_model_parallel`` / ``partition_dim`` on
    their weights only inside the initialisers, which ``perform_initialization=False`` skips (we
    load every weight instead). Untagged, each TP rank's shard counts as a replica: the grad
    norm drops all but TP rank 0's shards (measured: 0.84 instead of 1.05 at TP=2), and the
    distributed optimizer and checkpointing would treat shards as copies."""
    from megatron.core import tensor_parallel as tpl

    for module in model.modules():
        if isinstance(module, tpl.ColumnParallelLinear | tpl.VocabParallelEmbedding):
            dim = 0
        elif isinstance(module, tpl.RowParallelLinear):
            dim = 1
        else:
            continue
        weight = getattr(module, "weight", None)
        if weight is not None and not getattr(weight, "tensor_model_parallel", False):
            tpl.set_tensor_model_parallel_attributes(weight, True, dim, 1)
