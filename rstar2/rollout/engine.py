"""The Engine protocol the agent loop and the scheduler talk to (token ids in, token ids out).

Implementations: :class:`rstar2.rollout.vllm_engine.VLLMEngine` (in-process ``AsyncLLM``, usable
inside a Ray actor), :class:`rstar2.rollout.ray_engine.RayEngine` (one in a Ray actor) and
:class:`rstar2.rollout.openai_engine.OpenAIServerEngine` (a running ``vllm serve``). Nothing
here imports vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

FinishReason = Literal["stop", "length", "abort", "error"]


class EngineDown(RuntimeError):
    """The engine can serve no more requests (its process died or its connection is gone).
    Raised by ``generate``; the dispatcher then moves the request to another engine."""


@dataclass(frozen=True, kw_only=True)
class SamplingSettings:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    # exactly max_tokens, past EOS (benchmarks need fixed lengths): vLLM engines honour it
    ignore_eos: bool = False


@dataclass
class Generation:
    """What one generate call produced: the sampled ids and each one's log-probability."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class KVStats:
    capacity_tokens: int
    used_tokens: int
    num_running: int
    num_waiting: int
    num_preemptions: int = 0
    # engine steps so far, monotonic: the dispatcher's progress marker for hung-engine detection
    # (None: the engine does not count them, and is not watched)
    steps: int | None = None
    # prefix cache, cumulative since the engine started: prompt tokens looked up, and how many
    # of them were found cached (preempted requests' re-admissions included); None: unknown
    prefix_queries_tokens: int | None = None
    prefix_hits_tokens: int | None = None


class Generator(Protocol):
    """What the agent loop uses: one call (an engine, or one trajectory's scheduled engine)."""

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingSettings) -> Generation:
        """Continue ``prompt_ids``; ``logprobs[i]`` is the sampling log-prob of ``token_ids[i]``."""
        ...


class Engine(Generator, Protocol):
    """A rollout engine: generation, live KV stats, a weight sink, and one async close."""

    @property
    def block_size(self) -> int:
        """Tokens per KV block (the scheduler accounts KV in whole blocks)."""
        ...

    def kv_stats(self) -> KVStats: ...

    def alive(self) -> bool:
        """False once the engine is known to be dead (cheap; no request is sent)."""
        ...

    async def begin_weight_update(self) -> None:
        """A weight update starts: the buckets of one version follow, then
        :meth:`finish_weight_update`."""
        ...

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Load one bucket of new weights (HF names); in-flight requests finish on the old ones
        first."""
        ...

    async def finish_weight_update(self) -> None:
        """Every bucket is in: drop what the old weights computed (the prefix cache)."""
        ...

    async def aclose(self) -> None:
        """Stop the engine and release what it holds (idempotent)."""
        ...
