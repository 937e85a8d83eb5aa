"""What the rollout simulator models (pure data): an engine step's cost, the cluster's
settings, and each trajectory's turns as the simulator runs them.

Step time (``StepCostModel``) is the GPU's, additive: a fixed cost (weights read once per step), a
cost per token computed (prefill; decode tokens too unless ``per_decode_token_s`` prices them
apart), and a cost per token of KV read by the batch; plus the engine's host time per step,
part of which the GPU's work can hide (``host_s``, ``host_overlap``; both 0 by default).
The defaults describe a 14B dense model (Qwen2.5-14B:
48 layers, 8 KV heads x 128 dims, bf16, so 192 KiB of KV per token) on one MI300X (~5.3 TB/s,
~600 dense TFLOP/s), assumed from its datasheet; ``python -m perf.step_cost`` measures the
constants on a GPU (perf/results/step-cost-h200.json). The default KV capacity, 640 Ki tokens
per engine (~128 GB), is what is left of 0.9 x 192 GB after 29.5 GB of weights and ~15 GB of
activations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from scheduler.trace import TraceRow


@dataclass(frozen=True, kw_only=True)
class StepCostModel:
    step_base_s: float = 0.005  # every step: the weights read once
    per_token_s: float = 4.7e-5  # each prefill token (a prompt, a tool result, a recompute)
    per_kv_token_s: float = 3.7e-8  # each KV token the step's decode attention reads
    # each decode token (one per running request per step); None: per_token_s. Measured
    # decode is cheaper than prefill per token: its GEMMs are bound by the weight read
    per_decode_token_s: float | None = None
    # the engine's host work per step (scheduling, input preparation, sampling, output
    # processing) and the share of it that runs while the GPU computes the step: a step of GPU
    # time g takes g + host_s - host_overlap x min(g, host_s)
    host_s: float = 0.0
    host_overlap: float = 0.0

    @property
    def decode_token_s(self) -> float:
        return self.per_token_s if self.per_decode_token_s is None else self.per_decode_token_s

    def gpu_step_s(self, running: int, kv_tokens: int) -> float:
        """A decode step's GPU time: the weights, one token per running request, the KV read."""
        return self.step_base_s + self.decode_token_s * running + self.per_kv_token_s * kv_tokens

    def step_s(self, gpu_s: float) -> float:
        """A decode step's time from its GPU time."""
        return gpu_s + self.host_s - self.host_overlap * min(gpu_s, self.host_s)

    def steps_s(self, first_gpu_s: float, growth_s: float, k: int) -> float:
        """``k`` steps whose GPU times are ``first_gpu_s + growth_s x i`` (i = 0..k-1, the KV
        read growing by a token per request each step), in closed form: the steps whose GPU
        time is under ``host_s`` hide ``host_overlap`` of it, the later ones of ``host_s``."""
        if k <= 0:
            return 0.0
        h, x = self.host_s, self.host_overlap
        if h == 0.0 or x == 0.0:  # additive: every step pays the host time whole
            return k * (first_gpu_s + h) + growth_s * k * (k - 1) / 2
        if first_gpu_s >= h:
            under = 0
        elif growth_s <= 0.0 or (h - first_gpu_s) / growth_s >= k:  # no step reaches h
            under = k
        else:
            under = math.ceil((h - first_gpu_s) / growth_s)
        over = k - under
        gpu_under = under * first_gpu_s + growth_s * under * (under - 1) / 2
        gpu_over = over * first_gpu_s + growth_s * (over * under + over * (over - 1) / 2)
        return under * h + (1 - x) * gpu_under + gpu_over + over * (1 - x) * h


@dataclass(frozen=True, kw_only=True)
class SimSettings:
    num_engines: int = 8
    kv_tokens: int = 655_360  # per engine: ~128 GB of the MI300X left for KV, at 192 KiB a token
    max_num_seqs: int = 256
    max_response_tokens: int = 12_288  # the trajectories' budget (tool responses included)
    default_tool_tokens: int = 128
    # KV block size: >1 models vLLM's paged KV (each request's last block partly used, prefix
    # hits in whole blocks and never the last prompt token); 1 is the token-exact ideal
    block_size_tokens: int = 1
    cost: StepCostModel = field(default_factory=StepCostModel)
    # keep each engine's runs of steps (SimResult.engine_runs): what a fit of the step cost
    # re-prices without simulating again, where the schedule does not depend on the times
    record_runs: bool = False


@dataclass(frozen=True)
class PlannedTurn:
    context: int  # tokens before the turn generates
    gen_tokens: int
    tool_latency_s: float | None  # the tool call after it; None: the trajectory ends
    tool_tokens: int  # the tool response's tokens (0 when it ends)


def plan_turns(row: TraceRow, s: SimSettings) -> tuple[PlannedTurn, ...]:
    """The trajectory's turns as the simulator runs them, whatever the policy: each turn's
    generation capped by what is left of the response budget (tool responses count against
    it), a tool response capped to leave the next turn at least one token, and no turn after
    the budget is spent."""
    out: list[PlannedTurn] = []
    context, budget = row.prompt_tokens, s.max_response_tokens
    for i, turn in enumerate(row.turns):
        generated = min(turn.gen_tokens, budget)
        budget -= generated
        last = turn.tool_latency_s is None or i + 1 >= len(row.turns) or budget <= 0
        if last:
            out.append(PlannedTurn(context, generated, None, 0))
            break
        tool = s.default_tool_tokens if turn.tool_tokens is None else turn.tool_tokens
        tool = min(tool, budget - 1)
        out.append(PlannedTurn(context, generated, turn.tool_latency_s, tool))
        context += generated + tool
        budget -= tool
    return tuple(out)
