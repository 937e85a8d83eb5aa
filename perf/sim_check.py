"""The rollout simulator held against real engines: one small multi-turn trace, replayed through
two real vLLM engines by the rollout dispatcher and through :mod:`scheduler.sim` calibrated to
those engines, under every policy.

    python -m perf.sim_check [--trajectories 48] [--blocks 24] [--policies all] [--out FILE]

1. Tool latencies: ``--tool-calls`` calls of the real embedded sandbox (a sympy solve and a
   print, 4 at a time); the trace's tool calls draw from those durations.
2. Trace: ``--trajectories`` trajectories of 1-4 turns, responses of 64-``--budget`` tokens
   (log-normal), prompts of 64-256 random tokens, 32-token tool responses. Both sides run the
   same planned turns (:func:`scheduler.sim_model.plan_turns`); the real replay forces each turn's
   length (``ignore_eos``) and sleeps the trace's tool latency.
3. Engines: two in-process vLLM engines of a tiny model, each with ``--blocks`` KV blocks
   (small on purpose, so placement matters), each engine core's threads bound to its own core
   (``VLLM_CPU_OMP_THREADS_BIND``) where there are two.
4. Calibration: :func:`perf.engine_cost.measure` on both engines at once, as they run in the
   replay (two engine cores and this process share the machine), the mean of their step-cost
   constants; the engines' real KV capacity, block size and batch limit (``max_num_seqs``).
5. Per policy: the real makespan (first submit to last finish), the engines' preemptions and
   recomputed tokens (prefill tokens computed again: vLLM's prefix-cache queries minus hits,
   less each dispatch's never-computed tokens), against the simulator's. Policies run in
   ``--rounds`` rounds, each in a fresh order; the figures are medians.

Prints a table, then one JSON line (``--out`` writes it). The check: every policy's predicted
makespan within 20% of the measured one, and the simulator orders the policies as measured
(pairs closer than the rounds' spread, or than 5%, are ties); ``--strict`` exits 1 when it
fails. About 3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from perf.record import commit, hardware
from rstar2.rollout.engine import KVStats
from scheduler.core import POLICIES, Policy, SchedulerSettings
from scheduler.sim import simulate
from scheduler.sim_model import PlannedTurn, SimSettings, StepCostModel, plan_turns
from scheduler.trace import TraceRow, TraceTurn

TOOL_TOKENS = 32
TOLERANCE = 0.20
ORDER_MIN_GAP = 0.05  # measured makespans closer than this fraction are a tie
SNIPPETS = (
    "import sympy as sp\nx = sp.symbols('x')\nprint(sp.solve(x**2 - 5*x + 6, x))",
    "print(sum(i * i for i in range(1000)))",
)


async def sandbox_latencies(calls: int) -> list[float]:
    """Wall seconds of ``calls`` real embedded-sandbox calls, 4 in flight."""
    from sandbox_pool import PoolConfig, SandboxPool

    out: list[float] = []
    sem = asyncio.Semaphore(4)
    async with SandboxPool(PoolConfig(num_workers=0)) as pool:
        await pool.wait_warm()

        async def one(i: int) -> None:
            async with sem:
                start = time.perf_counter()
                result = await pool.run(SNIPPETS[i % len(SNIPPETS)])
                if not result.ok:
                    raise RuntimeError(f"sandbox call failed: {result.status} {result.stderr}")
                out.append(time.perf_counter() - start)

        await asyncio.gather(*(one(i) for i in range(calls)))
    return out


def check_trace(n: int, budget: int, latencies: list[float], seed: int) -> list[TraceRow]:
    """The small multi-turn trace (see the module docstring)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        total = int(min(max(rng.lognormvariate(math.log(budget / 3), 0.6), 64), budget * 0.8))
        turns = min(4, 1 + int(rng.expovariate(1 / 1.5)))
        weights = [rng.random() + 0.2 for _ in range(turns)]
        sizes = [max(16, int(total * w / sum(weights))) for w in weights]
        row_turns = tuple(
            TraceTurn(
                size,
                None if k == turns - 1 else rng.choice(latencies),
                None if k == turns - 1 else TOOL_TOKENS,
            )
            for k, size in enumerate(sizes)
        )
        rows.append(TraceRow(f"t{i}", rng.randint(64, 256), row_turns, session=f"t{i}"))
    return rows


