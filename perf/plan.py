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

from perf.shapes import DecoderShape
from scheduler.core import SchedulerSettings
from scheduler.sim import SimSettings, StepCostModel, simulate
from scheduler.trace import TraceRow, load_trace, paper_like

WEEK_S = 7 * 24 * 3600
PAPER_STEPS_PER_WEEK = 510


# published configs (config.json of each model on its hub page)
SHAPES = {
    "Qwen/Qwen3-14B": DecoderShape(5120, 17408, 40, 40, 8, 128, 151936),
    "Qwen/Qwen3-8B": DecoderShape(4096, 12288, 36, 32, 8, 128, 151936),
    "Qwen/Qwen3-1.7B": DecoderShape(2048, 6144, 28, 16, 8, 128, 151936),
    "Qwen/Qwen2.5-14B": DecoderShape(5120, 13824, 48, 40, 8, 128, 152064),
}


@dataclass(frozen=True)
class Assumption:
    name: str
    value: float
    unit: str
    source: str
    flag: str


# name -> (default, unit, source); each has a --flag of its name with "-" for "_"
H200_RESULTS = "perf/results/nvidia-h200-*.json"
DEFAULTS: dict[str, tuple[float, str, str]] = {
    "peak_tflops": (1307.4, "TFLOP/s", "MI300X datasheet: dense bf16 matrix peak"),
    "hbm_tb_per_s": (5.3, "TB/s", "MI300X datasheet: HBM3 peak bandwidth"),
    "gpu_memory_gb": (192.0, "GB", "MI300X datasheet"),
    "engine_prefill_mfu": (
        0.63,
        "frac",
        f"prefill GEMMs, Qwen2.5-14B layers on one H200 (step_cost in {H200_RESULTS})",
    ),
    "hbm_efficiency": (
        0.93,
        "frac",
        f"KV and weight reads, share of HBM peak on one H200 (step_cost in {H200_RESULTS})",
    ),
    "tp_efficiency": (
        0.8,
        "frac",
        "assumed: share of the TP-width speed-up an engine keeps (all-reduces per layer)",
    ),
    "engine_activation_gb": (
        15.0,
        "GB",
        "assumed: vLLM activation and graph memory per GPU (scheduler/sim.py)",
    ),
    "median_response_tokens": (
        3072.0,
        "tokens",
        "scheduler/trace.py paper_like: the paper's response lengths, median ~3K",
    ),
    "tool_latency_s": (0.3, "s", "scheduler/trace.py paper_like: ~0.3 s per tool call"),
    "tool_response_tokens": (
        128.0,
        "tokens",
        "scheduler/trace.py paper_like and scheduler/sim.py: a tool response's tokens",
    ),
    "reward_verif_per_s_per_core": (
        300.0,
        "1/s",
        "perf.reward: cold verifications per core, 2-core CI machine (~300-330)",
    ),
    "reward_cores": (64.0, "cores", "assumed: one node's CPU cores for the reward"),
    "learner_mfu": (
        0.43,
        "frac",
        f"megatron learner, Qwen3-1.7B shape, one H200 ({H200_RESULTS}); assumed at 14B",
    ),
    "ipc_share_of_copy": (
        0.87,
        "frac",
        f"CUDA-IPC weight transfer / device copy, one H200 ({H200_RESULTS})",
    ),
    "device_copy_share_of_hbm": (
        0.44,
        "frac",
        "H200: a 2.1 TB/s device copy of its 4.8 TB/s HBM (each byte read and written)",
    ),
    "wake_s": (5.0, "s", "assumed: vLLM wake from sleep level 2 (weights + KV cache) per step"),
}


def _assumptions(args: argparse.Namespace) -> dict[str, Assumption]:
    out = {}
    for name, (default, unit, source) in DEFAULTS.items():
        value = getattr(args, name)
        flag = "--" + name.replace("_", "-")
        if value != default:
            source = f"set by {flag} (default {default}: {source})"
        out[name] = Assumption(name, value, unit, source, flag)
    return out


