"""The ``sandbox-pool`` command: ``serve`` (HTTP API) and ``worker`` (Redis consumer).

    sandbox-pool serve --host 127.0.0.1 --port 8088 [--workers N] [--redis URL]
                       [--max-execution-time S] [--max-memory-mb M] [--token T]
    sandbox-pool worker --redis URL [--workers N] [--name NAME]

``serve --redis URL --workers 0`` is an API-only node; with workers it also consumes the stream.
SIGTERM / SIGINT stop gracefully: calls not yet running are answered 503 (a client retries them),
running ones finish, then the process exits 0.

code-judge's environment variables are the defaults where set (flags win): ``MAX_EXECUTION_TIME``,
``MAX_MEMORY``, ``MAX_WORKERS``, ``REDIS_URI``, ``MAX_STDOUT_ERROR_LENGTH``,
``MAX_QUEUE_WORK_LIFE_TIME``, ``LONG_BATCH_MAX_QUEUE_WAIT_TIME``, ``CPP_COMPILER_PATH``.

Both commands refuse to start, with a one-line reason, where an isolation layer cannot be
applied (not root, no namespaces, Python's path on /tmp itself); ``--unsafe-weak-isolation``
accepts weaker isolation explicitly.
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

from sandbox_pool.codejudge import CodeJudgeSettings, env_number
from sandbox_pool.pool import PoolConfig, SandboxPool
from sandbox_pool.protocol import Limits
from sandbox_pool.server import Executor, SandboxServer, ServerConfig
from sandbox_pool.zygote_client import IsolationUnavailable

# code-judge's variables that have no counterpart here: named once at start-up if set.
_IGNORED_ENV = (
    "PYTHON_EXECUTOR_PATH",
    "PYTHON_EXECUTE_COMMAND",
    "CPP_COMPILE_COMMAND",
    "CPP_EXECUTE_COMMAND",
    "RUN_WORKERS",
    "MAX_BATCH_CHUNK_SIZE",
    "MAX_LONG_BATCH_CHUNK_SIZE",
)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = _parser()
        settings = CodeJudgeSettings.from_env()
    except ValueError as exc:  # a malformed code-judge environment variable
        print(f"sandbox-pool: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    args.codejudge = settings
    if not hasattr(args, "handler"):
        parser.print_help()
        return 2
    ignored = [name for name in _IGNORED_ENV if os.environ.get(name)]
    if ignored:
        print(f"sandbox-pool: ignoring {', '.join(ignored)} (no counterpart here)", file=sys.stderr)
    try:
        asyncio.run(args.handler(args))
    except KeyboardInterrupt:
        pass
    except IsolationUnavailable as exc:
        print(
            f"sandbox-pool: refusing to start: {exc} "
            "(pass --unsafe-weak-isolation to accept weaker isolation)",
            file=sys.stderr,
        )
        return 2
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
    serve.add_argument(
        "--redis",
        default=os.environ.get("REDIS_URI") or None,
        help="Redis URL: dispatch calls through Redis workers (env REDIS_URI)",
    )
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
    worker.add_argument(
        "--redis",
        default=os.environ.get("REDIS_URI") or None,
        required=not os.environ.get("REDIS_URI"),
        help="Redis URL (env REDIS_URI)",
    )
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
    env = os.environ
    workers = env.get("MAX_WORKERS")
    p.add_argument(
        "--workers",
        type=int,
        default=int(env_number(env, "MAX_WORKERS", 1)) if workers else None,
        help="calls executing at once on this node (env MAX_WORKERS; default: CPU cores)",
    )
    p.add_argument(
        "--max-execution-time",
        type=float,
        default=env_number(env, "MAX_EXECUTION_TIME", 4.0),
        help="wall-clock cap per call in seconds (env MAX_EXECUTION_TIME; default 4)",
    )
    p.add_argument(
        "--max-memory-mb",
        type=int,
        default=int(env_number(env, "MAX_MEMORY", 1024)),
        help="memory cap per call in MiB (env MAX_MEMORY; default 1024)",
    )
    p.add_argument(
        "--unsafe-weak-isolation",
        action="store_true",
        help="serve even where an isolation layer (uids, namespaces, private /tmp) cannot be "
        "applied: calls can then see the host's /tmp and each other",
    )


def _pool_config(args: argparse.Namespace) -> PoolConfig:
    limits = Limits(timeout_s=args.max_execution_time, memory_mb=args.max_memory_mb)
    return PoolConfig(
        num_workers=args.workers or 0,
        limits=limits,
        allow_weak_isolation=args.unsafe_weak_isolation,
        cpp_compiler=os.environ.get("CPP_COMPILER_PATH") or "g++",
    )


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
            if not await _start(pool, stop):
                await dispatcher.aclose()
                return
            worker = RedisWorker(rcfg, pool)
        executor = dispatcher
    else:
        pool = SandboxPool(_pool_config(args))
        if not await _start(pool, stop):
            return
        executor = pool
    worker_task = asyncio.create_task(worker.run()) if worker else None
    if worker is not None and dispatcher is not None:  # /status counts this node's workers
        await worker.registered.wait()
        await dispatcher.refresh()
    config = ServerConfig(max_pending=args.max_pending, token=args.token, codejudge=args.codejudge)
    server = SandboxServer(executor, config)
    runner = web.AppRunner(server.build_app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    print(f"sandbox-pool serving on http://{args.host}:{args.port}", flush=True)
    await stop.wait()
    # calls not started are answered 503 (the client sends them again), running ones finish
    server.drain()
    if pool is not None and executor is pool:
        pool.drain()
    await runner.cleanup()  # stops accepting, lets in-flight requests finish
    print(
        f"sandbox-pool stopped: {server.handed_back} requests not yet running answered 503",
        file=sys.stderr,
        flush=True,
    )
    if worker is not None and worker_task is not None:
        worker.stop()
        await worker_task
    if dispatcher is not None:
        await dispatcher.aclose()
    if pool is not None:
        await pool.aclose()


async def _worker(args: argparse.Namespace) -> None:
    from sandbox_pool.redis_queue import RedisConfig, RedisWorker

    stop = _stop_event()
    pool = SandboxPool(_pool_config(args))
    if not await _start(pool, stop):
        return
    async with pool:
        cfg = RedisConfig(url=args.redis, visibility_timeout_s=args.visibility_timeout)
        worker = RedisWorker(cfg, pool, name=args.name)
        task = asyncio.create_task(worker.run())
        print(f"sandbox-pool worker {worker.name} consuming from {args.redis}", flush=True)
        await stop.wait()
        worker.stop()
        await task


async def _start(pool: SandboxPool, stop: asyncio.Event) -> bool:
    """Start ``pool``: True, or False where a stop came while it started (a SIGTERM to the
    process group can reach a zygote before it can ignore it: nothing ran, so no error)."""
    try:
        await pool.start()
    except IsolationUnavailable:
        await pool.aclose()
        if stop.is_set():
            return False
        raise
    return True


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop


if __name__ == "__main__":
    sys.exit(main())
