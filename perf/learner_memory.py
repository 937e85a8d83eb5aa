"""The megatron learner's peak GPU memory against the memory plan's prediction
(:mod:`rstar2.memory_plan`, which is not fitted to any measurement): Qwen3-1.7B's shape, random
weights, TP = PP = DP = 1, bf16, one micro-batch of each token count, two train steps (the
second runs with the optimizer state resident), ``torch.cuda.max_memory_allocated``.

    python -m perf.learner_memory --tokens 8192 16384 [--no-checkpointing] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import torch

from perf.learner_backends import _fresh, megatron_step
from perf.shapes import QWEN3_1_7B


def measure(tokens: int, checkpointing: bool) -> dict[str, Any]:
    """One token count: the plan's learner peak, then the measured one (None on OOM)."""
    from transformers import Qwen3Config

    from rstar2.config_io import load_config
    from rstar2.memory_plan import GIB, plan_memory
    from rstar2.model_shapes import DecoderShape

    device_gib = torch.cuda.get_device_properties(0).total_memory / GIB
    cfg = load_config(
        None,
        [
            "learner.backend=megatron",
            f"learner.micro_batch_tokens_per_gpu={tokens}",
            f"learner.activation_checkpointing={str(checkpointing).lower()}",
            f"cluster.gpu_memory_gib={device_gib:.2f}",
        ],
    )
    predicted = plan_memory(cfg, DecoderShape.from_hf_config(dict(QWEN3_1_7B))).learner.peak / GIB
    _fresh()
    measured: float | None
    try:
        step, learner = megatron_step(
            Qwen3Config(**dict[str, Any](QWEN3_1_7B)), tokens, 1024, checkpointing=checkpointing
        )
        step()
        step()
        torch.cuda.synchronize()
        measured = torch.cuda.max_memory_allocated() / GIB
        learner.close()
        del step, learner
    except torch.OutOfMemoryError:
        measured = None
    out = {
        "tokens": tokens,
        "activation_checkpointing": checkpointing,
        "predicted_gib": round(predicted, 2),
        "measured_gib": None if measured is None else round(measured, 2),
        "error": None if measured is None else round(predicted / measured - 1, 4),
    }
    print(json.dumps(out), flush=True)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--no-checkpointing", action="store_true")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    results = [measure(t, not args.no_checkpointing) for t in args.tokens]
    report = {
        "benchmark": "learner_memory",
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "model": "qwen3-1.7b-shape",
        "commit": os.environ.get("RSTAR2_COMMIT", ""),
        "results": results,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