async def replay(
    engines: list[Any],
    rows: list[TraceRow],
    s: SimSettings,
    policy: Policy,
    vocab: int,
    seed: int,
) -> dict[str, Any]:
    """The trace through ``engines`` under ``policy``: makespan, preemptions, recomputed.
    ``seed`` picks the token ids: each replay's own, so none finds an earlier one's prefixes
    in the engines' caches (a rollout after a weight sync starts with them empty too)."""
    from rstar2.rollout.dispatch import Dispatcher
    from rstar2.rollout.engine import SamplingSettings

    rng = random.Random(seed)
    before = [e.kv_stats() for e in engines]
    fresh = 0  # prefill tokens no earlier request had computed

    def ids(n: int) -> list[int]:
        return [rng.randrange(16, vocab - 16) for _ in range(n)]

    settings = SchedulerSettings(policy=policy, block_size_tokens=s.block_size_tokens)
    async with Dispatcher(engines, settings, stats_interval_s=0.02) as dispatcher:

        async def one(row: TraceRow, plan: tuple[PlannedTurn, ...]) -> None:
            nonlocal fresh
            context = ids(row.prompt_tokens)
            computed = 0  # tokens of the context whose KV some request computed
            async with dispatcher.trajectory(
                prompt_tokens=row.prompt_tokens,
                max_response_tokens=s.max_response_tokens,
                session_id=row.session,
            ) as engine:
                for turn in plan:
                    fresh += len(context) - computed
                    sampling = SamplingSettings(max_tokens=turn.gen_tokens, ignore_eos=True)
                    out = await engine.generate(context, sampling)
                    if len(out.token_ids) != turn.gen_tokens:
                        raise RuntimeError(f"{row.id}: {len(out.token_ids)} tokens generated")
                    context += out.token_ids
                    computed = len(context) - 1  # the last sampled token has no KV yet
                    if turn.tool_latency_s is not None:
                        await asyncio.sleep(turn.tool_latency_s)
                        context += ids(turn.tool_tokens)

        start = time.perf_counter()
        await asyncio.gather(*(one(row, plan_turns(row, s)) for row in rows))
        makespan = time.perf_counter() - start
        moves = dispatcher.scheduler.stats.moves
    after = [e.kv_stats() for e in engines]
    pairs = list(zip(after, before, strict=True))
    computed_prefill = sum(_computed_prefill(a) - _computed_prefill(b) for a, b in pairs)
    # continuation segments (kv_affinity) re-submit the turn: their last sampled token is new
    # to the engine but was counted as computed above; a few tokens of noise at most
    return {
        "makespan_s": makespan,
        "preemptions": sum(a.num_preemptions - b.num_preemptions for a, b in pairs),
        "recomputed_tokens": max(0, computed_prefill - fresh),
        "moves": moves,
    }


def _computed_prefill(stats: KVStats) -> int:
    """Prefill tokens an engine computed so far (its prefix-cache queries minus hits, the
    re-admissions of preempted requests included)."""
    queries = stats.prefix_queries_tokens or 0
    hits = stats.prefix_hits_tokens or 0
    return int(queries - hits)


def predict(rows: list[TraceRow], s: SimSettings, policy: Policy) -> dict[str, Any]:
    res = simulate(rows, s, SchedulerSettings(policy=policy, block_size_tokens=s.block_size_tokens))
    return {
        "makespan_s": res.makespan_s,
        "preemptions": res.preemptions,
        "recomputed_tokens": res.recomputed_tokens,
        "moves": res.moves,
    }


def _order(makespans: dict[str, float], spread: dict[str, float]) -> list[tuple[str, str]]:
    """Pairs (faster, slower) of policies the measurement orders: their gap exceeds both
    rounds' spread and ``ORDER_MIN_GAP`` of the faster (closer ones are ties)."""
    pairs = []
    for a, b in ((a, b) for a in makespans for b in makespans if a < b):
        fast, slow = (a, b) if makespans[a] < makespans[b] else (b, a)
        gap = makespans[slow] - makespans[fast]
        if gap > spread[a] + spread[b] and gap > ORDER_MIN_GAP * makespans[fast]:
            pairs.append((fast, slow))
    return pairs


