"""Scheduling-decision latency of :class:`scheduler.core.Scheduler` under a large live load.

    python -m perf.scheduler_decision [--engines 8] [--live 8000] [--events 20000]

Fills the scheduler with ``--live`` trajectories (all admitted that fit, the rest waiting), then
replays turn boundaries: a running dispatch finishes, its trajectory's next turn becomes ready,
and ``schedule()`` places whatever now fits. Reports per policy the mean and p99 time of one
event cycle and of one placement decision (schedule() time / dispatches it returned). Prints a
table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

from scheduler.core import POLICIES, Policy, Scheduler, SchedulerSettings


def measure(policy: Policy, engines: int, live: int, events: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    sched = Scheduler([2_000_000] * engines, SchedulerSettings(policy=policy, block_size_tokens=16))
    context: dict[str, int] = {}
    limit: dict[str, int] = {}  # context at which a trajectory's budget is spent
    for i in range(live):
        tid = f"t{i}"
        context[tid] = rng.randint(150, 600)
        limit[tid] = context[tid] + 12_288
        sched.submit(tid, prompt_tokens=context[tid], max_response_tokens=12_288)
    running = [a.traj_id for a in sched.schedule()]
    cycles: list[float] = []
    decide_s = 0.0
    decisions = 0
    for _ in range(events):
        if not running:
            break
        tid = running.pop(rng.randrange(len(running)))
        gen = rng.randint(50, 1500)
        t0 = time.perf_counter()
        sched.generation_finished(tid, gen)
        context[tid] += gen + 128
        if context[tid] + 1000 > limit[tid]:
            sched.finish(tid)  # spent: a fresh trajectory takes its place
            del context[tid]
            tid = f"{tid}x"
            context[tid] = rng.randint(150, 600)
            limit[tid] = context[tid] + 12_288
            sched.submit(tid, prompt_tokens=context[tid], max_response_tokens=12_288)
        else:
            sched.turn_ready(tid, context[tid])
        t1 = time.perf_counter()
        placed = sched.schedule()
        t2 = time.perf_counter()
        cycles.append(t2 - t0)
        decide_s += t2 - t1
        decisions += len(placed)
        running.extend(a.traj_id for a in placed)
    cycles.sort()
    return {
        "live": sched.num_live,
        "waiting": sched.num_waiting,
        "events": len(cycles),
        "cycle_mean_us": round(1e6 * sum(cycles) / len(cycles), 2),
        "cycle_p99_us": round(1e6 * cycles[int(0.99 * (len(cycles) - 1))], 2),
        "decision_mean_us": round(1e6 * decide_s / max(decisions, 1), 2),
        "decisions": decisions,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--live", type=int, default=8000)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rows: dict[str, Any] = {}
    print(
        f"{'policy':<15}{'live':>7}{'waiting':>9}{'cycle_us':>10}{'p99_us':>9}{'decision_us':>13}"
    )
    for policy in POLICIES:
        row = measure(policy, args.engines, args.live, args.events, args.seed)
        rows[policy] = row
        print(
            f"{policy:<15}{row['live']:>7}{row['waiting']:>9}{row['cycle_mean_us']:>10.1f}"
            f"{row['cycle_p99_us']:>9.1f}{row['decision_mean_us']:>13.1f}",
            flush=True,
        )
    out = {"benchmark": "scheduler_decision", "engines": args.engines, "policies": rows}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
