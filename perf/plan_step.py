"""The plan's step model: one RL step's predicted parts (:class:`Breakdown`) from the rollout
simulation, the reward cores, the learner's FLOPs and the weight sync, and the mean of several
steps' breakdowns (:mod:`perf.plan` runs it; :mod:`perf.plan_report` prints it)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from perf.plan_engine import dtype_bytes, engine_kv_tokens, no_kv_space
from perf.plan_inputs import Assumption, required
from perf.shapes import DecoderShape
from scheduler.core import SchedulerSettings
from scheduler.sim import simulate
from scheduler.sim_model import SimSettings, StepCostModel
from scheduler.state import Policy
from scheduler.trace import TraceRow

WEEK_S = 7 * 24 * 3600


@dataclass(frozen=True)
class Breakdown:
    """One RL step's predicted parts; None: a part the plan does not model here."""

    rollout_s: float
    tool_per_trajectory_s: float
    reward_s: float
    reward_tail_s: float
    learner_s: float | None
    learner_tokens: int
    sync_s: float | None
    trajectories: int
    engines: int
    kv_tokens: int

    @property
    def step_s(self) -> float:
        parts = (self.rollout_s, self.reward_tail_s, self.learner_s, self.sync_s)
        return sum(p for p in parts if p is not None)

    @property
    def steps_per_week(self) -> float:
        return WEEK_S / self.step_s


def sim_settings(
    cfg: Any, stage: int, a: dict[str, Assumption], shape: DecoderShape, cost: StepCostModel
) -> SimSettings:
    """The rollout simulation's settings for the config's stage ``stage``."""
    kv = engine_kv_tokens(a, shape, cfg)
    if kv <= 0:
        raise no_kv_space(a, shape, cfg)
    return SimSettings(
        num_engines=cfg.rollout.num_engines,
        kv_tokens=kv,
        max_response_tokens=cfg.stages[stage].max_response_tokens,
        default_tool_tokens=int(required(a, "tool_response_tokens")),
        max_num_seqs=int(required(a, "engine_max_num_seqs")),
        cost=cost,
    )


def predict(
    cfg: Any,
    stage: int,
    a: dict[str, Assumption],
    shape: DecoderShape,
    rows: list[TraceRow],
    cost: StepCostModel,
    gpus: int,
    *,
    policy: Policy | None = None,
) -> Breakdown:
    """The step breakdown (pure apart from the simulation it runs); ``policy``: the scheduler's
    in place of the config's (``round_robin``: every request straight to its engine, as
    :mod:`perf.rl_step_gpu` sends them)."""
    settings = sim_settings(cfg, stage, a, shape, cost)
    kv, tool_tokens = settings.kv_tokens, settings.default_tool_tokens
    sim = simulate(rows, settings, SchedulerSettings(policy=policy or cfg.scheduler.policy))
    tools = [sum(t.tool_latency_s or 0.0 for t in r.turns) for r in rows]
    verif_per_s = required(a, "reward_verif_per_s_per_core")
    reward_cores = a["reward_cores"].value or cfg.reward.num_workers or 4
    reward_s = len(rows) / (verif_per_s * reward_cores)
    aug = cfg.augmentation
    per_prompt = (
        aug.down_sampling_config.down_sample_to_n
        if aug.do_down_sampling
        else cfg.rollout.num_samples_per_prompt
    )
    kept = cfg.data.rollout_batch_num_prompts * per_prompt
    mean_tokens = statistics.fmean(_train_tokens(r, tool_tokens) for r in rows)
    tokens = int(kept * mean_tokens)
    return Breakdown(
        sim.makespan_s,
        statistics.fmean(tools),
        reward_s,
        1 / verif_per_s,
        _learner_s(cfg, a, shape, tokens, mean_tokens, gpus),
        tokens,
        _sync_s(cfg, a, shape),
        len(rows),
        cfg.rollout.num_engines,
        kv,
    )


def _learner_s(
    cfg: Any, a: dict[str, Assumption], shape: DecoderShape, tokens: int, mean: float, gpus: int
) -> float | None:
    recompute = 4 / 3 if cfg.algorithm.recompute_old_logprobs else 1.0  # one more forward
    if a["learner_tokens_per_s"].value is not None:
        return tokens * recompute / a["learner_tokens_per_s"].value
    peak = a["peak_tflops"].value
    if peak is None or gpus == 0:
        return None
    flops = shape.train_flops_per_token(mean) * tokens * recompute
    compute = flops / (gpus * peak * 1e12 * required(a, "learner_mfu"))
    per_layer = required(a, "learner_layer_overhead_s")
    if not per_layer:
        return compute
    # sequences of the mean length packed whole into each GPU's micro-batches
    per_micro = max(1, int(cfg.learner.micro_batch_tokens_per_gpu // mean))
    micro_batches = math.ceil(tokens / mean / per_micro / gpus)
    return compute + micro_batches * shape.layers * per_layer * recompute


def _sync_s(cfg: Any, a: dict[str, Assumption], shape: DecoderShape) -> float | None:
    """The learner's weights into every engine GPU (CUDA-IPC) plus the engines' sleep and
    wake-up; not modelled on CPU (file buckets through /dev/shm). The transfer runs at
    ``--ipc-gb-per-s`` plus ``--ipc-layer-s`` per layer (vLLM's own receiver), or with
    ``--ipc-gb-per-s 0`` at ``--ipc-share-of-copy`` of a device copy."""
    hbm = a["hbm_tb_per_s"].value
    if cfg.cluster.accelerator == "cpu" or hbm is None:
        return None
    rate = a["ipc_gb_per_s"].value
    if rate:
        bw = rate * 1e9
    else:
        bw = hbm * 1e12 * required(a, "device_copy_share_of_hbm") * required(a, "ipc_share_of_copy")
    tp = cfg.rollout.tensor_parallel_size
    per_layer = shape.layers * required(a, "ipc_layer_s")
    return shape.weight_bytes(dtype_bytes(cfg)) / tp / bw + per_layer + required(a, "wake_s")


def mean_breakdown(parts: list[Breakdown]) -> Breakdown:
    """The mean of several steps' breakdowns (a saved run's steps)."""

    def mean(values: list[Any]) -> Any:
        return None if values[0] is None else statistics.fmean(values)

    return Breakdown(
        rollout_s=mean([b.rollout_s for b in parts]),
        tool_per_trajectory_s=mean([b.tool_per_trajectory_s for b in parts]),
        reward_s=mean([b.reward_s for b in parts]),
        reward_tail_s=mean([b.reward_tail_s for b in parts]),
        learner_s=mean([b.learner_s for b in parts]),
        learner_tokens=round(statistics.fmean(b.learner_tokens for b in parts)),
        sync_s=mean([b.sync_s for b in parts]),
        trajectories=round(statistics.fmean(b.trajectories for b in parts)),
        engines=parts[0].engines,
        kv_tokens=parts[0].kv_tokens,
    )


def _train_tokens(row: TraceRow, tool_tokens: int) -> int:
    """Prompt, generated and tool-response tokens of one trajectory (what the learner trains):
    a turn's recorded tool tokens, else ``tool_tokens`` for a tool call a turn follows; the
    last turn's call (if any) has no turn after it, so no response in the sequence unless
    recorded (as the simulator plans it)."""
    last = len(row.turns) - 1
    tool = 0
    for i, t in enumerate(row.turns):
        if t.tool_tokens is not None:
            tool += t.tool_tokens
        elif t.tool_latency_s is not None and i != last:
            tool += tool_tokens
    return row.prompt_tokens + row.response_tokens + tool
