"""The real-shape step's figures (:mod:`perf.rl_step_gpu`) and their comparison with the plan.

    python -m perf.rl_step_report --plan PLAN.json --measured STEP.json

:func:`report` turns one benchmark run into its JSON: per phase of the measured step (the last;
the first warms up) its seconds and device-wide peak memory, the rates, and the transfer
against the device copy. :func:`compare` sets it next to ``perf.plan``'s JSON line for the same
config: the plan's parts are rollout, learner and sync (sync: the engines' sleep and wake-ups
and the transfer), each with
measured / predicted and whether it is within the issue's 20%; the step is the three parts
(the plan's reward tail is left out: nothing scores in the benchmark). Pure: no GPU needed.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TOLERANCE = 0.20  # the planner is trusted within 20% of the measured step (issue 48)
# what the plan calls sync: everything around the learner step that gives the GPU back and forth
SYNC_PHASES = ("sleep", "ipc_setup", "wake_weights", "transfer", "release_learner", "wake_kv")


def _peak_gib(samples: Sequence[tuple[float, int]], start: float, end: float) -> float | None:
    inside = [b for t, b in samples if start <= t <= end]
    return round(max(inside) / 2**30, 2) if inside else None


def step_figures(step: dict[str, Any], samples: Sequence[tuple[float, int]]) -> dict[str, Any]:
    """One step's phases (seconds and peak GiB), rates and totals."""
    spans = step["spans"]
    phases = {name: round(end - start, 3) for name, (start, end) in spans.items()}
    sync_s = sum(s for name, s in phases.items() if name in SYNC_PHASES)
    return {
        "phases_s": phases,
        "peak_gib": {name: _peak_gib(samples, start, end) for name, (start, end) in spans.items()},
        "rollout_s": phases["rollout"],
        "learner_s": phases["learn"],
        "sync_s": round(sync_s, 3),
        "step_s": round(phases["rollout"] + phases["learn"] + sync_s, 3),
        "rollout_tokens_per_s": step["rollout_tokens_per_s"],
        "learner_tokens_per_s": step["learner_tokens_per_s"],
        "generated_tokens": step["generated_tokens"],
        "trained_tokens": step["trained_tokens"],
        "transfer_gb_per_s": step["transfer_gb_per_s"],
        "engine_seen": step.get("engine_seen"),  # KV capacity, most running/waiting at once
    }


def report(
    cfg: Any,
    args: argparse.Namespace,
    run: dict[str, Any],
    memory: Any,
    copy_gb_per_s: float,
) -> dict[str, Any]:
    """The benchmark's JSON (``memory``: anything with ``samples`` of (time, used bytes))."""
    steps = [step_figures(s, memory.samples) for s in run["steps"]]
    measured = steps[-1]
    first = run["steps"][0]
    return {
        "benchmark": "rl_step_gpu",
        "config": args.config,
        "shape": cfg.model.path + " (random weights)",
        "dtype": cfg.model.dtype,
        "learner": cfg.learner.backend,
        "batch": {
            "prompts": cfg.data.rollout_batch_num_prompts,
            "samples_per_prompt": cfg.rollout.num_samples_per_prompt,
            "prompt_tokens": args.prompt_tokens,
            "response_tokens": cfg.stages[0].max_response_tokens,
        },
        "gpu_memory_utilization": cfg.rollout.gpu_memory_utilization,
        "engine_start_s": run["engine_start_s"],
        "measured": measured,
        "warmup_step": steps[0] if len(steps) > 1 else None,
        "sync_bytes": first["sync_bytes"],
        "sync_buckets": first["sync_buckets"],
        "device_copy_gb_per_s": round(copy_gb_per_s, 1),
        "transfer_over_device_copy": round(measured["transfer_gb_per_s"] / copy_gb_per_s, 4),
    }


def compare(plan: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """Each part and the step: predicted, measured, measured / predicted, within 20%."""
    m = measured["measured"]
    predicted_parts = {part: plan.get(part) for part in ("rollout_s", "learner_s", "sync_s")}
    # the plan's step adds a reward tail; nothing scores here, so the step is the three parts
    known = [v for v in predicted_parts.values() if v is not None]
    predicted_parts["step_s"] = round(sum(known), 3) if len(known) == 3 else None
    rows = {}
    for part, predicted in predicted_parts.items():
        actual = m[part]
        ratio = actual / predicted if predicted else None
        rows[part] = {
            "predicted": predicted,
            "measured": round(actual, 3),
            "measured_over_predicted": None if ratio is None else round(ratio, 3),
            "within_20pct": ratio is not None and abs(ratio - 1) <= TOLERANCE,
        }
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.rl_step_report", description=__doc__)
    p.add_argument("--plan", required=True, help="the saved prediction (its 'prediction' key)")
    p.add_argument("--measured", required=True, help="perf.rl_step_gpu's JSON")
    args = p.parse_args(argv)
    plan = json.loads(Path(args.plan).read_text())["prediction"]
    rows = compare(plan, json.loads(Path(args.measured).read_text()))
    print(f"{'part':10} {'predicted s':>12} {'measured s':>11} {'meas/pred':>10}  within 20%")
    for part, r in rows.items():
        ratio = r["measured_over_predicted"]
        print(
            f"{part:10} {r['predicted']:>12} {r['measured']:>11} "
            f"{'-' if ratio is None else ratio:>10}  {'yes' if r['within_20pct'] else 'NO'}"
        )
    print(json.dumps(rows))
    return 0 if rows["step_s"]["within_20pct"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
