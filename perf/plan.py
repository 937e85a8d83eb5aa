"""Capacity plan: the predicted time of one RL step of a recipe on its cluster, by part.

    python -m perf.plan --config configs/rstar2_14b_mi300x.yaml [--stage N] [--cost FILE]
                        [--trace FILE] [--FLAG VALUE ...]

- rollout: the scheduling simulator (:mod:`scheduler.sim`) with the config's engines, policy and
  stage budget on a paper-like trace (or ``--trace``), each engine running at most
  ``--engine-max-num-seqs`` requests at once (vLLM's ``max_num_seqs``) at a step cost from the
  MI300X datasheet model or a measured ``--cost`` file scaled from the TP it was measured at (its
  ``tensor_parallel_size``; 1 when it has none, or ``--cost-tp``) to the engine's;
- tool time: inside the rollout (trajectories wait on calls while others generate); shown as
  the mean per trajectory and its share of the critical path;
- reward: verification CPU time over the reward cores (it overlaps the rollout; the tail after
  the last trajectory is one verification);
- learner: (prompt + response) tokens of the kept trajectories x training FLOPs per token (and
  one forward more when old log-probs are recomputed), at an MFU of the GPUs' bf16 peak;
- weight sync: the learner's weights into every engine GPU (colocated: CUDA-IPC at the measured
  share of a device copy) plus the engines' wake-up.

Weight and KV bytes follow the config's ``model.dtype`` (bf16/fp16: 2 bytes, fp32: 4, fp8: 1).

Every assumed number is printed with its source and the flag that changes it. Steps per week
are set next to the paper's: 510 RL steps in about a week on 64 MI300X.

This module is the command line (flags, inputs, traces); the engine model is
:mod:`perf.plan_engine`, the step breakdown :mod:`perf.plan_step`, the printout
:mod:`perf.plan_report`, the assumed numbers :mod:`perf.plan_inputs`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from perf.plan_check import load_run_traces, measured_rollout_s
from perf.plan_engine import cost_tp, dtype_bytes, engine_cost
from perf.plan_inputs import (
    Assumption,
    PlanInputError,
    add_flags,
    assumptions,
    model_shape,
    required,
)
from perf.plan_report import print_breakdown, print_check, print_json
from perf.plan_step import mean_breakdown, predict
from perf.rollout_sim import CostFileError, load_cost
from scheduler.core import SchedulerError
from scheduler.trace import TraceRow, load_trace, paper_like


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m perf.plan", description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="a run config (YAML)")
    p.add_argument("--stage", type=int, default=0, help="which stage's budget (0-based)")
    p.add_argument("--cost", help="a measured step cost (perf.engine_cost or perf.step_cost)")
    p.add_argument(
        "--cost-tp",
        type=int,
        help="the TP the --cost file was measured at (default: its tensor_parallel_size, else 1)",
    )
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
        if args.cost_tp is not None and not args.cost:
            raise PlanInputError("--cost-tp: only with --cost (the TP that file was measured at)")
        measured = load_cost(args.cost) if args.cost else None
        if args.cost:
            a["cost_tp"] = cost_tp(args.cost, args.cost_tp)
        cost = engine_cost(
            a,
            shape,
            cfg.rollout.tensor_parallel_size,
            measured,
            measured_tp=int(a["cost_tp"].value or 1) if args.cost else 1,
            nbytes=dtype_bytes(cfg),
        )
        steps = _traces(cfg, args, a)
        gpus = cfg.cluster.num_nodes * cfg.cluster.gpus_per_node
        per_step = {n: predict(cfg, args.stage, a, shape, rows, cost, gpus) for n, rows in steps}
        measured_rollout = measured_rollout_s(args.run) if args.run else None
    except (ConfigError, TraceError, PlanInputError, CostFileError, OSError) as exc:
        print(f"perf.plan: {exc}", file=sys.stderr)
        return 2
    except SchedulerError as exc:
        print(
            f"perf.plan: the rollout simulation refused the inputs: {exc}; give the engines "
            "more KV space (rollout.gpu_memory_utilization or tensor_parallel_size, on CPU "
            "rollout.kv_cache_space_gb) or lower the stage's max_response_tokens",
            file=sys.stderr,
        )
        return 2
    b = mean_breakdown(list(per_step.values()))
    print_breakdown(cfg, args, a, b, cost, gpus)
    if measured_rollout is not None:
        print_check(per_step, measured_rollout, args.run)
    print_json(b)
    return 0


def _traces(
    cfg: Any, args: argparse.Namespace, a: dict[str, Assumption]
) -> list[tuple[int, list[TraceRow]]]:
    """(step, trajectories) to simulate: a saved run's steps, a trace file, or paper-like."""
    if args.rollouts:
        steps, skipped = load_run_traces(args.rollouts)
        if skipped:
            print(
                f"perf.plan: note: {skipped} saved trajectories with no sampled tokens skipped",
                file=sys.stderr,
            )
        return sorted(steps.items())
    if args.trace:
        return [(0, load_trace(args.trace))]
    st = cfg.stages[args.stage]
    rows = paper_like(
        num_prompts=cfg.data.rollout_batch_num_prompts,
        samples_per_prompt=cfg.rollout.num_samples_per_prompt,
        max_response_tokens=st.max_response_tokens,
        median_response_tokens=int(required(a, "median_response_tokens")),
        max_turns=st.max_turns,
        tool_latency_s=required(a, "tool_latency_s"),
        tool_tokens=int(required(a, "tool_response_tokens")),
        seed=args.seed,
    )
    return [(0, rows)]


if __name__ == "__main__":
    raise SystemExit(main())
