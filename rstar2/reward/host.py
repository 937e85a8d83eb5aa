"""The reward's verification pool, hosted in a process started from our own entry point.

``python -m rstar2.reward.host READ_FD WRITE_FD`` is started by :class:`HostedPool`; it runs the
pebble process pool (forkserver, math-verify preloaded, timeouts that kill and replace a
worker) and answers verification requests over two pipes. Python's forkserver and spawn
children re-import the *parent's* ``__main__`` before they run anything: for a user's plain
script without a main guard, that re-runs the whole script inside every worker. Here the
parent's ``__main__`` is this module, whose body only defines things, so a user's script runs
exactly once however the scorer is called.

Protocol (pickled tuples over :class:`multiprocessing.connection.Connection`):
parent -> host ``("init", num_workers, verify_fn)`` once, then ``("score", id, pred, truth,
inner_timeout_s, timeout_s)``...; host -> parent ``("done", id, "ok" | "timeout" | "error",
value)``. The host exits on ``("stop",)`` or when the parent's end closes (the parent died).
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

VerifyFn = Callable[[str, str, float], bool]


class HostedPool:
    """The parent's handle: ``submit`` returns a future that resolves to the verification's
    bool, or raises ``FutureTimeout`` (past ``timeout_s``) or RuntimeError (a worker or the
    host failed). A host that dies fails its pending futures; the next submit starts another."""

    def __init__(self, num_workers: int, verify_fn: VerifyFn) -> None:
        self.num_workers = num_workers
        self.verify_fn = verify_fn
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._ids = itertools.count()
        self._pending: dict[int, Future[bool]] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._outbox: Connection | None = None

    def submit(
        self, pred: str, truth: str, inner_timeout_s: float, timeout_s: float
    ) -> Future[bool]:
        future: Future[bool] = Future()
        with self._lock:
            outbox = self._ensure_host()
            rid = next(self._ids)
            self._pending[rid] = future
        try:
            with self._send_lock:
                outbox.send(("score", rid, pred, truth, inner_timeout_s, timeout_s))
        except (OSError, ValueError) as exc:  # the host is gone: the reader fails the rest
            with self._lock:
                self._pending.pop(rid, None)
            future.set_exception(RuntimeError(f"reward host unreachable: {exc}"))
        return future

    def start(self) -> None:
        """Start the host now (its workers warm up while the caller goes on)."""
        with self._lock:
            self._ensure_host()

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the host and its workers (killed past ``timeout_s``); pending futures fail."""
        with self._lock:
            proc, outbox = self._proc, self._outbox
            self._proc = self._outbox = None
        if outbox is not None:
            with self._send_lock, contextlib.suppress(OSError, ValueError):
                outbox.send(("stop",))
            outbox.close()
        if proc is not None:
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _ensure_host(self) -> Connection:
        if self._outbox is not None and self._proc is not None and self._proc.poll() is None:
            return self._outbox
        to_host_r, to_host_w = os.pipe()
        from_host_r, from_host_w = os.pipe()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "rstar2.reward.host", str(to_host_r), str(from_host_w)],
            pass_fds=(to_host_r, from_host_w),
            stdin=subprocess.DEVNULL,
            env=env,
        )
        os.close(to_host_r)
        os.close(from_host_w)
        outbox = Connection(to_host_w, readable=False)
        inbox = Connection(from_host_r, writable=False)
        outbox.send(("init", self.num_workers, self.verify_fn))
        self._proc, self._outbox = proc, outbox
        threading.Thread(
            target=self._read, args=(inbox, proc), name="reward-host-reader", daemon=True
        ).start()
        return outbox

    def _read(self, inbox: Connection, proc: subprocess.Popen[bytes]) -> None:
        try:
            while True:
                _, rid, outcome, value = inbox.recv()
                with self._lock:
                    future = self._pending.pop(rid, None)
                if future is None:
                    continue
                if outcome == "ok":
                    future.set_result(bool(value))
                elif outcome == "timeout":
                    future.set_exception(FutureTimeout())
                else:
                    future.set_exception(RuntimeError(f"reward worker failed: {value}"))
        except (EOFError, OSError):
            pass
        finally:
            inbox.close()
            with self._lock:
                if self._proc is proc:  # not replaced yet: the next submit starts a new host
                    self._proc = None
                    self._outbox = None
                lost = list(self._pending.items())
                for rid, _ in lost:
                    self._pending.pop(rid)
            for _, future in lost:
                future.set_exception(RuntimeError("the reward host stopped"))


def _reply(outbox: Connection, lock: threading.Lock, rid: int, future: Future[Any]) -> None:
    message: tuple[str, int, str, Any]
    try:
        message = ("done", rid, "ok", bool(future.result()))
    except FutureTimeout:
        message = ("done", rid, "timeout", None)
    except Exception as exc:  # a worker that raised or died
        message = ("done", rid, "error", f"{type(exc).__name__}: {exc}")
    with lock, contextlib.suppress(OSError, ValueError):
        outbox.send(message)


def main(argv: list[str]) -> None:
    from pebble import ProcessPool

    from rstar2.reward.verify import warm_up

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    inbox = Connection(int(argv[0]), writable=False)
    outbox = Connection(int(argv[1]), readable=False)
    _, num_workers, verify_fn = inbox.recv()
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["rstar2.reward.verify"])
    lock = threading.Lock()
    pool = ProcessPool(max_workers=num_workers, initializer=warm_up, context=context)
    try:
        while True:
            try:
                message = inbox.recv()
            except (EOFError, OSError):
                break
            if message[0] == "stop":
                break
            _, rid, pred, truth, inner_timeout_s, timeout_s = message
            future = pool.schedule(
                verify_fn, args=(pred, truth, inner_timeout_s), timeout=timeout_s
            )
            future.add_done_callback(partial(_reply, outbox, lock, rid))
    finally:
        pool.stop()
        pool.join()


if __name__ == "__main__":
    main(sys.argv[1:])
