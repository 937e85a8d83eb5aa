"""Published configs of the models the recipe and the benchmarks use, without weights (a leaf
module: no import beyond the standard library, so benchmarks on a bare GPU host can use it).

:data:`KNOWN_SHAPES` maps a hub id to its ``config.json`` fields that memory and cost plans
read; it is what ``rstar2 layout`` falls back on when ``model.path`` is a hub id not downloaded
here.
"""

from __future__ import annotations

from typing import Any

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
