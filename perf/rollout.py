"""Rollout benchmark: N concurrent trajectories with tool calls on a tiny model and real vLLM.

Builds the tiny tool-using test model (trained for ~30 s to call the tool, then answer), starts
an in-process vLLM engine and the embedded sandbox, and runs N trajectories at once (sampled,
temperature 0.7). Prints a table, then one JSON line: trajectories_per_s, tokens_per_s (sampled
tokens), tool_wait_fraction (tool wait time / trajectory time, summed over trajectories) and
overlap (the share of tool waits that ran while another trajectory was generating).

Every turn goes through the rollout dispatcher (``--policy``, default ``kv_affinity``).

    python -m perf.rollout [--trajectories 64] [--model DIR] [--policy P]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rstar2.agent.loop import AgentSettings, run_trajectory
from rstar2.agent.template import ChatTemplate
from rstar2.agent.tools import tool_schema
from rstar2.config import RolloutConfig
from rstar2.rollout.dispatch import Dispatcher, run_scheduled
from rstar2.rollout.vllm_engine import VLLMEngine, VLLMEngineConfig
from sandbox_pool import PoolConfig, SandboxPool
from scheduler.core import POLICIES, SchedulerSettings


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.helpers.tool_model import SCRIPTS, build_tool_model

    model = Path(args.model) if args.model else build_tool_model(Path(tempfile.mkdtemp()))
    template = ChatTemplate(AutoTokenizer.from_pretrained(model), tools=(tool_schema(),))
    engine = await VLLMEngine.create(
        VLLMEngineConfig(
            model_path=str(model),
            dtype="float32",
            max_model_len=1024,
            rollout=RolloutConfig(enforce_eager=True),
        )
    )
    settings = AgentSettings(max_turns=4, max_response_tokens=400, temperature=0.7)
    prompts = [
        template.encode_prompt([{"role": "user", "content": SCRIPTS[i % 2].problem}])
        for i in range(args.trajectories)
    ]
    try:
        async with SandboxPool(PoolConfig(num_workers=2)) as sandbox:
            await run_trajectory(engine, sandbox, template, prompts[0], settings)  # warm
            policy = SchedulerSettings(policy=args.policy, block_size_tokens=engine.block_size)
            async with Dispatcher([engine], policy) as dispatcher:
                start = time.perf_counter()
                trajs = await asyncio.gather(
                    *(run_scheduled(dispatcher, sandbox, template, p, settings) for p in prompts)
                )
                wall = time.perf_counter() - start
    finally:
        await engine.aclose()

    sampled = sum(sum(t.loss_mask) for t in trajs)
    tool_s = sum(t.time_tool_s for t in trajs)
    traj_s = sum(t.time_tool_s + t.time_generate_s for t in trajs)
    gens = [(i, s, e) for i, t in enumerate(trajs) for k, s, e in t.spans if k == "generate"]
    tools = [(i, s, e) for i, t in enumerate(trajs) for k, s, e in t.spans if k == "tool"]
    overlapped = sum(
        1 for i, s, e in tools if any(j != i and gs < e and s < ge for j, gs, ge in gens)
    )
    result = {
        "benchmark": "rollout",
        "cores": os.cpu_count(),
        "policy": args.policy,
        "trajectories": len(trajs),
        "wall_s": round(wall, 3),
        "trajectories_per_s": round(len(trajs) / wall, 2),
        "tokens_per_s": round(sampled / wall, 1),
        "tool_calls": sum(t.num_tool_calls for t in trajs),
        "tool_wait_fraction": round(tool_s / traj_s, 3) if traj_s else 0.0,
        "tool_waits_overlapping_generation": round(overlapped / len(tools), 3) if tools else 0.0,
    }
    print(f"{'metric':<36}{'value':>12}")
    for key in (
        "trajectories",
        "wall_s",
        "trajectories_per_s",
        "tokens_per_s",
        "tool_calls",
        "tool_wait_fraction",
        "tool_waits_overlapping_generation",
    ):
        print(f"{key:<36}{result[key]:>12}")
    print(json.dumps(result))
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--model", help="an already built tool model folder")
    parser.add_argument("--policy", default="kv_affinity", choices=POLICIES)
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
