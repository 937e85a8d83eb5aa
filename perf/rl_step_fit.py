"""The plan's GPU step inputs fitted to measured real-shape steps (:mod:`perf.rl_step_gpu`
results), so that a step at a shape it was not fitted on can be predicted before it runs.

    python -m perf.rl_step_fit --measured A.json --measured B.json [...] [--FLAG VALUE ...]

Fitted, each from the measured phases (two steps at least; more: least squares):

- learner: ``--learner-mfu`` (the FLOPs' share of peak) and ``--learner-layer-overhead-s``
  (per layer per micro-batch): time = FLOPs / (peak x MFU) + micro-batches x layers x overhead;
- weight transfer: ``--ipc-gb-per-s`` and ``--ipc-layer-s``: time = bytes / rate + layers x cost;
- ``--wake-s``: the mean of sleep, both wake-ups and the learner's cache release;
- the engine: ``--engine-step-overhead-s``, its host time per step beyond the datasheet's
  weight and KV reads and FLOPs, and ``--engine-host-overlap``, the share of it the GPU's work
  hides (a step of GPU time g takes g + overhead - overlap x min(g, overhead)), that bring the
  simulated rollouts to the measured ones (least squares of the log ratios). The rollout is
  simulated as the benchmark runs it (every request sent to its one engine at once: no
  scheduler, vLLM's own batch limit ``--engine-max-num-seqs`` and KV space). Its schedule does
  not depend on the step times (fixed-length trajectories, all sent at once), so it is
  simulated once per step and its runs of steps are re-priced for each candidate pair (and the
  fitted pair is checked against a fresh simulation). Telling the two apart needs steps whose
  GPU time per step falls on both sides of the host time.
  ``--engine-prefill-mfu`` is an input, not fitted: every measured step decodes full batches
  of 128 (vLLM's default limit) and prefills ~2% of its tokens, so their times cannot tell the
  GEMMs' efficiency from the per-step overhead (fitting both gives a negative overhead).

Prints the flags, ready for ``python -m perf.plan``, then for each step measured / predicted
with the fitted inputs for each part (rollout, learner, sync, step): with more steps than
terms these are the fit's residuals. Every other input stays as given.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from perf.plan_engine import dtype_bytes, engine_cost
from perf.plan_inputs import Assumption, add_flags, assumptions, model_shape, required
from perf.plan_step import Breakdown, predict, sim_settings
from perf.rl_step_report import SYNC_PHASES
from perf.shapes import DecoderShape
from scheduler.core import SchedulerSettings
from scheduler.sim import simulate
from scheduler.sim_engine import RunRecord
from scheduler.sim_model import StepCostModel
from scheduler.state import Policy
from scheduler.trace import load_trace

# perf.rl_step_gpu sends every request to its one engine at once: no scheduler in between
BENCHMARK_POLICY: Policy = "round_robin"
# the measured phases the plan's --wake-s stands for (the transfer is priced apart)
WAKE_PHASES = ("sleep", "wake_weights", "release_learner", "wake_kv")


@dataclass(frozen=True)
class Measured:
    """One measured step and what the plan needs to predict it."""

    cfg: Any
    shape: DecoderShape
    trace: str
    phases_s: dict[str, float]
    sync_bytes: int

    @classmethod
    def load(cls, path: str, trace: str | None) -> Measured:
        from rstar2.config_io import load_config

        data = json.loads(Path(path).read_text())
        cfg = load_config(data["config"])
        name = Path(data["config"]).stem.removeprefix("rl_step_")
        trace = trace or str(Path(path).parent / f"trace-{name}.jsonl")
        phases = data["measured"]["phases_s"]
        return cls(cfg, model_shape(cfg), trace, phases, int(data["sync_bytes"]))


def _predict(m: Measured, a: dict[str, Assumption]) -> Breakdown:
    """The plan's breakdown of the measured step as the benchmark ran it."""
    cost = engine_cost(a, m.shape, 1, None, nbytes=dtype_bytes(m.cfg))
    rows = load_trace(m.trace)
    return predict(m.cfg, 0, a, m.shape, rows, cost, 1, policy=BENCHMARK_POLICY)


