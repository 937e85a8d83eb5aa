"""The rStar2 multi-turn tool loop: one trajectory, token ids in and token ids out.

Each assistant turn is generated to its end of turn; every tool call in it is parsed (malformed
ones answered with the parse error), run concurrently in the sandbox, and the results appended as
one user turn of ``<tool_response>`` blocks. The loop stops when a turn makes no tool call, at
``max_turns`` assistant turns, when the token budget is spent, or when the engine stops for
length. Many trajectories share one event loop: a tool wait never blocks another trajectory.

Guarantees of the returned :class:`Trajectory`: ``prompt_ids + response_ids`` is exactly the
token sequence the engine was given and produced (nothing re-tokenised); ``loss_mask`` is 1 on
sampled tokens and 0 on tool-response and template tokens; ``logprobs`` holds the engine's
sampling log-prob for each sampled token and 0.0 elsewhere; all three have the same length.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from rstar2.agent.template import ChatTemplate
from rstar2.agent.tools import ParseError, ToolCall, format_result, parse_tool_calls, truncate
from rstar2.rollout.engine import Generator, SamplingSettings
from sandbox_pool.protocol import ExecRequest, ExecResult

TrajectoryFinish = Literal["stop", "max_turns", "length", "engine_error"]
_ANSWER_PAIR = re.compile(r"<answer>.*?</answer>", re.DOTALL)


class Sandbox(Protocol):
    """SandboxPool and SandboxClient both satisfy this."""

    async def execute(self, request: ExecRequest) -> ExecResult: ...


@dataclass(frozen=True, kw_only=True)
class AgentSettings:
    max_turns: int = 10
    max_response_tokens: int = 8192
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    tool_name: str = "python_code_with_standard_io"
    max_parallel_tool_calls: int = 4
    tool_response_max_chars: int = 256
    tool_response_truncate_side: Literal["left", "middle", "right"] = "middle"
    tool_response_execution_time: bool = True
    # the limits every tool call is sent with (None: the sandbox's own)
    tool_timeout_s: float | None = None
    tool_memory_mb: int | None = None
    tool_max_output_chars: int | None = None


@dataclass
class Trajectory:
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: TrajectoryFinish = "stop"
    num_turns: int = 0
    num_tool_calls: int = 0
    num_tool_errors: int = 0
    num_answer_pairs: int = 0
    response_text: str = ""
    time_generate_s: float = 0.0
    time_tool_s: float = 0.0
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (code, response text)
    spans: list[tuple[str, float, float]] = field(default_factory=list)  # (kind, start, end)

    def append(self, ids: Sequence[int], *, sampled: bool, logprobs: Sequence[float] = ()) -> None:
        self.response_ids.extend(ids)
        self.loss_mask.extend([1 if sampled else 0] * len(ids))
        self.logprobs.extend(logprobs if sampled else [0.0] * len(ids))


Observer = Callable[[str, str], None]  # (event, text): "assistant", "tool_call", "tool_result"


async def run_trajectory(
    engine: Generator,
    sandbox: Sandbox,
    template: ChatTemplate,
    prompt_ids: Sequence[int],
    settings: AgentSettings,
    observer: Observer | None = None,
) -> Trajectory:
    """Roll out one trajectory from ``prompt_ids`` (see the module docstring).

    ``observer`` (optional) hears each assistant turn, tool call and tool result as it happens.
    """
    notify: Observer = observer or (lambda event, text: None)
    traj = Trajectory(prompt_ids=list(prompt_ids))
    sampled_text: list[str] = []
    eos = template.im_end_id
    while True:
        budget = settings.max_response_tokens - len(traj.response_ids)
        if budget <= 0:
            traj.finish_reason = "length"
            break
        sampling = SamplingSettings(
            max_tokens=budget,
            temperature=settings.temperature,
            top_p=settings.top_p,
            seed=None if settings.seed is None else settings.seed + traj.num_turns,
            stop_token_ids=(eos,),
        )
        start = time.perf_counter()
        gen = await engine.generate(traj.prompt_ids + traj.response_ids, sampling)
        traj.time_generate_s += time.perf_counter() - start
        traj.spans.append(("generate", start, time.perf_counter()))
        traj.append(gen.token_ids, sampled=True, logprobs=gen.logprobs)
        traj.num_turns += 1
        text = template.tokenizer.decode(gen.token_ids, skip_special_tokens=False)
        sampled_text.append(text)
        notify("assistant", text)
        if gen.finish_reason in ("abort", "error"):
            traj.finish_reason = "engine_error"
            break
        if gen.finish_reason == "length":
            traj.finish_reason = "length"
            break
        calls = parse_tool_calls(
            text, tool_name=settings.tool_name, max_parallel_calls=settings.max_parallel_tool_calls
        )
        if not calls:
            traj.finish_reason = "stop"
            break
        if traj.num_turns >= settings.max_turns:
            traj.finish_reason = "max_turns"
            break
        start = time.perf_counter()
        for call in calls:
            notify("tool_call", call.code if isinstance(call, ToolCall) else call.message)
        responses = await _run_tools(sandbox, calls, settings, traj)
        for response in responses:
            notify("tool_result", response)
        traj.time_tool_s += time.perf_counter() - start
        traj.spans.append(("tool", start, time.perf_counter()))
        turn = template.encode(template.tool_turn_text(responses))
        if not gen.token_ids or gen.token_ids[-1] != eos:  # the turn must be closed first
            turn = [eos, *turn]
        if len(traj.response_ids) + len(turn) >= settings.max_response_tokens:
            traj.finish_reason = "length"
            break
        traj.append(turn, sampled=False)
    traj.num_answer_pairs = sum(len(_ANSWER_PAIR.findall(t)) for t in sampled_text)
    traj.response_text = template.tokenizer.decode(traj.response_ids, skip_special_tokens=False)
    return traj


async def _run_tools(
    sandbox: Sandbox,
    calls: list[ToolCall | ParseError],
    settings: AgentSettings,
    traj: Trajectory,
) -> list[str]:
    """Tool-response texts for one turn's calls, run concurrently; updates the error counts."""

    async def one(call: ToolCall | ParseError) -> str:
        if isinstance(call, ParseError):
            traj.num_tool_errors += 1
            return call.message
        result = await sandbox.execute(
            ExecRequest(
                code=call.code,
                stdin=call.stdin,
                timeout_s=settings.tool_timeout_s,
                memory_mb=settings.tool_memory_mb,
                max_output_chars=settings.tool_max_output_chars,
            )
        )
        if result.status != "ok" or result.exit_code != 0:
            traj.num_tool_errors += 1
        return truncate(
            format_result(result, show_execution_time=settings.tool_response_execution_time),
            settings.tool_response_max_chars,
            settings.tool_response_truncate_side,
        )

    traj.num_tool_calls += len(calls)
    responses = list(await asyncio.gather(*(one(c) for c in calls)))
    for call, text in zip(calls, responses, strict=True):  # in call order, not finish order
        traj.tool_calls.append((call.code if isinstance(call, ToolCall) else "", text))
    return responses
