"""Packed causal attention kernels on one GPU: what the megatron backend's core attention can
use without transformer-engine, forward + backward on the same packed rows.

    python -m perf.attention_kernels      # Qwen3-1.7B heads (16 q / 8 kv, head_dim 128)

Cases, each on 8,192 packed tokens, for equal lengths (8 x 1,024) and mixed lengths
(3,000 + 1,500 + 2,500 + 1,192):
- ``flex``: flex attention with a block-sparse causal-document mask (what the backend uses);
- ``varlen``: ``torch.nn.attention.varlen.varlen_attn`` (cu_seqlens), where this torch has it;
- ``sdpa_per_sequence``: one causal SDPA call per sequence (what the backend does on CPU);
- ``sdpa_batched``: one causal SDPA over [sequences, heads, length, dim] (equal lengths only:
  the unpacked reference, not usable for packed rows).
Prints one JSON line: milliseconds per forward + backward, and TFLOP/s (causal FLOPs).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128
LAYOUTS = {"equal": [1024] * 8, "mixed": [3000, 1500, 2500, 1192]}


def _time(fn: Callable[[], Any], steps: int = 20, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def _inputs(total: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    def make(heads: int) -> torch.Tensor:
        t = torch.randn(total, heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        return t.requires_grad_()

    return make(HEADS), make(KV_HEADS), make(KV_HEADS)


def _flex(lengths: list[int]) -> Callable[[], Any]:
    from rstar2.learner.megatron.flex import packed_flex_attention

    q, k, v = _inputs(sum(lengths))
    bounds = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    scale = HEAD_DIM**-0.5
    return lambda: packed_flex_attention(q, k, v, bounds, scale).sum().backward()


def _varlen(lengths: list[int]) -> Callable[[], Any] | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    import inspect

    q, k, v = _inputs(sum(lengths))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda")
    cu = cu.to(torch.int32)
    longest = max(lengths)
    params = inspect.signature(varlen_attn).parameters
    # causal: torch 2.11 takes is_causal, later builds a (left, right) window with right = 0
    causal: dict[str, Any] = (
        {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    )
    gqa = "enable_gqa" in params
    group = HEADS // KV_HEADS
    call: Any = varlen_attn

    def step() -> None:
        kk, vv = (k, v) if gqa else (t.repeat_interleave(group, dim=1) for t in (k, v))
        extra = {"enable_gqa": True} if gqa else {}
        out = call(q, kk, vv, cu, cu, longest, longest, **causal, **extra)
        (out[0] if isinstance(out, tuple) else out).sum().backward()

    return step


def _per_sequence(lengths: list[int]) -> Callable[[], Any]:
    q, k, v = _inputs(sum(lengths))

    def step() -> None:
        outs = []
        for a, n in zip([0, *torch.tensor(lengths).cumsum(0).tolist()], lengths, strict=False):
            qs, ks, vs = (t[a : a + n].transpose(0, 1)[None] for t in (q, k, v))
            outs.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True))
        torch.cat([o[0].transpose(0, 1) for o in outs]).sum().backward()

    return step


def _batched(lengths: list[int]) -> Callable[[], Any] | None:
    if len(set(lengths)) != 1:
        return None
    rows, n = len(lengths), lengths[0]

    def make(heads: int) -> torch.Tensor:
        t = torch.randn(rows, heads, n, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        return t.requires_grad_()

    q, k, v = make(HEADS), make(KV_HEADS), make(KV_HEADS)
    return lambda: (
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sum().backward()
    )


def main() -> dict[str, Any]:
    results: dict[str, Any] = {}
    for layout, lengths in LAYOUTS.items():
        # causal attention: 2 matmuls of (n^2 / 2) x head_dim per head, x3 for fwd + bwd
        flops = sum(3 * 2 * 2 * HEADS * HEAD_DIM * n * n / 2 for n in lengths)
        cases = {
            "flex": _flex(lengths),
            "varlen": _varlen(lengths),
            "sdpa_per_sequence": _per_sequence(lengths),
            "sdpa_batched": _batched(lengths),
        }
        for name, step in cases.items():
            if step is None:
                continue
            try:
                seconds = _time(step)
            except Exception as exc:  # a kernel this build lacks: reported, not fatal
                results[f"{layout}/{name}"] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
                continue
            results[f"{layout}/{name}"] = {
                "ms": round(seconds * 1e3, 3),
                "tflops": round(flops / seconds / 1e12, 1),
            }
            print(f"{layout:<6} {name:<18} {results[f'{layout}/{name}']}", flush=True)
    out = {
        "benchmark": "attention_kernels",
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "heads": [HEADS, KV_HEADS, HEAD_DIM],
        "results": results,
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
