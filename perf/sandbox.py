"""Sandbox benchmark: the embedded pool, the HTTP server, and a fresh-python3-per-call baseline.

Workloads: ``print(1+1)``, a small sympy solve (raw, and inside a wrapper shaped like the public
rStar2 client's: the code base64-encoded, decoded and exec'd), a 0.2 s CPU loop; concurrency
1, 8 and 64. The baseline runs each call as ``python3 -c CODE`` in a new process (what the
public rStar2 port's code-judge does), in this same run and in rounds alternating with ours, so
ratios compare like with like on this machine. Prints a table, then one JSON line: per (system,
workload, concurrency) p50_ms, p99_ms, throughput_per_s (and per round), failures, the latency
at every 5th percentile (cdf_ms), and ours/baseline throughput ratios (median over rounds).

    python -m perf.sandbox [--calls N] [--rounds 5] [--systems embedded,http,baseline]
                           [--workloads print,sympy,...] [--concurrency 1,8,64]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from sandbox_pool import ClientConfig, ExecResult, PoolConfig, SandboxClient, SandboxPool
from sandbox_pool.server import SandboxServer, ServerConfig


def rstar2_shaped(code: str) -> str:
    """``code`` the way the public rStar2 client ships it: base64 inside a small runner."""
    b64 = base64.b64encode(code.encode()).decode()
    return (
        "import base64, os, sys\n"
        f'code = base64.b64decode("{b64}".encode()).decode()\n'
        "try:\n"
        "    exec(compile(code, '<string>', 'exec'), {'__name__': '__main__'})\n"
        "except Exception as e:\n"
        "    print(f'{type(e).__name__}: {e}', file=sys.stderr)\n"
        "    os._exit(1)\n"
    )


SYMPY = "import sympy as sp\nx = sp.symbols('x')\nprint(sp.solve(x**2 - 5*x + 6, x))"
WORKLOADS = {
    "print": "print(1+1)",
    "sympy": SYMPY,
    "sympy_wrapped": rstar2_shaped(SYMPY),
    "cpu_0.2s": "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2:\n"
    "    pass\nprint('done')",
}
EXPECTED = {"print": "2\n", "sympy": "[2, 3]\n", "sympy_wrapped": "[2, 3]\n", "cpu_0.2s": "done\n"}
CONCURRENCY = (1, 8, 64)
ROUNDS = 5
Runner = Callable[[str], Awaitable[ExecResult]]


async def _measure(run: Runner, code: str, expected: str, calls: int, conc: int) -> dict[str, Any]:
    sem = asyncio.Semaphore(conc)
    latencies: list[float] = []
    failures = 0

    async def one() -> None:
        nonlocal failures
        async with sem:
            t0 = time.perf_counter()
            result = await run(code)
            latencies.append(time.perf_counter() - t0)
            if result.status != "ok" or result.stdout != expected:
                failures += 1

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(calls)))
    wall = time.perf_counter() - start
    return {
        "latencies_s": latencies,
        "wall_s": wall,
        "throughput_per_s": round(calls / wall, 2),
        "failures": failures,
        "calls": calls,
    }


def _summary(latencies: list[float]) -> dict[str, Any]:
    """Percentiles of sorted per-call latencies: every 5th (cdf_ms), p50 and p99."""
    last = len(latencies) - 1
    return {
        "cdf_ms": [round(latencies[round(last * q / 20)] * 1e3, 3) for q in range(21)],
        "p50_ms": round(latencies[len(latencies) // 2] * 1e3, 2),
        "p99_ms": round(latencies[min(last, int(0.99 * len(latencies)))] * 1e3, 2),
    }


async def _baseline(code: str) -> ExecResult:
    """One fresh interpreter per call, like code-judge's default executor."""
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": os.environ.get("PATH", ""), "OPENBLAS_NUM_THREADS": "1"},
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return ExecResult(status="timeout", duration_s=time.perf_counter() - t0)
    return ExecResult(
        status="ok" if proc.returncode == 0 else "error",
        stdout=out.decode(),
        stderr=err.decode(),
        exit_code=proc.returncode,
        duration_s=time.perf_counter() - t0,
    )


