"""Trace-replay simulator of rollout scheduling policies (see :mod:`scheduler.sim`).

    python -m perf.rollout_sim --trace FILE|paper|skewed --engines N --kv-tokens K --policy P|all
        [--seed S] [--prefill-tokens-per-s R | --cost FILE]

``--trace paper`` generates the paper-like trace of :func:`scheduler.trace.paper_like` (512
prompts x 16 trajectories; ``--prompts`` / ``--samples`` scale it); ``--trace skewed`` the
differently shaped one of :func:`scheduler.trace.skewed` (1-2 turns, 5% of the trajectories
carry 30% of the work). Prints a table, then one JSON line with, per policy: makespan_s,
busy_fraction, preemptions, recomputed_tokens, generated_tokens, p50/p99 trajectory latency, the
tail (``queue_empty_s``: when an engine admitted the last trajectory to start,
``live_at_queue_empty``, ``steps_after_queue_empty`` of ``steps``); and the makespan no policy
can beat under the cost model (:func:`scheduler.bound.makespan_lower_bound`), with each policy's
ratio to it. Exit 2 with one line on a bad argument or trace.

The engine step cost defaults to :class:`scheduler.sim_model.StepCostModel`'s assumed MI300X
figures; ``--cost FILE`` takes the three constants that ``python -m perf.step_cost --out FILE``
measured on a GPU (perf/results/step-cost-h200.json is one).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from scheduler.bound import makespan_lower_bound
from scheduler.core import POLICIES, SchedulerError, SchedulerSettings
from scheduler.sim import simulate
from scheduler.sim_model import SimSettings, StepCostModel
from scheduler.trace import TraceError, TraceRow, load_trace, paper_like, skewed

# --trace NAME: a generated trace
GENERATED: dict[str, Callable[..., list[TraceRow]]] = {"paper": paper_like, "skewed": skewed}


def _rows(args: argparse.Namespace) -> list[TraceRow]:
    if args.trace in GENERATED:
        return GENERATED[args.trace](
            num_prompts=args.prompts,
            samples_per_prompt=args.samples,
            max_response_tokens=args.max_response_tokens,
            seed=args.seed,
        )
    return load_trace(args.trace)


class CostFileError(ValueError):
    """A --cost file that is not a step-cost JSON."""


def load_cost(path: str) -> StepCostModel:
    """The StepCostModel in a ``perf.step_cost`` JSON (its ``cost`` object, or the constants at
    the top level); ``per_decode_token_s`` is optional."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CostFileError(f"--cost {path}: {exc}") from exc
    cost = data.get("cost", data) if isinstance(data, dict) else None
    keys = ("step_base_s", "per_token_s", "per_kv_token_s")
    if not isinstance(cost, dict) or not all(k in cost for k in keys):
        raise CostFileError(f"--cost {path}: expected a JSON object with {', '.join(keys)}")
    values = {k: cost[k] for k in (*keys, "per_decode_token_s") if cost.get(k) is not None}
    bad = [
        k
        for k, v in values.items()
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf
    ]
    if bad:
        raise CostFileError(f"--cost {path}: {', '.join(bad)} must be positive finite numbers")
    return StepCostModel(**{k: float(v) for k, v in values.items()})


