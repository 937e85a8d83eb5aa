"""Learner throughput: packed training steps of the torch learner, tokens/s and MFU.

    python -m perf.learner                       # the tiny CPU model
    python -m perf.learner --device cuda         # a Qwen3-1.7B-shaped random-init model, 8K
                                                 # packed tokens per step, bf16 autocast

MFU counts 6 x (matmul parameters, lm_head included) FLOPs per token plus causal attention
(6 x layers x 2 x heads x head_dim x mean context), against the bf16 matmul peak measured in
the same run (an 8192^3 product). Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from typing import Any

import torch

from perf.shapes import QWEN3_1_7B
from rstar2.config import OptimConfig, TorchLearnerConfig
from rstar2.learner.protocol import TrainSequence
from rstar2.learner.torch_backend import TorchLearner, TorchLearnerSettings

TINY = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 4096,
    "tie_word_embeddings": False,
    "max_position_embeddings": 4096,
}


def build_model(shape: dict[str, Any], attn: str) -> Any:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**shape)
    config._attn_implementation = attn
    torch.manual_seed(0)
    return Qwen3ForCausalLM(config).float()


def batch(tokens: int, seq_len: int, vocab: int, seed: int) -> list[TrainSequence]:
    rng = random.Random(seed)
    out = []
    for _ in range(max(1, tokens // seq_len)):
        ids = [rng.randrange(vocab) for _ in range(seq_len)]
        prompt = seq_len // 4
        mask = [0] * prompt + [1] * (seq_len - prompt)
        old = [0.0] + [-rng.uniform(8.0, 12.0) if m else 0.0 for m in mask[1:]]
        out.append(TrainSequence(ids, mask, old, advantage=rng.choice([-1.0, 1.0])))
    return out


def matmul_peak_tflops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 2 * 8192**3 * 10 / (time.perf_counter() - t0) / 1e12


def flops_per_token(model: Any, seq_len: int) -> float:
    cfg = model.config
    matmul_params = sum(
        p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n
    )
    if cfg.tie_word_embeddings:
        matmul_params += model.get_input_embeddings().weight.numel()
    attn = 2 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * (seq_len / 2)
    return 6 * matmul_params + 6 * attn


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    shape = QWEN3_1_7B if device.type == "cuda" else TINY
    model = build_model(shape, args.attn)
    settings = TorchLearnerSettings(
        model_path="(in memory)",
        optim=OptimConfig(lr=1e-6, warmup_steps=0),
        learner=TorchLearnerConfig(
            micro_batch_tokens_per_gpu=args.tokens,
            activation_checkpointing=args.activation_checkpointing,
        ),
        device=args.device,
    )
    learner = TorchLearner(settings, model=model)
    vocab = int(shape["vocab_size"])
    data = [batch(args.tokens, args.seq_len, vocab, s) for s in range(args.steps)]
    times: list[float] = []
    for i, b in enumerate(data):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        learner.train_step(b)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    step_s = sorted(times)[len(times) // 2]
    tokens = sum(len(s.token_ids) for s in data[0])
    tps = tokens / step_s
    peak = matmul_peak_tflops(device)
    fpt = flops_per_token(learner.model, args.seq_len)
    achieved = fpt * tps / 1e12
    result = {
        "benchmark": "learner",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "model": "qwen3-1.7b-shape" if device.type == "cuda" else "tiny-qwen3",
        "params": sum(p.numel() for p in learner.model.parameters()),
        "tokens_per_step": tokens,
        "seq_len": args.seq_len,
        "step_s": round(step_s, 4),
        "tokens_per_s": round(tps, 1),
        "model_tflops_per_s": round(achieved, 2),
        "matmul_peak_tflops": None if peak is None else round(peak, 1),
        "mfu": None if peak is None else round(achieved / peak, 4),
        "max_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if device.type == "cuda"
        else None,
        "activation_checkpointing": args.activation_checkpointing,
        "attn_implementation": args.attn,
        "commit": os.environ.get("RSTAR2_COMMIT", ""),
    }
    if args.parity:
        result |= parity(learner, data[0], data[1])
    for key in ("model", "params", "tokens_per_step", "step_s", "tokens_per_s", "mfu"):
        print(f"{key:<20}{result[key]!s:>24}")
    print(json.dumps(result))
    return result


def parity(learner: TorchLearner, train: list[TrainSequence], held: list[TrainSequence]) -> dict:
    """bf16-autocast vs fp32 log-probs of the same weights, after sharpening the random model
    with a few steps that raise the likelihood of ``train`` (a uniform model hides the gap)."""
    for group in learner.optimizer.param_groups:
        group["lr"] = 1e-4
    positive = [TrainSequence(s.token_ids, s.loss_mask, s.old_logprobs, 1.0) for s in train]
    for _ in range(10):
        learner.train_step(positive)
    gaps: dict[str, Any] = {}
    for name, seqs in (("trained", train), ("held_out", held)):
        learner.bf16_autocast = True
        low = learner.compute_logprobs(seqs)
        learner.bf16_autocast = False
        ref = learner.compute_logprobs(seqs)
        diffs = [
            abs(a - b)
            for s, x, y in zip(seqs, low, ref, strict=True)
            for a, b, m in zip(x, y, s.loss_mask, strict=True)
            if m
        ]
        lp = [
            b
            for s, y in zip(seqs, ref, strict=True)
            for b, m in zip(y, s.loss_mask, strict=True)
            if m
        ]
        gaps[f"bf16_vs_fp32_{name}_max_abs"] = round(max(diffs), 5)
        gaps[f"bf16_vs_fp32_{name}_mean_abs"] = round(sum(diffs) / len(diffs), 6)
        gaps[f"fp32_{name}_mean_logprob"] = round(sum(lp) / len(lp), 4)
    learner.bf16_autocast = True
    return gaps


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--tokens", type=int, default=None, help="packed tokens per step")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sequence")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--parity", action="store_true", help="also bf16 vs fp32 log-probs")
    parser.add_argument("--attn", default=None, choices=["sdpa", "flex_attention", "eager"])
    args = parser.parse_args(argv)
    cuda = args.device == "cuda"
    args.tokens = args.tokens or (8192 if cuda else 2048)
    args.seq_len = args.seq_len or (1024 if cuda else 256)
    args.attn = args.attn or ("flex_attention" if cuda else "sdpa")  # the learner's "auto"
    return run(args)


if __name__ == "__main__":
    main()
