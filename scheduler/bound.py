"""The makespan no scheduling policy can beat under the simulator's model (pure).

The engines' work (each prompt and tool result prefilled once, each token decoded once, its
context read once, and the fewest steps that engines of this KV capacity can take) spread
evenly, or the longest trajectory run alone, whichever is longer.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.sim_model import SimSettings, plan_turns
from scheduler.trace import TraceRow


@dataclass(frozen=True)
class LowerBound:
    """Makespan no policy can beat under the model: ``max(work_s, critical_path_s)``."""

    work_s: float  # the least engine-busy time, spread over all engines
    critical_path_s: float  # the longest trajectory, alone on an engine

    @property
    def makespan_s(self) -> float:
        return max(self.work_s, self.critical_path_s)


def makespan_lower_bound(rows: list[TraceRow], s: SimSettings) -> LowerBound:
    """See :class:`LowerBound`. Every token generated at context length ``L`` costs its step
    ``per_kv_token_s x L`` and ``decode_token_s``; a step reads at most ``kv_tokens`` of KV and
    runs at most ``max_num_seqs`` requests, so the engines take at least ``max(sum of L /
    kv_tokens, tokens / max_num_seqs)`` steps between them, each paying ``step_base_s`` and the
    host time no GPU work can hide, ``(1 - host_overlap) x host_s`` (a step of GPU time g takes
    ``g + host_s - host_overlap x min(g, host_s)``, never less than that)."""
    c = s.cost
    per_step = c.step_base_s + (1 - c.host_overlap) * c.host_s
    kv_read = 0.0  # sum over generated tokens of the context length each one is decoded at
    tokens = prefill = 0
    critical = 0.0
    for row in rows:
        turns = plan_turns(row, s)
        row_prefill = row.prompt_tokens + sum(t.tool_tokens for t in turns)
        latency = sum(t.tool_latency_s or 0.0 for t in turns)
        row_tokens = sum(t.gen_tokens for t in turns)
        row_kv = sum(
            t.gen_tokens * t.context + t.gen_tokens * (t.gen_tokens - 1) / 2 for t in turns
        )
        kv_read += row_kv
        tokens += row_tokens
        prefill += row_prefill
        alone = (
            c.per_token_s * row_prefill
            + (per_step + c.decode_token_s) * row_tokens
            + c.per_kv_token_s * row_kv
            + latency
        )
        critical = max(critical, alone)
    steps = max(kv_read / s.kv_tokens, tokens / s.max_num_seqs)
    busy = (
        c.per_token_s * prefill
        + c.decode_token_s * tokens
        + c.per_kv_token_s * kv_read
        + per_step * steps
    )
    return LowerBound(work_s=busy / s.num_engines, critical_path_s=critical)
