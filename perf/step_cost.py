"""Measure the rollout simulator's step-cost constants on this machine (GPU or CPU).

    python -m perf.step_cost --device cuda [--shape qwen2.5-14b] [--out FILE]
    python -m perf.rollout_sim --cost FILE ...     # replay a trace with the measured constants

:class:`scheduler.sim_model.StepCostModel` prices an engine step as ``step_base_s + per_token_s x
tokens computed + per_kv_token_s x KV tokens read``. This benchmark times the kernels behind
each term, at the model's real shapes and dtype, one decoder layer's weights reused for every
layer (a layer's weights are many times the L2 cache, so every pass reads them from memory):

- ``step_base_s``: a one-token decode step without attention (every layer's projections and
  MLP, plus the LM head): the weight read that every step pays whatever its batch.
- ``per_token_s``: the mean time per token of prefilling one ``--prefill-tokens`` sequence
  (projections, MLP and causal attention, via ``scaled_dot_product_attention``), the cost of a
  computed prompt, a re-prefilled history or, in the additive model, a decode token.
- ``per_decode_token_s``: the least-squares slope of that decode step over batches of 1 to 256
  tokens. It is well below ``per_token_s``: at these batches the GEMMs are still bound by
  the weight read.
- ``per_kv_token_s``: decode attention's time per cached KV token, the least-squares slope of
  timed grouped-query decode attention over batches of cached contexts, times the layers.

These are kernel times from PyTorch's own GEMMs and SDPA, not an engine's: vLLM's CUDA graphs,
paged-attention kernels and scheduler overhead differ. What they pin down is the hardware's
rates at this model's shapes. Prints a table, then one JSON line; ``--out`` writes that JSON,
which ``perf.rollout_sim --cost`` reads.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from perf.record import FLOOR_S, commit, fit_line, floor_costs, hardware
from perf.shapes import QWEN2_5_14B, DecoderShape

SHAPES = {
    # Qwen2.5-14B, the simulator's default engine model
    "qwen2.5-14b": QWEN2_5_14B,
    # small enough for a CPU smoke run
    "tiny": DecoderShape(256, 512, 2, 4, 2, 64, 1024),
}


class _Layer:
    """One decoder layer's weights, and its forward without norms or rotary embeddings (a
    small, bandwidth-bound share of a step)."""

    def __init__(self, shape: DecoderShape, device: torch.device, dtype: torch.dtype) -> None:
        s = shape
        g = torch.Generator(device="cpu").manual_seed(0)

        def w(rows: int, cols: int) -> torch.Tensor:
            return (torch.randn(rows, cols, generator=g, dtype=torch.float32) * 0.02).to(
                device=device, dtype=dtype
            )

        self.s = s
        self.qkv = w(s.hidden, (s.heads + 2 * s.kv_heads) * s.head_dim)
        self.out = w(s.heads * s.head_dim, s.hidden)
        self.gate_up = w(s.hidden, 2 * s.intermediate)
        self.down = w(s.intermediate, s.hidden)
        self.lm_head = w(s.hidden, s.vocab)

    def forward(
        self,
        x: torch.Tensor,
        *,
        causal_attention: bool = False,
        decode_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """x: [tokens, hidden]. With ``causal_attention`` the tokens are one sequence and
        attend to each other; with ``decode_kv`` (K and V, [tokens, kv_heads, context,
        head_dim]) each token is one sequence's next token and attends to its cached context;
        with neither, attention is left out (timed on its own)."""
        s = self.s
        qkv = x @ self.qkv
        if decode_kv is not None:
            n, group = x.shape[0], s.heads // s.kv_heads
            # grouped-query decode: each KV head's query heads packed as its queries
            q = qkv[:, : s.heads * s.head_dim].view(n, s.kv_heads, group, s.head_dim)
            a = F.scaled_dot_product_attention(q, *decode_kv).reshape(n, s.heads * s.head_dim)
        elif causal_attention:
            n = x.shape[0]
            q, k, v = qkv.split(
                [s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], -1
            )
            group = s.heads // s.kv_heads
            q = q.view(1, n, s.heads, s.head_dim).transpose(1, 2)
            # K/V repeated per query head (as HF's repeat_kv): SDPA's fused kernels then take
            # it, where enable_gqa can fall back to the quadratic-memory math kernel
            k = k.view(1, n, s.kv_heads, s.head_dim).transpose(1, 2)
            v = v.view(1, n, s.kv_heads, s.head_dim).transpose(1, 2)
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            a = a.transpose(1, 2).reshape(n, s.heads * s.head_dim)
        else:
            a = qkv[:, : s.heads * s.head_dim]
        h = x + a @ self.out
        gate, up = (h @ self.gate_up).chunk(2, dim=-1)
        return h + (F.silu(gate) * up) @ self.down


def _timer(device: torch.device) -> Callable[[Callable[[], object], int], float]:
    """Median seconds of ``fn`` over ``repeats`` runs, after warm-up."""

    def time_it(fn: Callable[[], object], repeats: int) -> float:
        for _ in range(2):
            fn()
        times = []
        for _ in range(repeats):
            if device.type == "cuda":
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1000)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    return time_it


def measure(
    shape: DecoderShape,
    device: torch.device,
    *,
    dtype: torch.dtype = torch.bfloat16,
    prefill_tokens: int = 4096,
    decode_contexts: list[tuple[int, int]] | None = None,
    check_step: tuple[int, int] = (8, 256),
    repeats: int = 10,
) -> dict[str, Any]:
    """Time the three terms (see the module docstring); returns the constants and the raw
    timings they come from."""
    layer = _Layer(shape, device, dtype)
    time_it = _timer(device)
    s = shape

    def stack(
        tokens: int,
        causal: bool,
        lm_head_tokens: int,
        decode_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> Callable[[], object]:
        x = torch.randn(tokens, s.hidden, device=device, dtype=dtype)

        def fn() -> object:
            h = x
            for _ in range(s.layers):
                h = layer.forward(h, causal_attention=causal, decode_kv=decode_kv)
            return h[-lm_head_tokens:] @ layer.lm_head

        return fn

    with torch.inference_mode():
        base = time_it(stack(1, False, 1), repeats)
        decode_batches = {b: time_it(stack(b, False, b), repeats) for b in (16, 64, 256)}
        prefill_half = time_it(stack(prefill_tokens // 2, True, 1), max(3, repeats // 3))
        prefill = time_it(stack(prefill_tokens, True, 1), max(3, repeats // 3))
        points: list[tuple[float, float]] = []
        raw_attention = []
        contexts = decode_contexts or [(16, 1024), (32, 1024), (16, 4096)]
        group = s.heads // s.kv_heads
        for batch, context in contexts:
            # grouped-query decode: each KV head's `group` query heads packed as its queries
            q = torch.randn(batch, s.kv_heads, group, s.head_dim, device=device, dtype=dtype)
            k = torch.randn(batch, s.kv_heads, context, s.head_dim, device=device, dtype=dtype)
            v = torch.randn_like(k)
            t = time_it(partial(F.scaled_dot_product_attention, q, k, v), repeats)
            points.append((batch * context, t))
            raw_attention.append({"batch": batch, "context": context, "layer_s": t})
        per_kv_token = fit_line(points, "decode attention contexts")[0] * s.layers
        per_decode_token = fit_line([(1, base), *decode_batches.items()], "decode batches")[0]
        # the check: one whole decode step (every layer attending to its cached context)
        # against the additive model's price for it
        batch, context = check_step
        k = torch.randn(batch, s.kv_heads, context, s.head_dim, device=device, dtype=dtype)
        whole = time_it(stack(batch, False, batch, (k, torch.randn_like(k))), repeats)
    # a slope below the machine's noise (a loaded CPU) is floored and named, as engine_cost does
    fitted, floored = floor_costs(
        {
            "step_base_s": base,
            "per_token_s": prefill / prefill_tokens,
            "per_decode_token_s": per_decode_token,
            "per_kv_token_s": per_kv_token,
        }
    )
    return {
        **fitted,
        "floored": floored,
        "check": {
            "batch": batch,
            "context": context,
            "measured_s": whole,
            "model_s": base + per_decode_token * batch + per_kv_token * batch * context,
        },
        "raw": {
            "decode_no_attention_s": {"1": base, **{str(b): t for b, t in decode_batches.items()}},
            "prefill_s": {str(prefill_tokens // 2): prefill_half, str(prefill_tokens): prefill},
            "decode_attention_per_layer": raw_attention,
        },
    }


def kv_tokens_estimate(shape: DecoderShape, device: torch.device, utilization: float) -> int | None:
    """KV tokens an engine on this GPU would get: ``utilization`` of its memory, less the bf16
    weights and a 10% share for activations (vLLM profiles the real figure)."""
    if device.type != "cuda":
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    free = utilization * total - 2 * shape.weight_params - 0.1 * total
    return max(0, int(free // shape.kv_bytes_per_token))


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    shape = SHAPES[args.shape]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    print(f"shape {args.shape} on {device} ({dtype}); {shape.weight_params / 1e9:.2f}B weights")
    # on a GPU, contexts of 0.25-1M KV tokens: well past launch overhead, below an engine's KV
    contexts = [(64, 4096), (128, 4096), (256, 4096), (32, 16384), (64, 16384)]
    m = measure(
        shape,
        device,
        dtype=dtype,
        prefill_tokens=args.prefill_tokens,
        decode_contexts=contexts if device.type == "cuda" else None,
        check_step=(128, 4096) if device.type == "cuda" else (8, 256),
        repeats=args.repeats,
    )
    rate = 1.0 / m["per_token_s"]
    print(f"{'term':<20}{'value':>14}  meaning")
    print(f"{'step_base_s':<20}{m['step_base_s']:>14.3e}  one-token decode step, no attention")
    print(
        f"{'per_token_s':<20}{m['per_token_s']:>14.3e}  per prefill token at "
        f"{args.prefill_tokens} ({rate:,.0f} tokens/s)"
    )
    print(
        f"{'per_decode_token_s':<20}{m['per_decode_token_s']:>14.3e}  per decode token "
        "(batches of 1-256)"
    )
    print(f"{'per_kv_token_s':<20}{m['per_kv_token_s']:>14.3e}  per KV token read, all layers")
    c = m["check"]
    print(
        f"check: one decode step of {c['batch']} sequences x {c['context']} cached tokens took "
        f"{1e3 * c['measured_s']:.2f} ms; the model prices it at {1e3 * c['model_s']:.2f} ms"
    )
    if m["floored"]:
        print(f"floored at {FLOOR_S:g} s (below this machine's noise; rerun on a quieter one): "
              + ", ".join(m["floored"]))  # fmt: skip
    kv_bw = shape.kv_bytes_per_token / m["per_kv_token_s"] / 1e12
    print(f"decode attention reads KV at {kv_bw:.2f} TB/s")
    out: dict[str, Any] = {
        "benchmark": "step_cost",
        "shape": args.shape,
        "decoder": asdict(shape),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "tensor_parallel_size": 1,  # kernels on one device: perf.plan scales to its TP
        "torch": torch.__version__,
        "cost": {
            k: m[k] for k in ("step_base_s", "per_token_s", "per_decode_token_s", "per_kv_token_s")
        },
        "prefill_tokens_per_s": round(rate, 1),
        "kv_read_tb_per_s": round(kv_bw, 3),
        "kv_tokens_estimate_at_0.9": kv_tokens_estimate(shape, device, 0.9),
        "floored": m["floored"],
        "check": m["check"],
        "raw": m["raw"],
        "hardware": hardware(),
        "commit": commit(),
    }
    line = json.dumps(out)
    print(line)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shape", default="qwen2.5-14b", choices=sorted(SHAPES))
    parser.add_argument("--prefill-tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", help="also write the JSON here (perf.rollout_sim --cost)")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda, but torch sees no GPU", file=sys.stderr)
        return 2
    if args.prefill_tokens < 2 or args.repeats < 1:
        print("error: --prefill-tokens must be at least 2 and --repeats positive", file=sys.stderr)
        return 2
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