def _solve2(rows: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """Least squares of y = a x1 + b x2 over (x1, x2, y) rows (two at least)."""
    s11 = sum(x1 * x1 for x1, _, _ in rows)
    s12 = sum(x1 * x2 for x1, x2, _ in rows)
    s22 = sum(x2 * x2 for _, x2, _ in rows)
    s1y = sum(x1 * y for x1, _, y in rows)
    s2y = sum(x2 * y for _, x2, y in rows)
    det = s11 * s22 - s12 * s12
    if abs(det) < 1e-12 * max(s11 * s22, 1e-300):
        raise ValueError("the measured steps do not tell the two terms apart")
    return (s1y * s22 - s2y * s12) / det, (s2y * s11 - s1y * s12) / det


def _learner_rows(
    steps: list[Measured], a: dict[str, Assumption]
) -> list[tuple[float, float, float]]:
    """(FLOPs / peak, micro-batches x layers, seconds) per step, as the plan counts them."""
    peak = required(a, "peak_tflops") * 1e12
    rows: list[tuple[float, float, float]] = []
    for m in steps:
        b = _predict(m, a)
        mean = b.learner_tokens / b.trajectories
        flops = m.shape.train_flops_per_token(mean) * b.learner_tokens
        per_micro = max(1, int(m.cfg.learner.micro_batch_tokens_per_gpu // mean))
        micro = math.ceil(b.trajectories / per_micro)
        rows.append((flops / peak, float(micro * m.shape.layers), m.phases_s["learn"]))
    return rows


def _with(a: dict[str, Assumption], **values: float) -> dict[str, Assumption]:
    out = dict(a)
    for name, value in values.items():
        old = a[name]
        out[name] = Assumption(name, value, old.unit, "fitted (perf.rl_step_fit)", old.flag)
    return out


HOST_S_MAX = 0.05  # the search's bound on the engine's host time per step


def _engine_runs(m: Measured, a: dict[str, Assumption]) -> tuple[StepCostModel, list[RunRecord]]:
    """The benchmark's one engine's cost model at ``a`` and its runs of steps, which add up to
    the simulated rollout (ValueError where the engine idles between them)."""
    cost = engine_cost(a, m.shape, 1, None, nbytes=dtype_bytes(m.cfg))
    settings = replace(sim_settings(m.cfg, 0, a, m.shape, cost), record_runs=True)
    sim = simulate(load_trace(m.trace), settings, SchedulerSettings(policy=BENCHMARK_POLICY))
    if len(sim.engine_runs) != 1:
        raise ValueError(
            f"{m.trace}: the benchmark's step runs one engine, not {m.cfg.rollout.num_engines}"
        )
    runs = list(sim.engine_runs[0])
    if not math.isclose(sum(r.time_s(cost) for r in runs), sim.makespan_s):
        raise ValueError(f"{m.trace}: the engine idles mid-rollout; its runs cannot be re-priced")
    return cost, runs


def _golden(f: Callable[[float], float], lo: float, hi: float, iters: int = 60) -> float:
    """The minimum of ``f`` on [lo, hi] by golden-section search (``f`` unimodal there)."""
    r = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - r * (b - a), a + r * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(iters):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - r * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + r * (b - a)
            fd = f(d)
    return (a + b) / 2


def _engine_fit(steps: list[Measured], a: dict[str, Assumption]) -> tuple[float, float]:
    """The engine's host time per step (seconds) and the share of it its GPU work hides."""
    base = _with(a, engine_step_overhead_s=0.0, engine_host_overlap=0.0)
    priced = [(*_engine_runs(m, base), m.phases_s["rollout"]) for m in steps]

    def loss(host: float, overlap: float) -> float:
        total = 0.0
        for cost, runs, measured in priced:
            c = replace(cost, host_s=host, host_overlap=overlap)
            total += math.log(measured / sum(r.time_s(c) for r in runs)) ** 2
        return total

    def best_host(overlap: float) -> float:
        return _golden(lambda h: loss(h, overlap), 0.0, HOST_S_MAX)

    grid = [i / 100 for i in range(101)]
    profile = [loss(best_host(x), x) for x in grid]
    i = min(range(len(grid)), key=profile.__getitem__)
    # where every step's GPU time exceeds the host time only (1 - overlap) x host shows: the
    # profile then has a flat valley over many overlaps instead of one minimum
    if sum(p <= profile[i] + 1e-9 for p in profile) > 2:
        raise ValueError(
            "the measured steps do not tell the host time from its overlap (no step's GPU time "
            "is under the host time): give a step of a smaller shape or shorter responses"
        )
    overlap = _golden(lambda x: loss(best_host(x), x), grid[max(0, i - 1)], grid[min(100, i + 1)])
    host = best_host(overlap)
    if host > 0.99 * HOST_S_MAX:
        raise ValueError(
            f"the engine's host time per step fits at the search's bound, {HOST_S_MAX} s"
        )
    fitted = _with(a, engine_step_overhead_s=host, engine_host_overlap=overlap)
    for (_, runs, _), m in zip(priced, steps, strict=True):  # the schedule did not move
        cost = engine_cost(fitted, m.shape, 1, None, nbytes=dtype_bytes(m.cfg))
        again = _predict(m, fitted).rollout_s
        if not math.isclose(sum(r.time_s(cost) for r in runs), again, rel_tol=1e-6):
            raise ValueError(f"{m.trace}: the schedule depends on the step times")
    return host, overlap


def fit(steps: list[Measured], a: dict[str, Assumption]) -> dict[str, float]:
    """The fitted inputs, by flag name (without dashes)."""
    inv_mfu, layer_s = _solve2(_learner_rows(steps, a))
    ipc = [
        (m.shape.weight_bytes(dtype_bytes(m.cfg)) / 1e9, m.shape.layers, m.phases_s["transfer"])
        for m in steps
    ]
    # the measured shapes may all have the same depth: the per-layer term is then fitted as
    # what the bytes leave over (the intercept, spread over the layers)
    if len({layers for _, layers, _ in ipc}) == 1:
        layers = ipc[0][1]
        s_per_gb, fixed = _solve2([(gb, 1.0, t) for gb, _, t in ipc])
        ipc_layer_s = fixed / layers
    else:
        s_per_gb, ipc_layer_s = _solve2(ipc)
    wake = [sum(m.phases_s.get(p, 0.0) for p in WAKE_PHASES) for m in steps]
    host, overlap = _engine_fit(steps, a)
    return {
        "learner_mfu": 1 / inv_mfu,
        "learner_layer_overhead_s": layer_s,
        "ipc_gb_per_s": 1 / s_per_gb,
        "ipc_layer_s": ipc_layer_s,
        "wake_s": sum(wake) / len(wake),
        "engine_step_overhead_s": host,
        "engine_host_overlap": overlap,
    }


def residuals(m: Measured, a: dict[str, Assumption]) -> dict[str, float]:
    """Measured / predicted per part (rollout, learner, sync) and for the step (their sum)."""
    b = _predict(m, a)
    assert b.learner_s is not None and b.sync_s is not None  # a GPU step: both modelled
    sync = sum(m.phases_s.get(p, 0.0) for p in SYNC_PHASES)
    measured = {"rollout": m.phases_s["rollout"], "learner": m.phases_s["learn"], "sync": sync}
    predicted = {"rollout": b.rollout_s, "learner": b.learner_s, "sync": b.sync_s}
    measured["step"], predicted["step"] = sum(measured.values()), sum(predicted.values())
    return {part: measured[part] / predicted[part] for part in measured}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m perf.rl_step_fit", description=__doc__.split("\n")[0]
    )
    p.add_argument("--measured", action="append", required=True, help="a perf.rl_step_gpu JSON")
    add_flags(p)
    args = p.parse_args(argv)
    if len(args.measured) < 2:
        p.error("--measured: two steps at least (each fit has two terms)")
    steps = [Measured.load(path, None) for path in args.measured]
    a = assumptions(args, steps[0].cfg.cluster.accelerator)
    try:
        fitted = fit(steps, a)
    except ValueError as e:
        print(f"rl_step_fit: {e}; give steps of different shapes or batches", file=sys.stderr)
        return 2
    print(" ".join(f"--{k.replace('_', '-')} {v:.4g}" for k, v in fitted.items()))
    check = _with(a, **fitted)
    for m, path in zip(steps, args.measured, strict=True):
        ratios = "  ".join(f"{k} {v:.3f}" for k, v in residuals(m, check).items())
        print(f"{path}: measured / predicted with the fit: {ratios}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