def run(args: argparse.Namespace) -> dict[str, Any]:
    rows = _rows(args)
    if args.cost is not None:
        cost = load_cost(args.cost)
    elif args.prefill_tokens_per_s is not None:
        cost = StepCostModel(per_token_s=1.0 / args.prefill_tokens_per_s)
    else:
        cost = StepCostModel()
    settings = SimSettings(
        num_engines=args.engines,
        kv_tokens=args.kv_tokens,
        max_num_seqs=args.max_num_seqs,
        max_response_tokens=args.max_response_tokens,
        cost=cost,
    )
    policies = list(POLICIES) if args.policy == "all" else [args.policy]
    gen = sum(r.response_tokens for r in rows)
    print(
        f"trace: {len(rows)} trajectories, {gen / len(rows):.0f} response tokens mean, "
        f"{sum(len(r.turns) for r in rows) / len(rows):.1f} turns mean; {args.engines} engines "
        f"x {args.kv_tokens} KV tokens"
    )
    bound = makespan_lower_bound(rows, settings)
    print(
        f"lower bound (no policy beats it under this cost model): {bound.makespan_s:.1f} s "
        f"(work spread evenly {bound.work_s:.1f} s, longest trajectory alone "
        f"{bound.critical_path_s:.1f} s)"
    )
    header = (
        f"{'policy':<15}{'makespan_s':>11}{'busy':>7}{'preempt':>9}{'recomputed':>12}"
        f"{'recomp%':>9}{'p50_s':>9}{'p99_s':>9}{'moves':>8}{'qempty_s':>10}{'live':>7}"
        f"{'sim_s':>7}"
    )
    print(header)
    results: dict[str, Any] = {}
    for policy in policies:
        t0 = time.perf_counter()
        res = simulate(rows, settings, SchedulerSettings(policy=policy))
        wall = time.perf_counter() - t0
        row = res.as_dict()
        results[policy] = row
        print(
            f"{policy:<15}{res.makespan_s:>11.1f}{res.busy_fraction:>7.2f}{res.preemptions:>9}"
            f"{res.recomputed_tokens:>12}"
            f"{100 * res.recomputed_tokens / max(res.generated_tokens, 1):>8.2f}%"
            f"{res.p50_latency_s:>9.1f}{res.p99_latency_s:>9.1f}{res.moves:>8}"
            f"{res.queue_empty_s:>10.1f}{res.live_at_queue_empty:>7}{wall:>7.1f}",
            flush=True,
        )
    print("qempty_s: when an engine admitted the last trajectory to start; live: unfinished then")
    out = {
        "benchmark": "rollout_sim",
        "trace": args.trace,
        "trajectories": len(rows),
        "engines": args.engines,
        "kv_tokens": args.kv_tokens,
        "max_num_seqs": args.max_num_seqs,
        "prefill_tokens_per_s": round(1.0 / settings.cost.per_token_s, 1),
        "cost": asdict(settings.cost) | ({"file": args.cost} if args.cost else {}),
        "seed": args.seed,
        "policies": results,
    }
    out["lower_bound_s"] = round(bound.makespan_s, 4)
    out["makespan_vs_lower_bound"] = {
        p: round(r["makespan_s"] / bound.makespan_s, 3) for p, r in results.items()
    }
    if "round_robin" in results:
        rr = results["round_robin"]["makespan_s"]
        out["makespan_vs_round_robin"] = {
            p: round(r["makespan_s"] / rr, 3) for p, r in results.items()
        }
    print(json.dumps(out))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--trace", default="paper", help="JSONL trace file, or 'paper' / 'skewed' (generated)"
    )
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument(
        "--kv-tokens", type=int, default=655_360, help="KV capacity per engine (tokens)"
    )
    parser.add_argument("--policy", default="all", choices=[*POLICIES, "all"])
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated trace")
    parser.add_argument("--prompts", type=int, default=512, help="generated traces: prompts")
    parser.add_argument("--samples", type=int, default=16, help="generated traces: per prompt")
    parser.add_argument("--max-num-seqs", type=int, default=256, help="engine batch limit")
    parser.add_argument("--max-response-tokens", type=int, default=12_288)
    cost = parser.add_mutually_exclusive_group()
    cost.add_argument(
        "--cost",
        help="a perf.step_cost JSON: the engine step-cost constants measured on a GPU",
    )
    cost.add_argument(
        "--prefill-tokens-per-s",
        type=float,
        default=None,
        help="one engine's compute rate in tokens/s, the step-time cost of each prefill or "
        "decode token (default ~21,300: 14B at ~600 effective TFLOP/s); measure yours with a "
        "prefill benchmark",
    )
    args = parser.parse_args(argv)
    rate = args.prefill_tokens_per_s
    if min(args.engines, args.kv_tokens, args.max_num_seqs, 1 if rate is None else rate) <= 0:
        print(
            "error: --engines, --kv-tokens, --max-num-seqs and --prefill-tokens-per-s must be "
            "positive",
            file=sys.stderr,
        )
        return 2
    try:
        run(args)
    except (TraceError, SchedulerError, CostFileError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
