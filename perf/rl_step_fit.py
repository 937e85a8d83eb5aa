"""The plan's GPU step inputs fitted to measured real-shape steps (:mod:`perf.rl_step_gpu`
results), so that a step at a shape it was not fitted on can be predicted before it runs.

    python -m perf.rl_step_fit --measured A.json --measured B.json [--FLAG VALUE ...]

Fitted, each from the measured phases (two steps at least; more: least squares):

- learner: ``--learner-mfu`` (the FLOPs' share of peak) and ``--learner-layer-overhead-s``
  (per layer per micro-batch): time = FLOPs / (peak x MFU) + micro-batches x layers x overhead;
- weight transfer: ``--ipc-gb-per-s`` and ``--ipc-layer-s``: time = bytes / rate + layers x cost;
- ``--wake-s``: the mean of sleep, both wake-ups and the learner's cache release;
- the engine: ``--engine-step-overhead-s`` (host time per engine step) and
  ``--engine-prefill-mfu`` (the per-token GEMMs' share of peak) that bring the simulated
  rollouts to the measured ones: the simulated makespan is linear in both where the schedule
  does not change (fixed-length trajectories), so three simulations per step give its slopes
  and the fit is the same least squares; the fitted inputs are simulated once more to check.

Prints the flags, ready for ``python -m perf.plan``; every other input stays as given.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perf.plan_engine import dtype_bytes, engine_cost
from perf.plan_inputs import Assumption, add_flags, assumptions, model_shape, required
from perf.plan_step import predict
from perf.shapes import DecoderShape
from scheduler.trace import load_trace


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
        b = predict(m.cfg, 0, a, m.shape, load_trace(m.trace), engine_cost(a, m.shape, 1, None), 1)
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


def _rollout_s(m: Measured, a: dict[str, Assumption]) -> float:
    cost = engine_cost(a, m.shape, 1, None, nbytes=dtype_bytes(m.cfg))
    return predict(m.cfg, 0, a, m.shape, load_trace(m.trace), cost, 1).rollout_s


def _engine_fit(steps: list[Measured], a: dict[str, Assumption]) -> tuple[float, float]:
    """(host seconds per step, prefill MFU) of the engine."""
    base = _with(a, engine_step_overhead_s=0.0)
    inv0 = 1 / required(a, "engine_prefill_mfu")
    d_host, d_inv = 1e-3, 0.1 * inv0
    rows = []
    for m in steps:
        m0 = _rollout_s(m, base)
        per_host = (_rollout_s(m, _with(base, engine_step_overhead_s=d_host)) - m0) / d_host
        bumped = _with(base, engine_prefill_mfu=1 / (inv0 + d_inv))
        per_inv = (_rollout_s(m, bumped) - m0) / d_inv
        rows.append((per_host, per_inv, m.phases_s["rollout"] - m0 + inv0 * per_inv))
    host, inv = _solve2(rows)
    return host, 1 / inv


def fit(steps: list[Measured], a: dict[str, Assumption]) -> dict[str, float]:
    """The fitted inputs, by flag name (without dashes)."""
    inv_mfu, layer_s = _solve2(_learner_rows(steps, a))
    ipc = [
        (m.shape.weight_bytes(dtype_bytes(m.cfg)) / 1e9, m.shape.layers, m.phases_s["transfer"])
        for m in steps
    ]
    # both measured shapes may have the same depth: the per-layer term is then fitted as what
    # the bytes leave over (the intercept, spread over the layers)
    if len({layers for _, layers, _ in ipc}) == 1:
        layers = ipc[0][1]
        s_per_gb, fixed = _solve2([(gb, 1.0, t) for gb, _, t in ipc])
        ipc_layer_s = fixed / layers
    else:
        s_per_gb, ipc_layer_s = _solve2(ipc)
    wake = [
        sum(m.phases_s.get(p, 0.0) for p in ("sleep", "wake_weights", "release_learner", "wake_kv"))
        for m in steps
    ]
    host, mfu = _engine_fit(steps, a)
    return {
        "learner_mfu": 1 / inv_mfu,
        "learner_layer_overhead_s": layer_s,
        "ipc_gb_per_s": 1 / s_per_gb,
        "ipc_layer_s": ipc_layer_s,
        "wake_s": sum(wake) / len(wake),
        "engine_step_overhead_s": host,
        "engine_prefill_mfu": mfu,
    }


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
        ratio = m.phases_s["rollout"] / _rollout_s(m, check)
        print(f"{path}: rollout measured / simulated with the fit {ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
