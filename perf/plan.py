"""Capacity plan: the predicted time of one RL step of a recipe on its cluster, by part.

    python -m perf.plan --config configs/rstar2_14b_mi300x.yaml [--stage N] [--cost FILE]
                        [--trace FILE] [--FLAG VALUE ...]

- rollout: the scheduling simulator (:mod:`scheduler.sim`) with the config's engines, policy and
  stage budget on a paper-like trace (or ``--trace``), each engine's step cost from the MI300X
  datasheet model or a measured ``--cost`` file scaled to the engine's tensor-parallel width;
- tool time: inside the rollout (trajectories wait on calls while others generate); shown as
  the mean per trajectory and its share of the critical path;
- reward: verification CPU time over the reward cores (it overlaps the rollout; the tail after
  the last trajectory is one verification);
- learner: (prompt + response) tokens of the kept trajectories x training FLOPs per token (and
  one forward more when old log-probs are recomputed), at an MFU of the GPUs' bf16 peak;
- weight sync: the learner's weights into every engine GPU (colocated: CUDA-IPC at the measured
  share of a device copy) plus the engines' wake-up.

Every assumed number is printed with its source and the flag that changes it. Steps per week
are set next to the paper's: 510 RL steps in about a week on 64 MI300X.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, replace
from typing import Any

from perf.plan_check import load_run_traces, measured_rollout_s
from perf.plan_inputs import (
    Assumption,
    PlanInputError,
    add_flags,
    assumptions,
    model_shape,
)
from perf.rollout_sim import CostFileError, load_cost
from perf.shapes import DecoderShape
from scheduler.core import SchedulerSettings
from scheduler.sim import SimSettings, StepCostModel, simulate
from scheduler.trace import TraceRow, load_trace, paper_like

WEEK_S = 7 * 24 * 3600
PAPER_STEPS_PER_WEEK = 510
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def engine_cost(
    a: dict[str, Assumption], shape: DecoderShape, tp: int, measured: StepCostModel | None
) -> StepCostModel:
    """One engine's step cost: a measured single-GPU model or the datasheet, over ``tp`` GPUs."""
    speedup = tp * a["tp_efficiency"].value if tp > 1 else 1.0  # type: ignore[operator]
    if measured is not None:
        base = measured
    else:
        peak, hbm_peak = a["peak_tflops"].value, a["hbm_tb_per_s"].value
        if peak is None or hbm_peak is None:
            raise PlanInputError(
                "--cost: no datasheet for this accelerator; measure the engine "
                "(python -m perf.engine_cost --config ... --out FILE) or give --peak-tflops "
                "and --hbm-tb-per-s"
            )
        hbm = hbm_peak * 1e12 * _v(a, "hbm_efficiency")
        base = StepCostModel(
            step_base_s=2 * shape.weight_params / hbm,  # the weights, read once per step
            per_token_s=2 * shape.matmul_params / (peak * 1e12 * _v(a, "engine_prefill_mfu")),
            per_kv_token_s=shape.kv_bytes_per_token / hbm,
        )
    return replace(
        base,
        step_base_s=base.step_base_s / speedup,
        per_token_s=base.per_token_s / speedup,
        per_kv_token_s=base.per_kv_token_s / speedup,
        per_decode_token_s=None
        if base.per_decode_token_s is None
        else base.per_decode_token_s / speedup,
    )


def _v(a: dict[str, Assumption], name: str) -> float:
    value = a[name].value
    if value is None:
        raise PlanInputError(f"{a[name].flag}: {a[name].source}; give it")
    return value


def engine_kv_tokens(a: dict[str, Assumption], shape: DecoderShape, cfg: Any) -> int:
    """KV tokens one engine holds: vLLM's CPU KV space, or what a GPU's memory leaves after
    the weights and activations."""
    r = cfg.rollout
    per_token = shape.kv_bytes_per_token * DTYPE_BYTES[cfg.model.dtype] // 2
    if cfg.cluster.accelerator == "cpu":
        return int(r.kv_cache_space_gb * 2**30 / per_token)
    tp = r.tensor_parallel_size
    per_gpu = (
        _v(a, "gpu_memory_gb") * 1e9 * r.gpu_memory_utilization
        - 2 * shape.weight_params / tp
        - _v(a, "engine_activation_gb") * 1e9
    )
    return max(0, int(per_gpu * tp / per_token))


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


