"""The benchmark suite: which benchmarks run, with which arguments, and the figures each yields.

Every benchmark is a ``python -m perf.<module>`` script that prints a table and, last, one JSON
line; the suite runs each in its own process (one benchmark's threads, engines or environment
never leak into the next) and turns its JSON into :class:`Figure` values here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from perf.figures import Figure, paired_ratio, ratio


@dataclass(frozen=True)
class Bench:
    name: str
    module: str
    full: tuple[str, ...]
    quick: tuple[str, ...] | None  # None: only in the full suite
    figures: Callable[[dict[str, Any]], list[Figure]]
    gpu: bool = False


def _reward(r: dict[str, Any]) -> list[Figure]:
    return [
        Figure("reward.median_score", r["median_score_ms"], "ms", "lower"),
        Figure("reward.cold_verif_per_core", r["cold_verif_per_s_per_core"], "1/s", "higher"),
        paired_ratio(
            "reward.cold_per_core_vs_math_verify",
            r.get("round_cold_verif_per_s_per_core") or [r["cold_verif_per_s_per_core"]],
            r.get("round_baseline_verif_per_s") or [r["baseline_verif_per_s"]],
            "higher",
        ),
    ]


def _sandbox(r: dict[str, Any]) -> list[Figure]:
    out = []
    rows = r["rows"]
    for key, row in rows.items():
        system, workload, conc = key.split("/")
        if system == "baseline":
            continue
        name = f"sandbox.{system}.{workload}.{conc}"
        out.append(Figure(f"{name}.p50", row["p50_ms"], "ms", "lower"))
        out.append(Figure(f"{name}.throughput", row["throughput_per_s"], "1/s", "higher"))
        base = rows.get(f"baseline/{workload}/{conc}")
        if base:
            out.append(
                paired_ratio(f"{name}.throughput_vs_python3", _rounds(row), _rounds(base), "higher")
            )
    return out


def _rounds(row: dict[str, Any]) -> list[float]:
    """A sandbox row's per-round throughputs (one round in files from before rounds)."""
    return row.get("round_throughput_per_s") or [row["throughput_per_s"]]


def _roc(r: dict[str, Any]) -> list[Figure]:
    return [
        Figure("roc.select_and_advantages", r["select_and_advantages_ms"], "ms", "lower"),
        Figure("roc.loss_and_backward", r["loss_and_backward_ms"], "ms", "lower"),
    ]


def _scheduler_decision(r: dict[str, Any]) -> list[Figure]:
    policies = r["policies"]
    out = [
        Figure(f"scheduler.decision.{name}", p["decision_mean_us"], "us", "lower")
        for name, p in policies.items()
    ]
    reference = policies["round_robin"]
    for name in ("kv_capacity", "kv_affinity"):
        figure = f"scheduler.cycle.{name}_vs_round_robin"
        if "repeat_cycles_s" in policies[name]:
            # repeat j of both policies replayed the same events back to back
            rounds = policies[name]["repeat_cycles_s"], reference["repeat_cycles_s"]
            out.append(paired_ratio(figure, *rounds, "lower"))
        else:  # a results file from before the repeats: the whole replays' means
            value = policies[name]["cycle_mean_us"]
            out.append(ratio(figure, value, reference["cycle_mean_us"], "lower"))
    return out


def _rollout_sim(r: dict[str, Any]) -> list[Figure]:
    out = []
    for name, value in r["makespan_vs_lower_bound"].items():
        out.append(
            Figure(f"rollout_sim.{name}.makespan_vs_lower_bound", value, "x", "lower", "ratio")
        )
    for name, value in r.get("makespan_vs_round_robin", {}).items():
        if name != "round_robin":
            out.append(
                Figure(f"rollout_sim.{name}.makespan_vs_round_robin", value, "x", "lower", "ratio")
            )
    return out


def _sim_check(r: dict[str, Any]) -> list[Figure]:
    """Pass/fail figures (a 1 that becomes 0, or a 0 that becomes 1, is flagged); the
    per-policy predicted/measured makespans are in the benchmark's own JSON."""
    within = float(r["within_tolerance"])
    return [
        Figure("sim_check.makespans_within_20pct", within, "bool", "higher", "ratio"),
        Figure("sim_check.misordered_pairs", len(r["misordered"]), "pairs", "lower", "ratio"),
    ]


def _learner(r: dict[str, Any]) -> list[Figure]:
    return [Figure(f"learner.{r['device']}.tokens_per_s", r["tokens_per_s"], "tok/s", "higher")]


