"""Wait, with a deadline and without fixed sleeps' guesswork, until a job's services are up:

    python -m launcher.wait_for --timeout-s 600 ray HEAD_IP:PORT --expect learner=gpu1,gpu2
    python -m launcher.wait_for --timeout-s 120 http http://10.0.0.3:20009/healthz
    python -m launcher.wait_for --timeout-s 120 redis redis://10.0.0.3:20008/0

``ray``: every node named by ``--expect ROLE=NODE,...`` is alive in the cluster with its role's
resource; past the deadline the error names the nodes still missing. Exit 0 when up, 1 not.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Sequence


def missing_nodes(
    expected: dict[str, list[str]], ips: dict[str, str], alive: list[dict[str, object]]
) -> list[str]:
    """``role:node`` for each expected node not alive with its role's resource (pure); a node
    whose address in ``ips`` is "" may be any node (one machine: Ray picks its own address)."""
    seen: set[tuple[str, str]] = set()
    for node in alive:
        resources = node.get("Resources") or {}
        assert isinstance(resources, dict)
        for role in expected:
            if resources.get(role, 0) > 0:
                seen.add((role, str(node.get("NodeManagerAddress"))))
    return [
        f"{role}:{name}"
        for role, names in expected.items()
        for name in names
        if (role, ips[name]) not in seen and not (ips[name] == "" and role in {r for r, _ in seen})
    ]


Abort = Callable[[], str | None]  # why to stop waiting now (a service died, a stop was asked)


def _poll(
    ready: Callable[[], str | None], timeout_s: float, what: str, abort: Abort | None = None
) -> int:
    """Call ``ready`` (None when up, else what is missing) until it is up, the deadline, or
    ``abort`` gives a reason."""
    end = time.monotonic() + timeout_s
    delay = 0.2
    while True:
        reason = abort() if abort is not None else None
        if reason is not None:
            print(f"wait_for: stopped waiting for {what}: {reason}", file=sys.stderr)
            return 1
        try:
            missing = ready()
        except Exception as e:
            missing = f"{type(e).__name__}: {e}"
        if missing is None:
            return 0
        if time.monotonic() > end:
            print(f"wait_for: {what} not up after {timeout_s:.0f} s: {missing}", file=sys.stderr)
            return 1
        time.sleep(delay)
        delay = min(delay * 1.5, 2.0)


def _ray(address: str, expect: list[str], timeout_s: float) -> int:
    from launcher.nodes import node_info

    expected = {r: names.split(",") for r, names in (e.split("=", 1) for e in expect)}
    info = node_info([name for names in expected.values() for name in names])
    return wait_ray(address, expected, {name: i.ip for name, i in info.items()}, timeout_s)


def wait_ray(
    address: str,
    expected: dict[str, list[str]],
    ips: dict[str, str],
    timeout_s: float,
    abort: Abort | None = None,
) -> int:
    """0 once every node of ``expected`` (role -> node names; ``ips``: each name's address) is
    alive in the Ray cluster at ``address`` with its role's resource; 1 past ``timeout_s``."""
    import ray

    start = time.monotonic()
    host, port = address.rsplit(":", 1)
    if _poll(lambda: _tcp(host, int(port)), timeout_s, f"the Ray head at {address}", abort):
        return 1  # ray.init would wait for a head that is not there far past the deadline
    timeout_s -= time.monotonic() - start
    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    except ConnectionError as e:
        print(f"wait_for: Ray at {address}: {e}", file=sys.stderr)
        return 1
    try:
        return _poll(
            lambda: (
                ", ".join(missing_nodes(expected, ips, [n for n in ray.nodes() if n["Alive"]]))
                or None
            ),
            timeout_s,
            f"Ray at {address}",
            abort,
        )
    finally:
        ray.shutdown()


def wait_http(url: str, timeout_s: float, abort: Abort | None = None) -> int:
    """0 once ``url`` answers 200; 1 past ``timeout_s`` (the error printed names it)."""
    return _poll(lambda: _http(url), timeout_s, url, abort)


def _tcp(host: str, port: int) -> str | None:
    import socket

    with socket.create_connection((host, port), timeout=2):
        return None


def _http(url: str) -> str | None:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as resp:
        return None if resp.status == 200 else f"HTTP {resp.status}"


def _redis(url: str) -> str | None:
    import redis

    return None if redis.Redis.from_url(url, socket_timeout=5).ping() else "no PONG"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.wait_for")
    parser.add_argument("--timeout-s", type=float, required=True)
    parser.add_argument("kind", choices=["ray", "http", "redis"])
    parser.add_argument("target")
    parser.add_argument("--expect", action="append", default=[], help="ROLE=NODE,NODE (ray)")
    args = parser.parse_args(argv)
    if args.kind == "ray":
        return _ray(args.target, args.expect, args.timeout_s)
    check = _http if args.kind == "http" else _redis
    return _poll(lambda: check(args.target), args.timeout_s, args.target)


if __name__ == "__main__":
    sys.exit(main())