def predict(
    cfg: Any,
    stage: int,
    a: dict[str, Assumption],
    shape: DecoderShape,
    rows: list[TraceRow],
    cost: StepCostModel,
    gpus: int,
) -> Breakdown:
    """The step breakdown (pure apart from the simulation it runs)."""
    st = cfg.stages[stage]
    kv = engine_kv_tokens(a, shape, cfg)
    tool_tokens = int(_v(a, "tool_response_tokens"))
    sim = simulate(
        rows,
        SimSettings(
            num_engines=cfg.rollout.num_engines,
            kv_tokens=kv,
            max_response_tokens=st.max_response_tokens,
            default_tool_tokens=tool_tokens,
            cost=cost,
        ),
        SchedulerSettings(policy=cfg.scheduler.policy),
    )
    tools = [sum(t.tool_latency_s or 0.0 for t in r.turns) for r in rows]
    verif_per_s = _v(a, "reward_verif_per_s_per_core")
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
    return flops / (gpus * peak * 1e12 * _v(a, "learner_mfu"))


def _sync_s(cfg: Any, a: dict[str, Assumption], shape: DecoderShape) -> float | None:
    """The learner's weights into every engine GPU (CUDA-IPC) plus the engines' wake-up; not
    modelled on CPU (file buckets through /dev/shm)."""
    hbm = a["hbm_tb_per_s"].value
    if cfg.cluster.accelerator == "cpu" or hbm is None:
        return None
    copy_bw = hbm * 1e12 * _v(a, "device_copy_share_of_hbm") * _v(a, "ipc_share_of_copy")
    tp = cfg.rollout.tensor_parallel_size
    return 2 * shape.weight_params / tp / copy_bw + _v(a, "wake_s")


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
    """Prompt, generated and tool-response tokens of one trajectory (what the learner trains)."""
    tool = sum(t.tool_tokens or tool_tokens for t in row.turns if t.tool_latency_s is not None)
    return row.prompt_tokens + row.response_tokens + tool


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m perf.plan", description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="a run config (YAML)")
    p.add_argument("--stage", type=int, default=0, help="which stage's budget (0-based)")
    p.add_argument("--cost", help="a measured step cost (perf.engine_cost or perf.step_cost)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--trace", help="a recorded trace (JSONL) instead of the paper-like one")
    src.add_argument(
        "--rollouts",
        help="a run's saved rollouts (rstar2 train --save-rollouts DIR): each step's "
        "trajectories as its trace, the figures their mean",
    )
    p.add_argument(
        "--run", help="with --rollouts: that run's folder; prints its measured time_rollout_s"
    )
    p.add_argument("--seed", type=int, default=0)
    add_flags(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from rstar2.config import ConfigError
    from rstar2.config_io import load_config
    from scheduler.trace import TraceError

    try:
        if args.run and not args.rollouts:
            raise PlanInputError("--run: only with --rollouts (the steps to compare)")
        cfg = load_config(args.config)
        if not 0 <= args.stage < len(cfg.stages):
            raise ConfigError("stages", f"--stage {args.stage}: the config has {len(cfg.stages)}")
        shape = model_shape(cfg)
        a = assumptions(args, cfg.cluster.accelerator)
        measured = load_cost(args.cost) if args.cost else None
        cost = engine_cost(a, shape, cfg.rollout.tensor_parallel_size, measured)
        steps = _traces(cfg, args, a)
        gpus = cfg.cluster.num_nodes * cfg.cluster.gpus_per_node
        per_step = {n: predict(cfg, args.stage, a, shape, rows, cost, gpus) for n, rows in steps}
        measured_rollout = measured_rollout_s(args.run) if args.run else None
    except (ConfigError, TraceError, PlanInputError, CostFileError, OSError) as exc:
        print(f"perf.plan: {exc}", file=sys.stderr)
        return 2
    b = mean_breakdown(list(per_step.values()))
    _print(cfg, args, a, b, cost, gpus)
    if measured_rollout is not None:
        _print_check(per_step, measured_rollout, args.run)
    _print_json(b)
    return 0


def _traces(
    cfg: Any, args: argparse.Namespace, a: dict[str, Assumption]
) -> list[tuple[int, list[TraceRow]]]:
    """(step, trajectories) to simulate: a saved run's steps, a trace file, or paper-like."""
    if args.rollouts:
        return sorted(load_run_traces(args.rollouts).items())
    if args.trace:
        return [(0, load_trace(args.trace))]
    st = cfg.stages[args.stage]
    rows = paper_like(
        num_prompts=cfg.data.rollout_batch_num_prompts,
        samples_per_prompt=cfg.rollout.num_samples_per_prompt,
        max_response_tokens=st.max_response_tokens,
        median_response_tokens=int(_v(a, "median_response_tokens")),
        max_turns=st.max_turns,
        tool_latency_s=_v(a, "tool_latency_s"),
        tool_tokens=int(_v(a, "tool_response_tokens")),
        seed=args.seed,
    )
    return [(0, rows)]


def _print(
    cfg: Any,
    args: argparse.Namespace,
    a: dict[str, Assumption],
    b: Breakdown,
    cost: StepCostModel,
    gpus: int,
) -> None:
    st = cfg.stages[args.stage]
    batch = f"{cfg.data.rollout_batch_num_prompts} x {cfg.rollout.num_samples_per_prompt}"
    tp = cfg.rollout.tensor_parallel_size
    where = f"{gpus} GPUs" if cfg.cluster.accelerator != "cpu" else "CPU"
    print(
        f"{cfg.name}, stage {st.name}: {b.trajectories} trajectories ({batch}), "
        f"{b.engines} engines of TP {tp}, {where}, policy {cfg.scheduler.policy}"
    )
    source = f"measured: {args.cost}" if args.cost else "datasheet model"
    trace = (
        f"saved rollouts {args.rollouts} (mean over steps)"
        if args.rollouts
        else (args.trace or "paper-like trace")
    )
    print(
        f"engine: {b.kv_tokens:,} KV tokens; step cost {cost.step_base_s * 1e3:.2f} ms + "
        f"{cost.per_token_s * 1e6:.2f} us/token + {cost.per_kv_token_s * 1e9:.3f} ns/KV token "
        f"({source}, over TP {tp}); trajectories: {trace}"
    )
    rows = [
        ("rollout (simulated makespan)", b.rollout_s),
        ("  tool time per trajectory (inside rollout)", b.tool_per_trajectory_s),
        ("reward (overlaps rollout; CPU time / cores)", b.reward_s),
        ("  reward tail after the last trajectory", b.reward_tail_s),
        (f"learner ({b.learner_tokens:,} tokens)", b.learner_s),
        ("weight sync + engine wake", b.sync_s),
        ("one RL step", b.step_s),
    ]
    for label, seconds in rows:
        value = f"{seconds:>9.1f} s" if seconds is not None else "  not modelled here"
        print(f"{label:<46} {value}")
    ratio = b.steps_per_week / PAPER_STEPS_PER_WEEK
    paper = f"paper: {PAPER_STEPS_PER_WEEK} on 64 MI300X"
    partial = "; a lower bound: parts not modelled" if None in (b.learner_s, b.sync_s) else ""
    print(f"steps per week: {b.steps_per_week:,.0f} ({paper}; {ratio:.2f}x{partial})")
    print(
        "  not in the model: evaluation, checkpoints, restarts, stragglers beyond the trace, "
        "the longer budgets of later stages (--stage)"
    )
    print("\nassumptions (change each with its flag):")
    for item in a.values():
        value = f"{item.value:>10g}" if item.value is not None else f"{'unset':>10}"
        print(f"  {item.flag:<32} {value} {item.unit:<8} {item.source}")


def _print_check(per_step: dict[int, Breakdown], measured: dict[int, float], run: str) -> None:
    """Predicted against measured rollout time, step by step, for the steps both have."""
    both = sorted(set(per_step) & set(measured))
    if not both:
        print(f"\n{run}: no step of the saved rollouts in its metrics.jsonl")
        return
    print(f"\nrollout, predicted vs measured ({run}/metrics.jsonl time_rollout_s):")
    print(f"  {'step':>5} {'predicted':>10} {'measured':>10} {'ratio':>7}")
    for n in both:
        p, m = per_step[n].rollout_s, measured[n]
        print(f"  {n:>5} {p:>9.2f}s {m:>9.2f}s {p / m:>7.2f}")
    p = statistics.fmean(per_step[n].rollout_s for n in both)
    m = statistics.fmean(measured[n] for n in both)
    print(f"  {'mean':>5} {p:>9.2f}s {m:>9.2f}s {p / m:>7.2f}  ({len(both)} steps)")


def _print_json(b: Breakdown) -> None:
    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 2)

    print(
        json.dumps(
            {
                "step_s": r(b.step_s),
                "rollout_s": r(b.rollout_s),
                "learner_s": r(b.learner_s),
                "sync_s": r(b.sync_s),
                "reward_s": r(b.reward_s),
                "steps_per_week": round(b.steps_per_week, 1),
            }
        )
    )


if __name__ == "__main__":
    raise SystemExit(main())