def _rollout(r: dict[str, Any]) -> list[Figure]:
    return [
        Figure("rollout.trajectories_per_s", r["trajectories_per_s"], "1/s", "higher"),
        Figure("rollout.tokens_per_s", r["tokens_per_s"], "tok/s", "higher"),
        Figure(
            "rollout.tool_waits_overlapping_generation",
            r["tool_waits_overlapping_generation"],
            "frac",
            "higher",
            "ratio",
        ),
    ]


def _learner_backends(r: dict[str, Any]) -> list[Figure]:
    # a row that failed (an OOM) is recorded with its "error" and has no figures
    results = {name: row for name, row in r["results"].items() if "error" not in row}
    out = []
    for name, row in results.items():
        out.append(
            Figure(f"learner_gpu.{name}.tokens_per_s", row["tokens_per_s"], "tok/s", "higher")
        )
        out.append(Figure(f"learner_gpu.{name}.mfu", row["mfu"], "frac", "higher"))
    reference = results.get("hf_bf16")
    if reference:
        for name in ("torch", "megatron"):
            if name in results:
                out.append(
                    ratio(
                        f"learner_gpu.{name}_vs_hf_bf16",
                        results[name]["tokens_per_s"],
                        reference["tokens_per_s"],
                        "higher",
                    )
                )
    return out


def _step_cost(r: dict[str, Any]) -> list[Figure]:
    return [
        Figure("step_cost.prefill_tokens_per_s", r["prefill_tokens_per_s"], "tok/s", "higher"),
        Figure("step_cost.kv_read", r["kv_read_tb_per_s"], "TB/s", "higher"),
    ]


def _weight_transfer(r: dict[str, Any]) -> list[Figure]:
    return [
        Figure("weight_transfer.ipc", r["shared_gb_per_s"], "GB/s", "higher"),
        Figure("weight_transfer.device_copy", r["device_copy_gb_per_s"], "GB/s", "higher"),
        ratio(
            "weight_transfer.ipc_vs_device_copy",
            r["shared_gb_per_s"],
            r["device_copy_gb_per_s"],
            "higher",
        ),
    ]


CPU_SUITE: tuple[Bench, ...] = (
    Bench("reward", "perf.reward", (), ("--pairs", "200"), _reward),
    Bench("roc", "perf.roc", (), ("--prompts", "128", "--repeats", "3"), _roc),
    Bench(
        "scheduler_decision",
        "perf.scheduler_decision",
        (),
        ("--live", "2000", "--events", "4000"),
        _scheduler_decision,
    ),
    Bench(
        "rollout_sim", "perf.rollout_sim", (), ("--prompts", "64", "--samples", "8"), _rollout_sim
    ),
    Bench(
        "sandbox",
        "perf.sandbox",
        (),
        ("--calls", "100", "--workloads", "print,sympy", "--concurrency", "1,8"),
        _sandbox,
    ),
    Bench("learner", "perf.learner", (), ("--steps", "3", "--warmup", "1"), _learner),
    Bench("rollout", "perf.rollout", (), None, _rollout),
    Bench("sim_check", "perf.sim_check", (), None, _sim_check),
)
GPU_SUITE: tuple[Bench, ...] = (
    Bench("learner_backends", "perf.learner_backends", (), None, _learner_backends, gpu=True),
    Bench("step_cost", "perf.step_cost", ("--device", "cuda"), None, _step_cost, gpu=True),
    Bench("weight_transfer_ipc", "perf.weight_transfer_ipc", (), None, _weight_transfer, gpu=True),
)
ALL: tuple[Bench, ...] = CPU_SUITE + GPU_SUITE


def select(gpu: bool, quick: bool, only: list[str] | None) -> list[Bench]:
    """The benchmarks a run takes: the CPU suite, or the GPU one; ``only`` narrows either."""
    suite = GPU_SUITE if gpu else CPU_SUITE
    if only:
        known = {b.name for b in suite}
        unknown = sorted(set(only) - known)
        if unknown:
            which = "GPU suite (--gpu)" if gpu else "CPU suite (GPU ones need --gpu)"
            raise ValueError(
                f"unknown benchmark(s) {unknown} in the {which}; known: {sorted(known)}"
            )
        return [b for b in suite if b.name in only]  # quick arguments where they have them
    return [b for b in suite if not quick or b.quick is not None]
