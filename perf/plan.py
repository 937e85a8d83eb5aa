"""Capacity plan: the predicted time of one RL step of a recipe on its cluster, by part.

    python -m perf.plan --config configs/rstar2_14b_mi300x.yaml [--stage N] [--cost FILE]
                        [--trace FILE] [--FLAG VALUE ...]

- rollout: the scheduling simulator (:mod:`scheduler.sim`) with the config's engines, policy and
  stage budget on a paper-like trace (or ``--trace``), each engine's step cost from the MI300X
  datasheet model or a measured ``--cost`` file scaled from the TP it was measured at (its
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
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path
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
from perf.shapes import DTYPE_BYTES, DecoderShape
from scheduler.core import SchedulerError, SchedulerSettings
from scheduler.sim import SimSettings, StepCostModel, simulate
from scheduler.trace import TraceRow, load_trace, paper_like

WEEK_S = 7 * 24 * 3600
PAPER_STEPS_PER_WEEK = 510


def dtype_bytes(cfg: Any) -> int:
    """Bytes per weight (and KV element: vLLM's KV cache follows the model) of the config's
    ``model.dtype``."""
    dtype = str(cfg.model.dtype)
    if dtype not in DTYPE_BYTES:
        raise PlanInputError(f"model.dtype: {dtype!r} has no known size ({', '.join(DTYPE_BYTES)})")
    return DTYPE_BYTES[dtype]


def _kv_bytes_per_token(shape: DecoderShape, nbytes: int) -> int:
    return shape.kv_bytes_per_token * nbytes // 2  # the shape counts bf16 K and V


def engine_cost(
    a: dict[str, Assumption],
    shape: DecoderShape,
    tp: int,
    measured: StepCostModel | None,
    *,
    measured_tp: int = 1,
    nbytes: int = 2,
) -> StepCostModel:
    """One engine's step cost over ``tp`` GPUs: a model measured at ``measured_tp`` GPUs,
    scaled by the speed-up of ``tp`` over ``measured_tp`` (``tp x --tp-efficiency`` over
    one GPU each), or the datasheet's single-GPU model at ``nbytes`` per weight and KV element
    scaled from one GPU."""
    eff = _v(a, "tp_efficiency")

    def speedup(n: int) -> float:
        return n * eff if n > 1 else 1.0

    if measured is not None:
        base = measured
        scale = speedup(measured_tp) / speedup(tp)
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
            step_base_s=shape.weight_bytes(nbytes) / hbm,  # the weights, read once per step
            per_token_s=2 * shape.matmul_params / (peak * 1e12 * _v(a, "engine_prefill_mfu")),
            per_kv_token_s=_kv_bytes_per_token(shape, nbytes) / hbm,
        )
        scale = 1 / speedup(tp)
    return replace(
        base,
        step_base_s=base.step_base_s * scale,
        per_token_s=base.per_token_s * scale,
        per_kv_token_s=base.per_kv_token_s * scale,
        per_decode_token_s=None
        if base.per_decode_token_s is None
        else base.per_decode_token_s * scale,
    )


def cost_tp(path: str, given: int | None) -> Assumption:
    """The TP a ``--cost`` file was measured at: ``--cost-tp``, else the file's
    ``tensor_parallel_size`` (perf.engine_cost records it; perf.step_cost times one GPU),
    else 1, said so (a file from before the field was recorded)."""
    name, unit, flag = "cost_tp", "GPUs", "--cost-tp"
    if given is not None:
        if given < 1:
            raise PlanInputError("--cost-tp: must be a positive number of GPUs")
        return Assumption(name, given, unit, f"set by {flag} (the TP {path} was measured at)", flag)
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CostFileError(f"--cost {path}: {exc}") from exc
    meta = data if isinstance(data, dict) else {}
    tp = meta.get("tensor_parallel_size")
    if tp is None:
        source = f"assumed: {path} records no tensor_parallel_size (an older file): TP 1"
        return Assumption(name, 1, unit, source, flag)
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise CostFileError(f"--cost {path}: tensor_parallel_size must be a positive integer")
    what = ", ".join(f"{k} {meta[k]}" for k in ("dtype", "model") if meta.get(k))
    return Assumption(
        name, tp, unit, f"{path}: measured at TP {tp}" + (f" ({what})" if what else ""), flag
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
    nbytes = dtype_bytes(cfg)
    per_token = _kv_bytes_per_token(shape, nbytes)
    if cfg.cluster.accelerator == "cpu":
        return int(r.kv_cache_space_gb * 2**30 / per_token)
    tp = r.tensor_parallel_size
    per_gpu = (
        _v(a, "gpu_memory_gb") * 1e9 * r.gpu_memory_utilization
        - shape.weight_bytes(nbytes) / tp
        - _v(a, "engine_activation_gb") * 1e9
    )
    return max(0, int(per_gpu * tp / per_token))


def _no_kv_space(a: dict[str, Assumption], shape: DecoderShape, cfg: Any) -> PlanInputError:
    """What to change when an engine has no KV space left."""
    r = cfg.rollout
    if cfg.cluster.accelerator == "cpu":
        return PlanInputError(
            f"rollout.kv_cache_space_gb: {r.kv_cache_space_gb} GB holds no KV token; raise it"
        )
    weights = shape.weight_bytes(dtype_bytes(cfg)) / r.tensor_parallel_size / 1e9
    return PlanInputError(
        f"engine KV: no GPU memory left for the KV cache ({weights:.1f} GB of "
        f"{cfg.model.dtype} weights per GPU + --engine-activation-gb "
        f"{_v(a, 'engine_activation_gb'):g} exceed --gpu-memory-gb "
        f"{_v(a, 'gpu_memory_gb'):g} x rollout.gpu_memory_utilization "
        f"{r.gpu_memory_utilization}); raise rollout.tensor_parallel_size or "
        "rollout.gpu_memory_utilization, or lower --engine-activation-gb"
    )


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
    if kv <= 0:
        raise _no_kv_space(a, shape, cfg)
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
    return shape.weight_bytes(dtype_bytes(cfg)) / tp / copy_bw + _v(a, "wake_s")


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
        f"engine: {b.kv_tokens:,} KV tokens; step cost {cost.step_base_s * 1e3:.2f} ms + "
        f"{cost.per_token_s * 1e6:.2f} us/token + {cost.per_kv_token_s * 1e9:.3f} ns/KV token "
        f"({source}); trajectories: {trace}"
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
