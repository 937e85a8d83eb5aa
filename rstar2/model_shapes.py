"""Published configs of the models the recipe and the benchmarks use, without weights (a leaf
module: no import beyond the standard library, so benchmarks on a bare GPU host can use it).

:data:`KNOWN_SHAPES` maps a hub id to its ``config.json`` fields that memory and cost plans
read; it is what ``rstar2 layout`` falls back on when ``model.path`` is a hub id not downloaded
here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
    def layer_params(self) -> int:
        """One decoder layer's matmul parameters (q, k, v, o and the gated MLP)."""
        qkv = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
        out = self.heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return qkv + out + mlp

    @property
    def matmul_params(self) -> int:
        """The parameters of every matmul, lm_head included (embeddings are lookups)."""
        return self.layers * self.layer_params + self.vocab * self.hidden

    @property
    def weight_params(self) -> int:
        """Every weight, the input embedding included unless tied to the LM head (norms and
        biases left out: a rounding error)."""
        return self.matmul_params + (0 if self.tied else self.vocab * self.hidden)

    def train_flops_per_token(self, context: float) -> float:
        """6 x matmul parameters + causal attention at mean ``context`` (as perf/learner.py)."""
        attention = 2 * self.layers * self.heads * self.head_dim * context / 2
        return 6 * self.matmul_params + 6 * attention


QWEN3_1_7B = {
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
}

# Qwen3-14B's published config (what configs/rstar2_14b_mi300x.yaml trains), without weights
QWEN3_14B = {
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "num_hidden_layers": 40,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "tie_word_embeddings": False,
}

QWEN3_0_6B = {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}

QWEN2_5_1_5B = {
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "model_type": "qwen2",
}

KNOWN_SHAPES: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-14B": QWEN3_14B,
    "Qwen/Qwen3-1.7B": QWEN3_1_7B,
    "Qwen/Qwen3-0.6B": QWEN3_0_6B,
    "Qwen/Qwen2.5-1.5B": QWEN2_5_1_5B,
}