def engine_cost(
    a: dict[str, Assumption], shape: DecoderShape, tp: int, measured: StepCostModel | None
) -> StepCostModel:
    """One engine's step cost: a measured single-GPU model or the datasheet, over ``tp`` GPUs."""
    speedup = tp * a["tp_efficiency"].value if tp > 1 else 1.0
    if measured is not None:
        base = measured
    else:
        hbm = a["hbm_tb_per_s"].value * 1e12 * a["hbm_efficiency"].value
        base = StepCostModel(
            step_base_s=2 * shape.weight_params / hbm,  # the weights, read once per step
            per_token_s=2
            * shape.matmul_params
            / (a["peak_tflops"].value * 1e12 * a["engine_prefill_mfu"].value),
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


def engine_kv_tokens(
    a: dict[str, Assumption], shape: DecoderShape, tp: int, utilization: float
) -> int:
    per_gpu = (
        a["gpu_memory_gb"].value * 1e9 * utilization
        - 2 * shape.weight_params / tp
        - a["engine_activation_gb"].value * 1e9
    )
    return max(0, int(per_gpu * tp / shape.kv_bytes_per_token))


@dataclass(frozen=True)
class Breakdown:
    rollout_s: float
    tool_per_trajectory_s: float
    reward_s: float
    reward_tail_s: float
    learner_s: float
    learner_tokens: int
    sync_s: float
    trajectories: int
    engines: int
    kv_tokens: int

    @property
    def step_s(self) -> float:
        return self.rollout_s + self.reward_tail_s + self.learner_s + self.sync_s

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
    tp = cfg.rollout.tensor_parallel_size
    kv = engine_kv_tokens(a, shape, tp, cfg.rollout.gpu_memory_utilization)
    sim = simulate(
        rows,
        SimSettings(
            num_engines=cfg.rollout.num_engines,
            kv_tokens=kv,
            max_response_tokens=st.max_response_tokens,
            default_tool_tokens=int(a["tool_response_tokens"].value),
            cost=cost,
        ),
        SchedulerSettings(policy=cfg.scheduler.policy),
    )
    tools = [sum(t.tool_latency_s or 0.0 for t in r.turns) for r in rows]
    reward_s = len(rows) / (a["reward_verif_per_s_per_core"].value * a["reward_cores"].value)
    aug = cfg.augmentation
    per_prompt = (
        aug.down_sampling_config.down_sample_to_n
        if aug.do_down_sampling
        else cfg.rollout.num_samples_per_prompt
    )
    kept = cfg.data.rollout_batch_num_prompts * per_prompt
    tool_tokens = int(a["tool_response_tokens"].value)
    mean_tokens = statistics.fmean(_train_tokens(r, tool_tokens) for r in rows)
    tokens = int(kept * mean_tokens)
    flops = shape.train_flops_per_token(mean_tokens) * tokens
    if cfg.algorithm.recompute_old_logprobs:
        flops *= 4 / 3  # one more forward: 2 of the 6 FLOPs per parameter
    learner_s = flops / (gpus * a["peak_tflops"].value * 1e12 * a["learner_mfu"].value)
    copy_bw = (
        a["hbm_tb_per_s"].value
        * 1e12
        * a["device_copy_share_of_hbm"].value
        * a["ipc_share_of_copy"].value
    )
    sync_s = 2 * shape.weight_params / tp / copy_bw + a["wake_s"].value
    return Breakdown(
        sim.makespan_s,
        statistics.fmean(tools),
        reward_s,
        1 / a["reward_verif_per_s_per_core"].value,
        learner_s,
        tokens,
        sync_s,
        len(rows),
        cfg.rollout.num_engines,
        kv,
    )


def _train_tokens(row: TraceRow, tool_tokens: int) -> int:
    """Prompt, generated and tool-response tokens of one trajectory (what the learner trains)."""
    tool = sum(t.tool_tokens or tool_tokens for t in row.turns if t.tool_latency_s is not None)
    return row.prompt_tokens + row.response_tokens + tool


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m perf.plan", description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="a run config (YAML)")
    p.add_argument("--stage", type=int, default=0, help="which stage's budget (0-based)")
    p.add_argument("--cost", help="a measured single-GPU step cost (perf.step_cost --out FILE)")
    p.add_argument("--trace", help="a recorded trace (JSONL) instead of the paper-like one")
    p.add_argument("--seed", type=int, default=0)
    for name, (default, unit, _source) in DEFAULTS.items():
        p.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=float,
            default=default,
            help=f"{unit} (default {default})",
        )
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from rstar2.config import ConfigError
    from rstar2.config_io import load_config
    from scheduler.trace import TraceError

    try:
        cfg = load_config(args.config)
        if not 0 <= args.stage < len(cfg.stages):
            raise ConfigError("stages", f"--stage {args.stage}: the config has {len(cfg.stages)}")
        shape = SHAPES.get(cfg.model.path)
        if shape is None:
            known = ", ".join(sorted(SHAPES))
            raise ConfigError("model.path", f"no known shape for {cfg.model.path!r} ({known})")
        st = cfg.stages[args.stage]
        a = _assumptions(args)
        rows = (
            load_trace(args.trace)
            if args.trace
            else paper_like(
                num_prompts=cfg.data.rollout_batch_num_prompts,
                samples_per_prompt=cfg.rollout.num_samples_per_prompt,
                max_response_tokens=st.max_response_tokens,
                median_response_tokens=int(a["median_response_tokens"].value),
                max_turns=st.max_turns,
                tool_latency_s=a["tool_latency_s"].value,
                tool_tokens=int(a["tool_response_tokens"].value),
                seed=args.seed,
            )
        )
    except (ConfigError, TraceError, OSError) as exc:
        print(f"perf.plan: {exc}", file=sys.stderr)
        return 2
    measured = None
    if args.cost:
        from perf.rollout_sim import CostFileError, load_cost

        try:
            measured = load_cost(args.cost)
        except CostFileError as exc:
            print(f"perf.plan: {exc}", file=sys.stderr)
            return 2
    gpus = cfg.cluster.num_nodes * cfg.cluster.gpus_per_node
    cost = engine_cost(a, shape, cfg.rollout.tensor_parallel_size, measured)
    b = predict(cfg, args.stage, a, shape, rows, cost, gpus)
    _print(cfg, args, a, b, cost, gpus)
    return 0


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
    print(
        f"{cfg.name}, stage {st.name}: {b.trajectories} trajectories ({batch}), "
        f"{b.engines} engines of TP {tp}, {gpus} GPUs, policy {cfg.scheduler.policy}"
    )
    source = f"measured: {args.cost}" if args.cost else "datasheet model"
    print(
        f"engine: {b.kv_tokens:,} KV tokens; step cost {cost.step_base_s * 1e3:.2f} ms + "
        f"{cost.per_token_s * 1e6:.2f} us/token + {cost.per_kv_token_s * 1e9:.3f} ns/KV token "
        f"({source}, over TP {tp})"
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
        print(f"{label:<46} {seconds:>9.1f} s")
    ratio = b.steps_per_week / PAPER_STEPS_PER_WEEK
    paper = f"paper: {PAPER_STEPS_PER_WEEK} on 64 MI300X"
    print(f"steps per week: {b.steps_per_week:,.0f} ({paper}; {ratio:.2f}x)")
    print(
        "  not in the model: evaluation, checkpoints, restarts, stragglers beyond the trace, "
        "the longer budgets of later stages (--stage)"
    )
    print("\nassumptions (change each with its flag):")
    for item in a.values():
        print(f"  {item.flag:<32} {item.value:>10g} {item.unit:<8} {item.source}")
    print(
        json.dumps(
            {
                "step_s": round(b.step_s, 1),
                "rollout_s": round(b.rollout_s, 1),
                "learner_s": round(b.learner_s, 1),
                "sync_s": round(b.sync_s, 1),
                "reward_s": round(b.reward_s, 1),
                "steps_per_week": round(b.steps_per_week, 1),
            }
        )
    )


if __name__ == "__main__":
    raise SystemExit(main())
