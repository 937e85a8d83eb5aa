"""The plan's printed report: the step breakdown with its engine, trace and every assumption
(its source and flag), the predicted-vs-measured rollout check of a saved run, and the JSON
summary line (:mod:`perf.plan` calls them; nothing here computes the plan)."""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from perf.plan_inputs import Assumption
from perf.plan_step import Breakdown
from scheduler.sim_model import StepCostModel

PAPER_STEPS_PER_WEEK = 510


def print_breakdown(
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
    if args.cost:
        source = f"measured: {args.cost} at TP {a['cost_tp'].value:g}, scaled to TP {tp}"
    else:
        source = f"datasheet model, {cfg.model.dtype} weights, over TP {tp}"
    trace = (
        f"saved rollouts {args.rollouts} (mean over steps)"
        if args.rollouts
        else (args.trace or "paper-like trace")
    )
    print(
        f"engine: {b.kv_tokens:,} KV tokens, at most {a['engine_max_num_seqs'].value:g} "
        f"sequences a step; step cost {cost.step_base_s * 1e3:.2f} ms + "
        f"{cost.per_token_s * 1e6:.2f} us/token + {cost.per_kv_token_s * 1e9:.3f} ns/KV token "
        + (
            f"+ host {cost.host_s * 1e3:.2f} ms ({cost.host_overlap:.0%} of it under the GPU's "
            "work) "
            if cost.host_s
            else ""
        )
        + f"({source}); trajectories: {trace}"
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


def print_check(per_step: dict[int, Breakdown], measured: dict[int, float], run: str) -> None:
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


def print_json(b: Breakdown) -> None:
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
