"""The ``sandbox-pool`` command: ``serve`` (HTTP API) and ``worker`` (Redis consumer).

    sandbox-pool serve --host 127.0.0.1 --port 8088 [--workers N] [--redis URL]
                       [--max-execution-time S] [--max-memory-mb M] [--token T]
    sandbox-pool worker --redis URL [--workers N] [--name NAME]

``serve --redis URL --workers 0`` is an API-only node; with workers it also consumes the stream.
SIGTERM / SIGINT stop gracefully: no new calls, in-flight ones finish.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Sequence

from aiohttp import web

from sandbox_pool.pool import PoolConfig, SandboxPool
from sandbox_pool.protocol import Limits
from sandbox_pool.server import Executor, SandboxServer, ServerConfig


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help()
        return 2
    try:
        asyncio.run(args.handler(args))
    except KeyboardInterrupt:
        pass
    except OSError as exc:  # e.g. the port is taken, Redis unreachable
        print(f"sandbox-pool: {exc}", file=sys.stderr)
        return 1
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sandbox-pool", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(metavar="COMMAND")
    serve = sub.add_parser("serve", help="run the HTTP API (native /v1 and code-judge)")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback)")
    serve.add_argument("--port", type=int, default=8088)
    serve.add_argument("--redis", help="Redis URL: dispatch calls through Redis workers")
    serve.add_argument(
        "--token",
        default=os.environ.get("SANDBOX_POOL_TOKEN"),
        help="require 'Authorization: Bearer TOKEN' (env SANDBOX_POOL_TOKEN)",
    )
    serve.add_argument(
        "--max-pending", type=int, default=1024, help="admitted calls before 429 (default 1024)"
    )
    _pool_args(serve)
    serve.set_defaults(handler=_serve)
    worker = sub.add_parser("worker", help="consume calls from Redis on this node")
    worker.add_argument("--redis", required=True, help="Redis URL")
    worker.add_argument("--name", help="consumer name (default: host-pid)")
    worker.add_argument(
        "--visibility-timeout",
        type=float,
        default=30.0,
        help="seconds before a call held by a dead worker is re-run",
    )
    _pool_args(worker)
    worker.set_defaults(handler=_worker)
    return parser


def _pool_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="calls executing at once on this node (default: CPU cores)",
    )
    p.add_argument(
        "--max-execution-time",
        type=float,
        default=4.0,
        help="wall-clock cap per call in seconds (default 4)",
    )
    p.add_argument(
        "--max-memory-mb", type=int, default=1024, help="memory cap per call in MiB (default 1024)"
    )


def _pool_config(args: argparse.Namespace) -> PoolConfig:
    limits = Limits(timeout_s=args.max_execution_time, memory_mb=args.max_memory_mb)
    return PoolConfig(num_workers=args.workers or 0, limits=limits)


async def _serve(args: argparse.Namespace) -> None:
    from sandbox_pool.redis_queue import RedisConfig, RedisDispatcher, RedisWorker

    stop = _stop_event()
    pool: SandboxPool | None = None
    worker: RedisWorker | None = None
    dispatcher: RedisDispatcher | None = None
    executor: Executor
    if args.redis:
        rcfg = RedisConfig(url=args.redis)
        dispatcher = RedisDispatcher(rcfg)
        await dispatcher.start()
        if args.workers != 0:
            pool = SandboxPool(_pool_config(args))
            await pool.start()
            worker = RedisWorker(rcfg, pool)
        executor = dispatcher
    else:
        pool = SandboxPool(_pool_config(args))
        await pool.start()
        executor = pool
    server = SandboxServer(executor, ServerConfig(max_pending=args.max_pending, token=args.token))
    runner = web.AppRunner(server.build_app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    print(f"sandbox-pool serving on http://{args.host}:{args.port}", flush=True)
    worker_task = asyncio.create_task(worker.run()) if worker else None
    await stop.wait()
    await runner.cleanup()  # stops accepting, lets in-flight requests finish
    if worker is not None and worker_task is not None:
        worker.stop()
        await worker_task
    if dispatcher is not None:
        await dispatcher.close()
    if pool is not None:
        await pool.close()


async def _worker(args: argparse.Namespace) -> None:
    from sandbox_pool.redis_queue import RedisConfig, RedisWorker

    stop = _stop_event()
    async with SandboxPool(_pool_config(args)) as pool:
        cfg = RedisConfig(url=args.redis, visibility_timeout_s=args.visibility_timeout)
        worker = RedisWorker(cfg, pool, name=args.name)
        task = asyncio.create_task(worker.run())
        print(f"sandbox-pool worker {worker.name} consuming from {args.redis}", flush=True)
        await stop.wait()
        worker.stop()
        await task


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop


if __name__ == "__main__":
    sys.exit(main())
