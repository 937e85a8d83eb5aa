"""Model shapes the GPU benchmarks build (no rstar2 import: the lent GPU machine runs the
benchmarks that need only torch and transformers without installing rstar2's dependencies)."""

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