def _calls_for(workload: str, conc: int, base: int) -> int:
    if workload == "cpu_0.2s":
        return max(conc, base // 10)
    if workload.startswith("sympy"):
        return max(conc * 4, base // 4)
    return max(conc * 2, base)


async def _bench(
    systems: dict[str, Runner],
    base_calls: int,
    rows: dict[str, Any],
    settle: Callable[[], Awaitable[None]],
    workloads: list[str] | None = None,
    concurrency: tuple[int, ...] = CONCURRENCY,
    rounds: int = ROUNDS,
) -> None:
    """Every (workload, concurrency) cell on every system in ``rounds`` alternating rounds
    (embedded, http, baseline, embedded, ...), so a drift of this shared machine moves each
    round's systems alike and the per-round throughput ratios cancel it. A row pools its
    rounds' calls (latency percentiles over all of them) and keeps each round's throughput."""
    for workload in workloads or list(WORKLOADS):
        code = WORKLOADS[workload]
        for run in systems.values():
            await run(code)  # warm
        for conc in concurrency:
            per_round: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
            for _ in range(rounds):
                for system, run in systems.items():
                    await settle()  # every cell starts from a full stock of ready children
                    n = _calls_for(workload, conc, base_calls)
                    if system == "baseline":
                        n = max(conc * 4, n // 4)  # slow: fewer calls, but 4 rounds of conc
                    n = conc * max(1, round(n / rounds / conc))  # whole waves: no thin tail
                    per_round[system].append(await _measure(run, code, EXPECTED[workload], n, conc))
            for system, measured in per_round.items():
                stats = _pool(measured)
                rows[f"{system}/{workload}/c{conc}"] = stats
                print(
                    f"{system:<9} {workload:<13} c={conc:<3} p50 {stats['p50_ms']:>8.2f} ms  "
                    f"p99 {stats['p99_ms']:>8.2f} ms  {stats['throughput_per_s']:>7.1f}/s  "
                    f"failures {stats['failures']}",
                    flush=True,
                )


def _pool(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from a cell's rounds: percentiles over every call, throughput over every
    round's wall time, and each round's own throughput (for the paired ratios)."""
    latencies = sorted(x for r in rounds for x in r.pop("latencies_s"))
    calls = sum(r["calls"] for r in rounds)
    return {
        **_summary(latencies),
        "throughput_per_s": round(calls / sum(r["wall_s"] for r in rounds), 1),
        "round_throughput_per_s": [r["throughput_per_s"] for r in rounds],
        "failures": sum(r["failures"] for r in rounds),
        "calls": calls,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    systems = args.systems.split(",")
    unknown = set(args.workloads) - set(WORKLOADS)
    if unknown:
        raise SystemExit(
            f"perf.sandbox: unknown workload(s) {sorted(unknown)}; known: {list(WORKLOADS)}"
        )
    bench = {"workloads": args.workloads, "concurrency": args.concurrency}
    rows: dict[str, Any] = {}
    cfg = PoolConfig(num_workers=0)
    async with SandboxPool(cfg) as pool:
        await pool.wait_warm()
        runners: dict[str, Runner] = {}
        if "embedded" in systems:
            runners["embedded"] = pool.run
        server = SandboxServer(pool, ServerConfig(max_pending=4096))
        runner = web.AppRunner(server.build_app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        async with SandboxClient(f"http://127.0.0.1:{port}", ClientConfig()) as client:
            if "http" in systems:
                runners["http"] = client.run
            if "baseline" in systems:
                runners["baseline"] = _baseline
            await _bench(runners, args.calls, rows, pool.wait_warm, **bench, rounds=args.rounds)
        await runner.cleanup()

    ratios = {}
    for key, row in rows.items():
        system, rest = key.split("/", 1)
        base = rows.get(f"baseline/{rest}")
        if system != "baseline" and base:
            pairs = zip(row["round_throughput_per_s"], base["round_throughput_per_s"], strict=True)
            ratios[f"{key}/vs_baseline"] = round(
                statistics.median(ours / theirs for ours, theirs in pairs), 2
            )
    result = {"benchmark": "sandbox", "cores": os.cpu_count(), "rows": rows, "ratios": ratios}
    print(json.dumps(result))
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=650, help="calls per print cell")
    parser.add_argument("--systems", default="embedded,http,baseline")
    parser.add_argument(
        "--rounds", type=int, default=ROUNDS, help="alternating rounds per cell (calls split)"
    )
    parser.add_argument("--workloads", type=lambda v: v.split(","), default=list(WORKLOADS))
    parser.add_argument(
        "--concurrency", type=lambda v: tuple(int(c) for c in v.split(",")), default=CONCURRENCY
    )
    args = parser.parse_args(argv)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
