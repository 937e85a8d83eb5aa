"""Scheduling-decision latency of :class:`scheduler.core.Scheduler` under a large live load.

    python -m perf.scheduler_decision [--engines 8] [--live 8000] [--events 20000]

Fills the scheduler with ``--live`` trajectories (all admitted that fit, the rest waiting), then
replays turn boundaries: a running dispatch finishes, its trajectory's next turn becomes ready,
and ``schedule()`` places whatever now fits. The policies run in alternating chunks of events
with the garbage collector off, each chunk timed several times from copies of its starting
state. Reports per policy the mean and p99 time of one event cycle, of
one placement decision (schedule() time / dispatches it returned), and each chunk's mean cycle.
Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import random
import time
from typing import Any

from scheduler.core import POLICIES, Policy, Scheduler, SchedulerSettings


class Replay:
    """One policy's scheduler under the load, advanced event by event (chunks of a replay
    can alternate with other policies' chunks: see :func:`measure_all`)."""

    def __init__(self, policy: Policy, engines: int, live: int, seed: int) -> None:
        self.rng = random.Random(seed)
        settings = SchedulerSettings(policy=policy, block_size_tokens=16)
        self.sched = Scheduler([2_000_000] * engines, settings)
        self.context: dict[str, int] = {}
        self.limit: dict[str, int] = {}  # context at which a trajectory's budget is spent
        for i in range(live):
            self._submit(f"t{i}")
        self.running = [a.traj_id for a in self.sched.schedule()]
        self.cycles: list[float] = []
        self.decide_s = 0.0
        self.decisions = 0

    def _submit(self, tid: str) -> None:
        self.context[tid] = self.rng.randint(150, 600)
        self.limit[tid] = self.context[tid] + 12_288
        self.sched.submit(tid, prompt_tokens=self.context[tid], max_response_tokens=12_288)

    def run(self, events: int) -> list[float]:
        """Replay up to ``events`` turn boundaries; returns their cycle times in seconds."""
        rng, sched, context = self.rng, self.sched, self.context
        cycles = []
        for _ in range(events):
            if not self.running:
                break
            tid = self.running.pop(rng.randrange(len(self.running)))
            gen = rng.randint(50, 1500)
            t0 = time.perf_counter()
            sched.generation_finished(tid, gen)
            context[tid] += gen + 128
            if context[tid] + 1000 > self.limit[tid]:
                sched.finish(tid)  # spent: a fresh trajectory takes its place
                del context[tid]
                tid = f"{tid}x"
                self._submit(tid)
            else:
                sched.turn_ready(tid, context[tid])
            t1 = time.perf_counter()
            placed = sched.schedule()
            t2 = time.perf_counter()
            cycles.append(t2 - t0)
            self.decide_s += t2 - t1
            self.decisions += len(placed)
            self.running.extend(a.traj_id for a in placed)
        self.cycles += cycles
        return cycles

    def row(self) -> dict[str, Any]:
        cycles = sorted(self.cycles)
        return {
            "live": self.sched.num_live,
            "waiting": self.sched.num_waiting,
            "events": len(cycles),
            "cycle_mean_us": round(1e6 * sum(cycles) / len(cycles), 2),
            "cycle_p99_us": round(1e6 * cycles[int(0.99 * (len(cycles) - 1))], 2),
            "decision_mean_us": round(1e6 * self.decide_s / max(self.decisions, 1), 2),
            "decisions": self.decisions,
        }


def measure_all(
    engines: int, live: int, events: int, seed: int, rounds: int = 5, repeats: int = 3
) -> dict[str, dict[str, Any]]:
    """Every policy's replay in ``rounds`` chunks with the garbage collector off (as timeit
    does). Each chunk is timed ``repeats`` times from copies of the same state, the policies
    alternating within each repeat, so a drift of the machine moves every policy alike; the
    replay goes on from the fastest copy. Each row keeps its chunks' fastest mean cycle
    (``round_cycle_mean_us``: they differ with the load replayed) and, per repeat, the time of
    all its chunks (``repeat_cycles_s``: repeat ``j`` of two policies ran back to back, so their
    ratio cancels the machine's drift and the repeats' scatter is this run's noise)."""
    replays = {policy: Replay(policy, engines, live, seed) for policy in POLICIES}
    chunk_means: dict[str, list[float]] = {policy: [] for policy in POLICIES}
    repeat_s: dict[str, list[float]] = {policy: [0.0] * repeats for policy in POLICIES}
    chunk = max(1, events // rounds)
    was_enabled = gc.isenabled()
    try:
        for _ in range(rounds):
            best: dict[Policy, tuple[float, Replay, list[float]]] = {}
            for j in range(repeats):
                gc.collect()
                gc.disable()
                for policy, replay in replays.items():
                    trial = copy.deepcopy(replay)
                    cycles = trial.run(chunk)
                    took = sum(cycles)
                    repeat_s[policy][j] += took
                    if policy not in best or took < best[policy][0]:
                        best[policy] = (took, trial, cycles)
                gc.enable()
            for policy, (_, trial, cycles) in best.items():
                replays[policy] = trial
                if cycles:
                    chunk_means[policy].append(round(1e6 * sum(cycles) / len(cycles), 2))
    finally:
        if not was_enabled:
            gc.disable()
    return {
        policy: {
            **replay.row(),
            "round_cycle_mean_us": chunk_means[policy],
            "repeat_cycles_s": [round(t, 6) for t in repeat_s[policy]],
        }
        for policy, replay in replays.items()
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--live", type=int, default=8000)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=5, help="chunks per replay")
    parser.add_argument("--repeats", type=int, default=3, help="timed copies of each chunk")
    args = parser.parse_args(argv)
    print(
        f"{'policy':<15}{'live':>7}{'waiting':>9}{'cycle_us':>10}{'p99_us':>9}{'decision_us':>13}"
    )
    rows = measure_all(args.engines, args.live, args.events, args.seed, args.rounds, args.repeats)
    for policy, row in rows.items():
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
