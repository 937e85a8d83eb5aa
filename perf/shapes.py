"""Model shapes the benchmarks build and the capacity plan counts (no torch import, and of
rstar2 only the dependency-free :mod:`rstar2.model_shapes`: the lent GPU machine runs the
benchmarks that need only torch and transformers without installing rstar2's dependencies)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# the published configs (a leaf module of rstar2, importable without its dependencies)
from rstar2.model_shapes import QWEN3_1_7B, QWEN3_14B  # noqa: F401

# bytes per element of a model dtype (config spellings and their short names)
DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "float8": 1,
    "fp8": 1,
}


@dataclass(frozen=True)
class DecoderShape:
    """A dense decoder's dimensions: what FLOPs, KV bytes and weight bytes need."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = False  # the LM head is the input embedding (one matrix in memory and on the wire)
    family: str = "qwen3"  # the transformers architecture benchmarks build (qwen3, qwen2)

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> DecoderShape:
        """A transformers ``config.json`` of a dense decoder (Qwen2/Qwen3, Llama): KeyError
        names a missing dimension."""
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        head_dim = config.get("head_dim") or hidden // heads
        return cls(
            hidden,
            int(config["intermediate_size"]),
            int(config["num_hidden_layers"]),
            heads,
            int(config.get("num_key_value_heads") or heads),
            int(head_dim),
            int(config["vocab_size"]),
            bool(config.get("tie_word_embeddings", False)),
            str(config.get("model_type") or "qwen3"),
        )

    @property
    def kv_bytes_per_token(self) -> int:
        """bf16 K and V of every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2

    def weight_bytes(self, dtype_bytes: int = 2) -> int:
        """Every weight (:attr:`weight_params`) at ``dtype_bytes`` each (bf16: 2)."""
        return self.weight_params * dtype_bytes

    @property
    def matmul_params(self) -> int:
        """The parameters of every matmul, lm_head included (embeddings are lookups)."""
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        out = self.heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (qkv + out + mlp) + self.vocab * self.hidden

    @property
    def weight_params(self) -> int:
        """Every weight, the input embedding included unless tied to the LM head (norms and
        biases left out: a rounding error)."""
        return self.matmul_params + (0 if self.tied else self.vocab * self.hidden)

    def train_flops_per_token(self, context: float) -> float:
        """6 x matmul parameters + causal attention at mean ``context`` (as perf/learner.py)."""
        attention = 2 * self.layers * self.heads * self.head_dim * context / 2
        return 6 * self.matmul_params + 6 * attention


# Qwen2.5-14B's published config: the step-cost benchmark's default engine model
QWEN2_5_14B = DecoderShape(5120, 13824, 48, 40, 8, 128, 152064)
