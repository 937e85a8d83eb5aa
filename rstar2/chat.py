"""``rstar2 chat``: talk to a model with the Python tool, printing every turn, call and result.

The public port's ``examples/chat_with_tool_call.py``, on the same agent loop the trainer uses:
in-process vLLM (``--model PATH``) or a running OpenAI-compatible vLLM server (``--server URL``),
tools in the embedded sandbox (or ``--sandbox-url``). One-shot with ``--prompt``, else
interactive: each line you type continues the conversation.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from rstar2.agent.loop import AgentSettings, run_trajectory
from rstar2.agent.template import PromptFormat
from rstar2.config import EmbeddedSandboxConfig, HttpSandboxConfig, SandboxConfig
from rstar2.rollout.openai_engine import OpenAIServerConfig
from rstar2.rollout.vllm_engine import VLLMEngineConfig
from rstar2.runtime import Runtime
from rstar2.runtime.placement import LocalPlacement

_COLORS = {"assistant": "", "tool_call": "\033[36m", "tool_result": "\033[33m"}
_LABELS = {"assistant": "assistant", "tool_call": "tool call", "tool_result": "tool result"}


def add_service_arguments(p: argparse.ArgumentParser) -> None:
    """Which engine and sandbox to use (``rstar2 chat`` and ``rstar2 eval``)."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="HF model folder, served in-process by vLLM")
    src.add_argument("--server", help="URL of a running OpenAI-compatible vLLM server")
    p.add_argument("--served-model-name", help="model name on the server (default: --tokenizer)")
    p.add_argument("--tokenizer", help="tokenizer folder (default: --model)")
    p.add_argument("--dtype", default="auto", help="in-process engine dtype (float32 on CPU)")
    p.add_argument("--sandbox-url", help="sandbox-pool server (default: an embedded pool)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_service_arguments(p)
    p.add_argument("--prompt", help="one question, then exit (default: interactive)")
    p.add_argument("--max-tokens", type=int, default=8192, help="token budget per answer")
    p.add_argument("--max-turns", type=int, default=10, help="assistant turns per answer")
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--max-model-len", type=int, default=16384, help="in-process engine context")


async def run_chat(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    from transformers import AutoTokenizer

    tokenizer_path = args.tokenizer or args.model
    if not tokenizer_path:
        print("rstar2 chat: --server needs --tokenizer (the served model's folder)", file=out)
        return 2
    template = PromptFormat.load(tokenizer_path).template(
        AutoTokenizer.from_pretrained(tokenizer_path)
    )
    settings = AgentSettings(
        max_turns=args.max_turns,
        max_response_tokens=args.max_tokens,
        temperature=args.temperature,
    )
    color = out.isatty()

    def show(event: str, text: str) -> None:
        start, end = (_COLORS[event], "\033[0m") if color and _COLORS[event] else ("", "")
        print(f"{start}[{_LABELS[event]}]\n{text}{end}", file=out, flush=True)

    async with (
        Runtime(LocalPlacement()) as runtime,
        runtime.engines(engine_spec(args, tokenizer_path, args.max_model_len)) as (engines, _),
        runtime.sandbox(sandbox_section(args), SANDBOX_REFUSAL) as sandbox,
    ):
        engine = engines[0]
        history: list[int] = []
        questions = [args.prompt] if args.prompt else _interactive()
        for question in questions:
            if not history:
                prompt = template.encode_prompt([{"role": "user", "content": question}])
            else:
                prompt = history + template.encode(template.user_turn_text(question))
            traj = await run_trajectory(engine, sandbox, template, prompt, settings, show)
            history = traj.prompt_ids + traj.response_ids
            print(
                f"[done: {traj.finish_reason}, {traj.num_turns} turns, "
                f"{traj.num_tool_calls} tool calls, {len(traj.response_ids)} tokens]",
                file=out,
                flush=True,
            )
    return 0


def _interactive() -> Any:
    while True:
        try:
            line = input("you> ").strip()
        except EOFError:
            return
        if line:
            yield line


def engine_spec(
    args: argparse.Namespace, tokenizer_path: str, max_model_len: int
) -> VLLMEngineConfig | OpenAIServerConfig:
    """The engine ``--model`` / ``--server`` name (``rstar2 chat`` and ``rstar2 eval``)."""
    if args.server:
        return OpenAIServerConfig(args.server, args.served_model_name or tokenizer_path)
    limit = model_context_tokens(args.model)
    if limit is not None and max_model_len > limit:
        max_model_len = limit  # answers longer than the model's context stop for length
    return VLLMEngineConfig(model_path=args.model, max_model_len=max_model_len, dtype=args.dtype)


def model_context_tokens(model_dir: str) -> int | None:
    """The model folder's ``max_position_embeddings`` (None when it does not say)."""
    import json
    from pathlib import Path

    path = Path(model_dir) / "config.json"
    try:
        value = json.loads(path.read_text()).get("max_position_embeddings")
    except (OSError, ValueError):
        return None
    return int(value) if isinstance(value, int | float) and value > 0 else None


SANDBOX_REFUSAL = (
    "--sandbox-url",
    "point --sandbox-url at a sandbox-pool server (serve --unsafe-weak-isolation)",
)


def sandbox_section(args: argparse.Namespace) -> SandboxConfig:
    """The sandbox ``--sandbox-url`` names, else an embedded pool of two workers."""
    if args.sandbox_url:
        return HttpSandboxConfig(mode="http", url=args.sandbox_url)
    return EmbeddedSandboxConfig(num_workers=2)
