"""The sandbox node of a launched job: Redis and the sandbox service, in the foreground.

    python -m launcher.sandbox_node --host IP --redis-port P --http-port P --mode http|redis

``http``: ``sandbox-pool serve`` on ``IP:HTTP_PORT`` (code-judge compatible); ``redis``: a Redis
on ``IP:REDIS_PORT`` plus ``sandbox-pool worker`` processes serving its queue (and ``serve``
in front of it, so both kinds of client reach it). Redis keeps its data in an append-only file
under the job's log folder (queued calls survive a Redis restart). When one process exits, the
others are stopped and the step exits non-zero: the job script then fails the job.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence


def commands(args: argparse.Namespace) -> list[list[str]]:
    """The processes this node runs (pure)."""
    exe = [sys.executable, "-m", "sandbox_pool.cli"]
    redis_url = f"redis://{args.host}:{args.redis_port}/0"
    serve = [*exe, "serve", "--host", args.host, "--port", str(args.http_port)]
    if args.mode == "http":
        return [serve]
    data = os.path.join(args.data_dir, "redis")
    os.makedirs(data, exist_ok=True)
    redis = ["redis-server", "--bind", args.host, "--port", str(args.redis_port), "--dir", data]
    redis += ["--appendonly", "yes", "--save", "", "--protected-mode", "no"]
    return [redis, [*exe, "worker", "--redis", redis_url], [*serve, "--redis", redis_url]]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.sandbox_node")
    parser.add_argument("--host", required=True)
    parser.add_argument("--redis-port", type=int, required=True)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--mode", choices=["http", "redis"], default="http")
    parser.add_argument("--data-dir", default=os.environ.get("LOG_DIR", "."))
    args = parser.parse_args(argv)
    procs = [subprocess.Popen(cmd) for cmd in commands(args)]

    def stop(signum: int, frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while all(p.poll() is None for p in procs):
        time.sleep(0.5)
    stop(0, None)
    end = time.monotonic() + 30
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
    codes = [p.returncode for p in procs]
    print(f"sandbox_node: stopped ({codes})", file=sys.stderr)
    return 0 if all(c in (0, -signal.SIGTERM) for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