async def _engines(args: argparse.Namespace, model: Path) -> list[Any]:
    from rstar2.config import RolloutConfig
    from rstar2.rollout.vllm_engine import VLLMEngine, VLLMEngineConfig

    os.environ.setdefault("VLLM_CACHE_ROOT", str(model.parent / "vllm-cache"))
    config = VLLMEngineConfig(
        model_path=str(model),
        dtype="float32",
        max_model_len=args.max_model_len,
        rollout=RolloutConfig(enforce_eager=True),
        num_gpu_blocks_override=args.blocks + 1,  # vLLM keeps one aside
    )
    engines = []
    bind = (os.cpu_count() or 1) >= 2 and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ
    for i in range(2):
        if bind:  # read when the engine core starts: engine i on core i
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(i)
        try:
            engines.append(await VLLMEngine.create(config))
        finally:
            if bind:
                del os.environ["VLLM_CPU_OMP_THREADS_BIND"]
    return engines


async def _warm(engines: list[Any], vocab: int) -> None:
    """A few batches on every engine: an engine's first requests pay one-off set-up costs."""
    from rstar2.rollout.engine import SamplingSettings

    rng = random.Random(2)
    sampling = SamplingSettings(max_tokens=16, ignore_eos=True)
    for batch in (1, 4, 16):
        await asyncio.gather(
            *(
                engine.generate([rng.randrange(16, vocab - 16) for _ in range(96)], sampling)
                for engine in engines
                for _ in range(batch)
            )
        )


def _cost_args(engine: Any) -> argparse.Namespace:
    """perf.engine_cost's timing flags, with batches that fit this engine's (small) KV."""
    from perf.engine_cost import _parser, kv_needed

    args = _parser().parse_args(["--config", "-", "--repeats", "5", "--decode-tokens", "64"])
    capacity = engine.kv_stats().capacity_tokens
    t = args.decode_tokens
    args.decode_batches = [b for b in (1, 4, 8, 16, 32) if kv_needed(engine, b, 16 + t) <= capacity]
    args.kv_context = 256
    args.kv_batch = max(b for b in range(1, 17) if kv_needed(engine, b, 256 + t) <= capacity)
    return args


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from perf.engine_cost import measure
    from rstar2.tiny import build_tiny_model

    print(f"measuring {args.tool_calls} real sandbox calls ...", flush=True)
    latencies = await sandbox_latencies(args.tool_calls)
    with tempfile.TemporaryDirectory(prefix="sim-check-") as tmp:
        model = build_tiny_model(
            Path(tmp) / "model",
            ["the quick brown fox jumps over the lazy dog"] * 20,
            hidden_size=128,
            num_layers=2,
            vocab_size=1024,
            max_position_embeddings=args.max_model_len,
        )
        vocab = int(json.loads((model / "config.json").read_text())["vocab_size"])
        engines = await _engines(args, model)
        try:
            await _warm(engines, vocab)
            print("calibrating the step cost on both engines at once ...", flush=True)
            both = await asyncio.gather(*(measure(e, vocab, _cost_args(e)) for e in engines))
            measured = {"engines": both}
            cost = StepCostModel(
                **{k: statistics.fmean(m["cost"][k] for m in both) for k in both[0]["cost"]}
            )
            bs = engines[0].block_size
            s = SimSettings(
                num_engines=2,
                kv_tokens=engines[0].kv_stats().capacity_tokens,
                max_num_seqs=engines[0].max_num_seqs,
                max_response_tokens=args.budget,
                default_tool_tokens=TOOL_TOKENS,
                block_size_tokens=bs,
                cost=cost,
            )
            rows = check_trace(args.trajectories, args.budget, latencies, args.seed)
            policies: list[Policy] = list(POLICIES) if args.policies == "all" else args.policies
            real: dict[str, list[dict[str, Any]]] = {p: [] for p in policies}
            order_rng = random.Random(args.seed)
            replays = 0
            for r in range(args.rounds):
                for policy in order_rng.sample(policies, len(policies)):
                    replays += 1
                    got = await replay(engines, rows, s, policy, vocab, seed=1000 + replays)
                    real[policy].append(got)
                    print(f"round {r + 1} {policy}: {got['makespan_s']:.1f} s", flush=True)
        finally:
            for engine in engines:
                await engine.aclose()
    return _report(args, rows, s, measured, latencies, real)


