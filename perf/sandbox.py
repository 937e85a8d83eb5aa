"""Sandbox benchmark: the embedded pool, the HTTP server, and a fresh-python3-per-call baseline.

Workloads: ``print(1+1)``, a small sympy solve (raw, and inside a wrapper shaped like the public
rStar2 client's: the code base64-encoded, decoded and exec'd), a 0.2 s CPU loop; concurrency
1, 8 and 64. The baseline runs each call as ``python3 -c CODE`` in a new process (what the
public rStar2 port's code-judge does), in this same run, so ratios compare like with like on
this machine. Prints a
table, then one JSON line: per (system, workload, concurrency) p50_ms, p99_ms, throughput_per_s,
failures, the latency at every 5th percentile (cdf_ms), and ours/baseline throughput ratios.

Each cell runs in ``--rounds`` rounds with the systems interleaved (the order rotating); a
ratio is the median of the rounds' ratios (``ratio_noise``: its interval's relative
half-width, :func:`perf.figures.median_noise`), so a load spike on this shared machine moves one
round of every system rather than one system's whole cell.

    python -m perf.sandbox [--calls N] [--systems embedded,http,baseline]
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

from perf.figures import median_noise
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
Runner = Callable[[str], Awaitable[ExecResult]]


async def _timed(
    run: Runner, code: str, expected: str, calls: int, conc: int
) -> tuple[list[float], float, int]:
    """``calls`` calls at most ``conc`` at a time: (latencies, wall seconds, failures)."""
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
    return latencies, time.perf_counter() - start, failures


def _stats(
    latencies: list[float], wall: float, failures: int, rounds: list[float]
) -> dict[str, Any]:
    latencies = sorted(latencies)
    last = len(latencies) - 1
    return {
        "cdf_ms": [round(latencies[round(last * q / 20)] * 1e3, 3) for q in range(21)],
        "p50_ms": round(latencies[len(latencies) // 2] * 1e3, 2),
        "p99_ms": round(latencies[min(last, int(0.99 * len(latencies)))] * 1e3, 2),
        "throughput_per_s": round(len(latencies) / wall, 1),
        "round_throughputs": [round(t, 2) for t in rounds],
        "failures": failures,
        "calls": len(latencies),
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
    return max(conc * 2, 3 * base)  # ~2 ms a call: short rounds are noise


async def _bench(
    systems: dict[str, Runner],
    base_calls: int,
    rows: dict[str, Any],
    settle: Callable[[], Awaitable[None]],
    workloads: list[str] | None = None,
    concurrency: tuple[int, ...] = CONCURRENCY,
    rounds: int = 9,
) -> None:
    """Every (workload, concurrency) cell in up to ``rounds`` rounds (fewer where a round would
    be less than one wave of the cell's concurrency), each round running every system in turn
    (the order rotating), so a cell's ratios compare measurements taken under the same
    load on this shared machine: a load spike hits one round of every system, not one
    system's whole cell."""
    for workload in workloads or list(WORKLOADS):
        code = WORKLOADS[workload]
        for run in systems.values():
            await run(code)  # warm
        for conc in concurrency:
            taken: dict[str, tuple[list[float], float, int, list[float]]] = {
                name: ([], 0.0, 0, []) for name in systems
            }
            names = list(systems)
            calls = {name: _calls_for(workload, conc, base_calls) for name in names}
            if "baseline" in calls:
                calls["baseline"] = max(conc * 4, calls["baseline"] // 4)  # slow: fewer calls
            # as many rounds as the cell's calls allow at one wave of `conc` calls a round
            cell_rounds = max(1, min(rounds, *(n // conc for n in calls.values())))
            for r in range(cell_rounds):
                for system in names[r % len(names) :] + names[: r % len(names)]:
                    await settle()  # every round starts from a full stock of ready children
                    n = calls[system] // cell_rounds
                    lat, wall, fail = await _timed(
                        systems[system], code, EXPECTED[workload], n, conc
                    )
                    all_lat, all_wall, all_fail, tputs = taken[system]
                    all_lat.extend(lat)
                    taken[system] = (all_lat, all_wall + wall, all_fail + fail, [*tputs, n / wall])
            for system, (lat, wall, fail, tputs) in taken.items():
                stats = _stats(lat, wall, fail, tputs)
                rows[f"{system}/{workload}/c{conc}"] = stats
                print(
                    f"{system:<9} {workload:<13} c={conc:<3} p50 {stats['p50_ms']:>8.2f} ms  "
                    f"p99 {stats['p99_ms']:>8.2f} ms  {stats['throughput_per_s']:>7.1f}/s  "
                    f"failures {stats['failures']}",
                    flush=True,
                )


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    systems = args.systems.split(",")
    unknown = set(args.workloads) - set(WORKLOADS)
    if unknown:
        raise SystemExit(
            f"perf.sandbox: unknown workload(s) {sorted(unknown)}; known: {list(WORKLOADS)}"
        )
    bench = {"workloads": args.workloads, "concurrency": args.concurrency, "rounds": args.rounds}
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
            await _bench(runners, args.calls, rows, pool.wait_warm, **bench)
        await runner.cleanup()

    ratios, noise = {}, {}
    for key, row in rows.items():
        system, rest = key.split("/", 1)
        base = rows.get(f"baseline/{rest}")
        if system != "baseline" and base:
            per_round = [
                o / b
                for o, b in zip(row["round_throughputs"], base["round_throughputs"], strict=True)
            ]
            ratios[f"{key}/vs_baseline"] = round(statistics.median(per_round), 3)
            noise[f"{key}/vs_baseline"] = round(median_noise(per_round), 3)
    result = {
        "benchmark": "sandbox",
        "cores": os.cpu_count(),
        "rows": rows,
        "ratios": ratios,
        "ratio_noise": noise,
    }
    print(json.dumps(result))
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400, help="calls per print cell")
    parser.add_argument("--systems", default="embedded,http,baseline")
    parser.add_argument(
        "--rounds", type=int, default=5, help="rounds per cell, systems interleaved"
    )
    parser.add_argument("--workloads", type=lambda v: v.split(","), default=list(WORKLOADS))
    parser.add_argument(
        "--concurrency", type=lambda v: tuple(int(c) for c in v.split(",")), default=CONCURRENCY
    )
    args = parser.parse_args(argv)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
