"""The learner backends on one GPU, in one process, on the same model shape and token count:
a plain transformers training step (the reference a user would write), the torch learner and
the megatron learner. tokens/s, MFU and peak memory of each; then one JSON line.

    python -m perf.learner_backends            # Qwen3-1.7B shape, 8 x 1,024 tokens per step

- ``hf_bf16``: bf16 parameters, SDPA with ``is_causal``, 8 unpacked rows of 1,024, torch AdamW.
- ``hf_fp32_master``: fp32 parameters under bf16 autocast (what "fp32 master weights" costs).
- ``torch``: our torch learner (fp32 parameters, bf16 autocast, packed rows, flex attention).
- ``megatron``: our megatron learner (bf16 parameters, fp32 master weights and gradients in
  megatron's optimizer with fused AdamW, packed THD with our RoPE and flex attention), TP=PP=1.
- ``megatron_16k``: the megatron learner on one 16,384-token sequence (does it fit, how fast).
MFU: 6 x matmul parameters (lm_head included) + causal attention FLOPs per token (as
perf/learner.py counts them), against the bf16 matmul peak measured in this run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from perf.learner import batch, flops_per_token, matmul_peak_tflops
from perf.shapes import QWEN3_1_7B


def _timed(step: Callable[[], Any], steps: int, warmup: int) -> float:
    times = []
    for i in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _profile(step: Callable[[], Any]) -> None:
    """The 20 operations that take the most GPU time in one step (PROFILE=<case>)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    print(
        prof.key_averages().table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=60)
    )


def _fresh() -> None:
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def hf_step(config: Any, rows: int, seq_len: int, *, master_fp32: bool) -> Callable[[], Any]:
    from transformers import Qwen3ForCausalLM

    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    dtype = torch.float32 if master_fp32 else torch.bfloat16
    model: Any = Qwen3ForCausalLM(config)
    model = model.to("cuda", dtype)
    model.config.use_cache = False
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ids = torch.randint(0, config.vocab_size, (rows, seq_len), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=master_fp32):
            logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten()
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def torch_learner_step(config: Any, tokens: int, seq_len: int) -> Callable[[], Any]:
    from transformers import Qwen3ForCausalLM

    from rstar2.config import OptimConfig, TorchLearnerConfig
    from rstar2.learner.torch_backend import TorchLearner, TorchLearnerSettings

    config._attn_implementation = "flex_attention"
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).float()
    settings = TorchLearnerSettings(
        model_path="(in memory)",
        optim=OptimConfig(lr=1e-6, warmup_steps=0),
        learner=TorchLearnerConfig(
            micro_batch_tokens_per_gpu=tokens, activation_checkpointing=False
        ),
        device="cuda",
    )
    learner = TorchLearner(settings, model=model)
    data = batch(tokens, seq_len, config.vocab_size, 0)
    return lambda: learner.train_step(data)


def megatron_step(
    config: Any, tokens: int, seq_len: int, *, checkpointing: bool = False
) -> tuple[Callable[[], Any], Any]:
    from transformers import Qwen3ForCausalLM

    from rstar2.config import MegatronLearnerConfig, OptimConfig
    from rstar2.learner.megatron.learner import MegatronLearner, MegatronLearnerSettings

    torch.manual_seed(0)
    state = Qwen3ForCausalLM(config).state_dict()  # random init on the CPU, fp32
    folder = tempfile.mkdtemp()
    config.save_pretrained(folder)
    settings = MegatronLearnerSettings(
        model_path=folder,
        optim=OptimConfig(lr=1e-6, warmup_steps=0),
        learner=MegatronLearnerConfig(
            backend="megatron", micro_batch_tokens_per_gpu=max(tokens, seq_len),
            activation_checkpointing=checkpointing,
        ),
        device="cuda",
    )  # fmt: skip
    learner = MegatronLearner(settings, weights=state.__getitem__)
    del state
    data = batch(tokens, seq_len, config.vocab_size, 0)
    return (lambda: learner.train_step(data)), learner


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args(argv)
    tokens = args.rows * args.seq_len
    config = Qwen3Config(**dict[str, Any](QWEN3_1_7B))
    with torch.device("meta"):
        fpt = flops_per_token(Qwen3ForCausalLM(config), args.seq_len)
        fpt_16k = flops_per_token(Qwen3ForCausalLM(config), 16384)
    peak = matmul_peak_tflops(torch.device("cuda")) or float("nan")
    rows, seq = args.rows, args.seq_len
    cases: dict[str, Callable[[], tuple[Callable[[], Any], int, float]]] = {
        "hf_bf16": lambda: (hf_step(config, rows, seq, master_fp32=False), tokens, fpt),
        "hf_fp32_master": lambda: (hf_step(config, rows, seq, master_fp32=True), tokens, fpt),
        "torch": lambda: (torch_learner_step(config, tokens, seq), tokens, fpt),
        "megatron": lambda: (megatron_step(config, tokens, seq)[0], tokens, fpt),
        "megatron_16k": lambda: (megatron_step(config, 16384, 16384)[0], 16384, fpt_16k),
    }
    results: dict[str, Any] = {}
    for name, make in cases.items():
        if args.only and name not in args.only:
            continue
        _fresh()
        try:
            step, n_tokens, flops = make()
            step_s = _timed(step, args.steps, args.warmup)
        except torch.OutOfMemoryError as exc:
            # what it needed: the peak reached before the allocation that failed, and that one
            results[name] = {
                "error": f"OOM: {exc}"[:200],
                "peak_gib_before_oom": round(torch.cuda.max_memory_allocated() / 2**30, 2),
                "device_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 2),
            }
            print(f"{name:<16}{results[name]}", flush=True)
            continue
        if os.environ.get("PROFILE") == name:
            _profile(step)
        tps = n_tokens / step_s
        results[name] = {
            "tokens_per_step": n_tokens,
            "step_s": round(step_s, 4),
            "tokens_per_s": round(tps, 1),
            "mfu": round(flops * tps / 1e12 / peak, 4),
            "max_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        }
        print(f"{name:<16}{results[name]}", flush=True)
        del step
    out = {
        "benchmark": "learner_backends",
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "model": "qwen3-1.7b-shape",
        "matmul_peak_tflops": round(peak, 1),
        "flops_per_token": fpt,
        "commit": os.environ.get("RSTAR2_COMMIT", ""),
        "results": results,
    }
    for a, b in (("megatron", "hf_bf16"), ("megatron", "hf_fp32_master"), ("megatron", "torch")):
        if "tokens_per_s" in results.get(a, {}) and "tokens_per_s" in results.get(b, {}):
            out[f"{a}_over_{b}"] = round(results[a]["tokens_per_s"] / results[b]["tokens_per_s"], 3)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