def _report(
    args: argparse.Namespace,
    rows: list[TraceRow],
    s: SimSettings,
    measured: dict[str, Any],
    latencies: list[float],
    real: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for policy, runs in real.items():
        makespans = [r["makespan_s"] for r in runs]
        table[policy] = {
            "measured": {
                "makespan_s": statistics.median(makespans),
                "makespan_spread_s": (max(makespans) - min(makespans)) / 2,
                "preemptions": statistics.median(r["preemptions"] for r in runs),
                "recomputed_tokens": statistics.median(r["recomputed_tokens"] for r in runs),
                "moves": statistics.median(r["moves"] for r in runs),
            },
            "predicted": predict(rows, s, policy),  # type: ignore[arg-type]
        }
    for row in table.values():
        row["ratio"] = row["predicted"]["makespan_s"] / row["measured"]["makespan_s"]
    meas = {p: t["measured"]["makespan_s"] for p, t in table.items()}
    spread = {p: t["measured"]["makespan_spread_s"] for p, t in table.items()}
    pred = {p: t["predicted"]["makespan_s"] for p, t in table.items()}
    ordered = _order(meas, spread)
    misordered = [(a, b) for a, b in ordered if pred[a] > pred[b]]
    within = all(abs(t["ratio"] - 1) <= TOLERANCE for t in table.values())
    gen = sum(t.gen_tokens for r in rows for t in plan_turns(r, s))
    print(
        f"trace: {len(rows)} trajectories, {gen} generated tokens; 2 engines x {s.kv_tokens} KV "
        f"tokens (blocks of {s.block_size_tokens}), max_num_seqs {s.max_num_seqs}; tool calls "
        f"p50 {1e3 * statistics.median(latencies):.0f} ms"
    )
    c = s.cost
    print(
        f"cost: step {c.step_base_s * 1e3:.2f} ms + decode {c.decode_token_s * 1e6:.1f} us/token"
        f" + prefill {c.per_token_s * 1e6:.1f} us/token + KV {c.per_kv_token_s * 1e9:.2f} ns/token"
    )
    print(
        f"{'policy':<15}{'real_s':>8}{'+-':>6}{'sim_s':>8}{'sim/real':>9}{'preempt':>9}"
        f"{'sim':>6}{'recomputed':>11}{'sim':>8}{'moves':>7}{'sim':>6}"
    )
    for p, t in table.items():
        m, q = t["measured"], t["predicted"]
        print(
            f"{p:<15}{m['makespan_s']:>8.1f}{m['makespan_spread_s']:>6.1f}"
            f"{q['makespan_s']:>8.1f}{t['ratio']:>9.2f}{m['preemptions']:>9.0f}"
            f"{q['preemptions']:>6}{m['recomputed_tokens']:>11.0f}{q['recomputed_tokens']:>8}"
            f"{m['moves']:>7.0f}{q['moves']:>6}"
        )
    print(
        f"within {TOLERANCE:.0%}: {'yes' if within else 'NO'}; measured order pairs "
        f"{len(ordered)}, misordered by the simulator: {misordered or 'none'}"
    )
    return {
        "benchmark": "sim_check",
        "commit": commit(),
        "hardware": hardware(),
        "trajectories": len(rows),
        "generated_tokens": gen,
        "rounds": args.rounds,
        "sim": asdict(s),
        "engine_cost": measured,
        "tool_latency_s": {"p50": statistics.median(latencies), "max": max(latencies)},
        "policies": table,
        "within_tolerance": within,
        "misordered": misordered,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m perf.sim_check", description=__doc__.split("\n")[0])
    p.add_argument("--trajectories", type=int, default=48)
    p.add_argument("--blocks", type=int, default=24, help="usable KV blocks per engine")
    p.add_argument("--budget", type=int, default=768, help="response tokens per trajectory")
    p.add_argument("--max-model-len", type=int, default=1280)
    p.add_argument("--policies", nargs="+", default="all", choices=[*POLICIES, "all"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tool-calls", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--strict", action="store_true", help="exit 1 when the check fails")
    p.add_argument("--logs", default="runs/perf-sim-check/logs", help="vLLM's log goes here")
    args = p.parse_args(argv)
    if args.policies != "all" and "all" in args.policies:
        args.policies = "all"
    if min(args.trajectories, args.blocks, args.budget, args.rounds, args.tool_calls) < 1:
        p.error("--trajectories, --blocks, --budget, --rounds and --tool-calls must be positive")
    if args.max_model_len < args.budget + 256:
        p.error("--max-model-len must hold a 256-token prompt plus --budget")
    from rstar2.console import OWN_PACKAGES, run_console

    with run_console(Path(args.logs), own_packages=(*OWN_PACKAGES, "perf")):
        result = asyncio.run(run(args))
    line = json.dumps(result)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    passed = result["within_tolerance"] and not result["misordered"]
    return 1 if args.strict and not passed else 0


if __name__ == "__main__":
    sys.exit(main())
