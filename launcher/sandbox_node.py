"""The sandbox nodes of a launched job (the job script runs this on every one of them):

    python -m launcher.sandbox_node --first NODE --first-ip IP --redis-port P --http-port P \\
        --data-dir DIR

One sandbox node: ``sandbox-pool serve`` on ``IP:HTTP_PORT`` (code-judge compatible). Several:
the first runs a Redis (password: the job's token, from a mode-600 config file under
``--data-dir``, append-only data there too, so queued calls survive a Redis restart) and
``serve --redis`` in front of it (also working the queue); every other node runs
``sandbox-pool worker`` on it. The
Redis URL with its password reaches the processes through ``REDIS_URI`` (never argv, which other
users can read). ``serve`` takes the job's bearer token from ``SANDBOX_POOL_TOKEN``. When one
process exits, the others are stopped and the step exits non-zero: the job then fails.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from launcher.nodes import this_node


def commands(args: argparse.Namespace, node: str, token: str) -> tuple[list[list[str]], str]:
    """The processes this node runs, and the ``REDIS_URI`` they get ("" without Redis)."""
    exe = [sys.executable, "-m", "sandbox_pool.cli"]
    serve = [*exe, "serve", "--host", args.first_ip, "--port", str(args.http_port)]
    if args.nodes == 1:
        return [serve], ""
    uri = f"redis://:{token}@{args.first_ip}:{args.redis_port}/0"
    worker = [*exe, "worker"]  # the queue from REDIS_URI
    if node != args.first:
        return [worker], uri
    data = os.path.join(args.data_dir, "redis")
    os.makedirs(data, exist_ok=True)
    conf = os.path.join(data, "redis.conf")
    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"bind {args.first_ip}\nport {args.redis_port}\ndir {data}\nrequirepass {token}\n")
        f.write('appendonly yes\nsave ""\nrename-command CONFIG ""\n')
    return [["redis-server", conf], serve], uri  # serve --redis (from REDIS_URI) also works


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.sandbox_node")
    parser.add_argument("--first", required=True, help="the first sandbox node's Slurm name")
    parser.add_argument("--first-ip", required=True)
    parser.add_argument("--nodes", type=int, default=1, help="sandbox nodes in the job")
    parser.add_argument("--redis-port", type=int, required=True)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--data-dir", required=True, help="Redis's files go here")
    args = parser.parse_args(argv)
    token = os.environ.get("SANDBOX_POOL_TOKEN", "")
    cmds, uri = commands(args, this_node(), token)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URI"}
    if uri:
        env["REDIS_URI"] = uri
    procs = [subprocess.Popen(cmd, env=env) for cmd in cmds]

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
