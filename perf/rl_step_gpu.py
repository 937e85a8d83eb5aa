"""One colocated RL step at a real shape on one GPU, phase by phase, against the plan.

    python -m perf.rl_step_gpu --config configs/perf/rl_step_qwen3_1p7b.yaml [--out FILE]
    python -m perf.rl_step_gpu --config ... --write-trace FILE   # the plan's trace (no GPU)

The config is the one ``perf.plan`` predicts from (model shape, batch, response length,
engine memory, learner): the benchmark builds random bf16 weights of the config's known
shape and a small tokenizer, starts rstar2's own colocated placement (a Ray learner rank and a
vLLM engine actor sharing the GPU, the engine with sleep mode and vLLM's CUDA-IPC transfer),
then runs ``--steps`` RL steps (the first warms up: CUDA-IPC handles, allocator, graphs):

- rollout: every prompt x sample generated at once, fixed length (``ignore_eos``), random
  prompt ids of ``--prompt-tokens``; rollout tokens/s = generated tokens / wall time;
- sleep: the engine frees its weights and KV cache (level 2) for the learner;
- learn: one optimizer step over every sequence (advantages +-1, the engine's log-probs as
  the old ones); learner tokens/s = trained tokens / wall time;
- sync (``IpcSync``, as ``rstar2 train`` colocated): wake the weights, the CUDA-IPC transfer
  of the weights in the engine's dtype through vLLM's own receiver (GB/s, and its ratio to a
  512 MiB device-to-device copy timed in this process in the same run), the learner's cached
  blocks released, wake the KV cache.

Device-wide used memory (``cudaMemGetInfo``: the engine and the learner are other processes)
is sampled every 5 ms; each phase reports its peak. One JSON object out (``--out`` writes it too).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

COPY_BYTES = 512 << 20
SAMPLE_S = 0.005


def trace_rows(cfg: Any, prompt_tokens: int) -> list[dict[str, Any]]:
    """The plan's trace of this benchmark's batch: fixed lengths, one turn, no tool."""
    n = cfg.data.rollout_batch_num_prompts * cfg.rollout.num_samples_per_prompt
    gen = cfg.stages[0].max_response_tokens
    return [
        {"id": f"t{i}", "prompt_tokens": prompt_tokens, "turns": [{"gen_tokens": gen}]}
        for i in range(n)
    ]


class MemorySampler:
    """Device-wide used GPU memory every ``SAMPLE_S`` in a thread: (perf_counter, bytes), from
    ``cudaMemGetInfo`` (the device's free memory, whichever process holds the rest: the GPU
    host has no NVML binding installed)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import torch

        while not self._stop.is_set():
            free, total = torch.cuda.mem_get_info(0)
            self.samples.append((time.perf_counter(), int(total - free)))
            self._stop.wait(SAMPLE_S)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def device_copy_gb_per_s() -> float:
    """A 512 MiB bf16 device-to-device copy's rate (bytes copied / time), median of 20."""
    import torch

    a = torch.empty(COPY_BYTES // 2, dtype=torch.bfloat16, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    times.sort()
    return COPY_BYTES / times[len(times) // 2] / 1e9


def build_model(shape_name: str, folder: Path) -> None:
    """Random bf16 weights of a known shape and a 1K-token tokenizer in ``folder``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from perf.plan_inputs import SHAPES
    from rstar2.tiny import build_tokenizer

    s = SHAPES[shape_name]
    fields: dict[str, Any] = dict(
        hidden_size=s.hidden,
        intermediate_size=s.intermediate,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads,
        vocab_size=s.vocab,
        tie_word_embeddings=s.tied,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        dtype="bfloat16",
    )
    config: Any
    arch: Any
    if s.family == "qwen2":  # head_dim is hidden / heads; q/k/v biases, no q/k norms
        assert s.head_dim * s.heads == s.hidden, s
        config, arch = Qwen2Config(**fields), Qwen2ForCausalLM
    else:
        config, arch = Qwen3Config(**{**fields, "head_dim": s.head_dim}), Qwen3ForCausalLM
    torch.manual_seed(0)
    with torch.device("cuda"):
        model: Any = arch(config)
    model = model.to(dtype=torch.bfloat16)
    model.save_pretrained(folder)
    del model
    torch.cuda.empty_cache()
    corpus = [f"step {i} of the benchmark with {i * 7} tokens" for i in range(2000)]
    build_tokenizer(folder, corpus, vocab_size=1024)


async def _step(
    engine: Any, learner: Any, sync: Any, prompts: list[list[int]], response: int, seed: int
) -> dict[str, Any]:
    from rstar2.learner.protocol import TrainSequence
    from rstar2.rollout.engine import SamplingSettings

    spans: dict[str, tuple[float, float]] = {}
    t0 = time.perf_counter()
    seen = {"kv_capacity_tokens": 0, "max_running": 0, "max_waiting": 0, "preemptions": 0}
    watch = asyncio.create_task(_watch_engine(engine, seen))
    try:
        gens = await asyncio.gather(
            *(
                engine.generate(
                    p,
                    SamplingSettings(max_tokens=response, seed=seed + i, ignore_eos=True),
                )
                for i, p in enumerate(prompts)
            )
        )
    finally:
        watch.cancel()
    spans["rollout"] = (t0, time.perf_counter())
    generated = sum(len(g.token_ids) for g in gens)
    seqs = [
        TrainSequence(
            p + g.token_ids,
            [0] * len(p) + [1] * len(g.token_ids),
            [0.0] * len(p) + g.logprobs,
            1.0 if i % 2 else -1.0,
        )
        for i, (p, g) in enumerate(zip(prompts, gens, strict=True))
    ]
    await sync.before_learn()
    t0 = time.perf_counter()
    await asyncio.to_thread(learner.train_step, seqs)
    spans["learn"] = (t0, time.perf_counter())
    stats = await sync.sync()
    for name, start, end in sync.spans:
        spans[name] = (start, end)
    trained = sum(len(s.token_ids) for s in seqs)
    rollout_s = spans["rollout"][1] - spans["rollout"][0]
    learn_s = spans["learn"][1] - spans["learn"][0]
    return {
        "spans": spans,
        "generated_tokens": generated,
        "trained_tokens": trained,
        "rollout_tokens_per_s": round(generated / rollout_s, 1),
        "learner_tokens_per_s": round(trained / learn_s, 1),
        "sync_bytes": stats.bytes,
        "sync_buckets": stats.buckets,
        "transfer_gb_per_s": round(stats.gb_per_s, 2),
        # what the plan assumes of the engine (perf.plan's --engine-max-num-seqs, its KV space)
        "engine_seen": seen,
    }


async def _watch_engine(engine: Any, seen: dict[str, int], every_s: float = 0.25) -> None:
    """Raise ``seen`` to the engine's KV capacity and the most requests it ran, held waiting and
    preempted at once, from its stats polls, until cancelled."""
    while True:
        st = engine.kv_stats()
        seen["kv_capacity_tokens"] = max(seen["kv_capacity_tokens"], st.capacity_tokens)
        seen["max_running"] = max(seen["max_running"], st.num_running)
        seen["max_waiting"] = max(seen["max_waiting"], st.num_waiting)
        seen["preemptions"] = max(seen["preemptions"], st.num_preemptions)
        await asyncio.sleep(every_s)


async def _run(cfg: Any, args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    from rstar2 import recipe
    from rstar2.learner.build import learner_settings
    from rstar2.rollout.vllm_engine import VLLMEngineConfig
    from rstar2.runtime.placement import RayPlacement

    placement = RayPlacement(cfg)
    placement.open()
    learner = placement.start_learner(learner_settings(cfg, str(model_dir)))
    engine_config = VLLMEngineConfig(
        model_path=str(model_dir),
        dtype=cfg.model.dtype,
        max_model_len=recipe.max_model_len(cfg),
        seed=cfg.seed,
        rollout=cfg.rollout,
        weight_transfer="ipc",
        sleep_mode=True,
    )
    n = cfg.data.rollout_batch_num_prompts * cfg.rollout.num_samples_per_prompt
    rng = random.Random(cfg.seed)
    prompts = [[rng.randrange(5, 1000) for _ in range(args.prompt_tokens)] for _ in range(n)]
    response = cfg.stages[0].max_response_tokens
    steps: list[dict[str, Any]] = []
    try:
        async with asyncio.TaskGroup() as tasks:
            t0 = time.perf_counter()
            engine = await placement.start_engine(engine_config, tasks)
            start_s = time.perf_counter() - t0
            sync = placement.weight_sync(learner, [engine], cfg.learner.weight_sync_bucket_mb << 20)
            try:
                for k in range(args.steps):
                    steps.append(await _step(engine, learner, sync, prompts, response, 1000 * k))
                    print(f"step {k + 1}: " + json.dumps(_phases(steps[-1])), file=sys.stderr)
            finally:
                await engine.aclose()
    finally:
        learner.close()
        placement.close()
    return {"engine_start_s": round(start_s, 1), "steps": steps}


def _phases(step: dict[str, Any]) -> dict[str, float]:
    return {name: round(end - start, 3) for name, (start, end) in step["spans"].items()}


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=2, help="the first warms up")
    parser.add_argument("--write-trace", help="write the plan's trace (JSONL) here and stop")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    from rstar2.config_io import load_config

    cfg = load_config(args.config)
    if args.write_trace:
        rows = trace_rows(cfg, args.prompt_tokens)
        Path(args.write_trace).write_text("".join(json.dumps(r) + "\n" for r in rows))
        return None

    import torch

    from perf.record import commit
    from perf.rl_step_report import report

    copy_gb_per_s = device_copy_gb_per_s()
    with tempfile.TemporaryDirectory() as tmp, MemorySampler() as memory:
        model_dir = Path(tmp) / "model"
        t0 = time.perf_counter()
        build_model(cfg.model.path, model_dir)
        build_s = time.perf_counter() - t0
        run = asyncio.run(_run(cfg, args, model_dir))
    result = report(cfg, args, run, memory, copy_gb_per_s)
    result |= {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "model_build_s": round(build_s, 1),
        "commit": commit(),
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
