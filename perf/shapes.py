"""Model shapes the benchmarks build and the capacity plan counts (no torch import, and of
rstar2 only the dependency-free :mod:`rstar2.model_shapes`: the lent GPU machine runs the
benchmarks that need only torch and transformers without installing rstar2's dependencies)."""

from __future__ import annotations

# the published configs (a leaf module of rstar2, importable without its dependencies)
from rstar2.model_shapes import QWEN3_1_7B, QWEN3_14B, DecoderShape  # noqa: F401

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


# Qwen2.5-14B's published config: the step-cost benchmark's default engine model
QWEN2_5_14B = DecoderShape(5120, 13824, 48, 40, 8, 128, 152064)
