"""The reward's verification pool, hosted in a process started from our own entry point.

``python -m rstar2.reward.host_entry READ_FD WRITE_FD`` is started by :class:`HostedPool`; it
runs the pebble process pool (forkserver, math-verify preloaded, timeouts that kill and replace a
worker) and answers verification requests over two pipes. Python's forkserver and spawn
children re-import the *parent's* ``__main__`` before they run anything: for a user's plain
script without a main guard, that re-runs the whole script inside every worker. Here the
parent's ``__main__`` is that entry module, whose body is guarded, so a user's script runs
exactly once however the scorer is called.

Protocol (pickled tuples over :class:`multiprocessing.connection.Connection`):
parent -> host ``("init", num_workers, ref)`` once (``ref`` from :func:`function_ref`), then
``("score", id, pred, truth, inner_timeout_s, timeout_s)``...; host -> parent ``("done", id,
"ok" | "timeout" | "error", value)``. The host exits on ``("stop",)``, when the parent's end
closes, or when its parent process is gone (a forked child may still hold the pipe open).
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.connection import Connection
from typing import Any, ClassVar

from rstar2.errors import UserError

VerifyFn = Callable[[str, str, float], bool]
FunctionRef = tuple[str, ...]  # ("import", module, qualname) or ("pickle", pickled bytes)


class RewardHostBroken(UserError, RuntimeError):
    """The verification host died ``max_restarts`` times in a row: scores would all be 0."""

    kind: ClassVar[str] = "reward scoring stopped"
    exit_code: ClassVar[int] = 1


ENTRY = "rstar2.reward.host_entry"


def function_ref(fn: VerifyFn) -> FunctionRef:
    """How the host finds ``fn``. A function of ``python -m pkg.mod``'s ``__main__`` is named by
    its module (the host imports ``pkg.mod``, whose main guard keeps its body from running);
    one of a plain script's ``__main__`` cannot be found and raises ValueError, as does one
    that cannot be pickled."""
    if getattr(fn, "__module__", None) == "__main__":
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        if spec is None or not spec.name or spec.name == "__main__":
            raise ValueError(
                "verify_fn must be defined in an importable module, not a script's __main__"
            )
        return ("import", spec.name, fn.__qualname__)
    try:
        return ("pickle", pickle.dumps(fn).hex())
    except Exception as exc:
        raise ValueError(f"verify_fn cannot be sent to the reward workers: {exc}") from exc


def resolve(ref: FunctionRef) -> VerifyFn:
    if ref[0] == "import":
        obj: Any = importlib.import_module(ref[1])
        for part in ref[2].split("."):
            obj = getattr(obj, part)
        return obj
    return pickle.loads(bytes.fromhex(ref[1]))


@dataclass(eq=False)
class _Host:
    proc: subprocess.Popen[bytes]
    outbox: Connection
    pending: dict[int, Future[bool]] = field(default_factory=dict)
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: bool = False


class HostedPool:
    """The parent's handle: ``submit`` returns a future that resolves to the verification's
    bool, or raises ``FutureTimeout`` (past ``timeout_s``) or RuntimeError (a worker or the
    host failed). A host that dies fails its own pending futures, and the next submit starts
    another; after ``max_restarts`` deaths with no answer between them, submit raises
    :class:`RewardHostBroken`. In a forked child the parent's host is left alone."""

    def __init__(self, num_workers: int, verify: FunctionRef, max_restarts: int = 5) -> None:
        self.num_workers = num_workers
        self.verify = verify
        self.max_restarts = max_restarts
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._host: _Host | None = None
        self._pid = os.getpid()
        self._deaths = 0
        self._last_death = ""
        self._last_progress = time.monotonic()  # the host's start or its latest answer

    def submit(
        self, pred: str, truth: str, inner_timeout_s: float, timeout_s: float
    ) -> Future[bool]:
        future: Future[bool] = Future()
        with self._lock:
            host = self._ensure_host()
            rid = next(self._ids)
            host.pending[rid] = future
        try:
            with host.send_lock:
                host.outbox.send(("score", rid, pred, truth, inner_timeout_s, timeout_s))
        except (OSError, ValueError) as exc:
            with self._lock:
                mine = host.pending.pop(rid, None)  # None: the reader failed it already
            if mine is not None:
                mine.set_exception(RuntimeError(f"reward host unreachable: {exc}"))
        return future

    def start(self) -> None:
        """Start the host now (its workers warm up while the caller goes on)."""
        with self._lock:
            self._ensure_host()

    def replace(self) -> None:
        """Kill the current host (it stopped answering); its pending futures fail and the next
        submit starts another. Counts as a death."""
        with self._lock:
            host, self._host = self._host, None
        if host is not None:
            with contextlib.suppress(OSError):
                host.proc.kill()

    def idle_s(self) -> float:
        """Seconds since the host started or last answered anything."""
        return time.monotonic() - self._last_progress

    @property
    def host_pid(self) -> int | None:
        """The running host's process id (None before the first submit or after a death)."""
        host = self._host
        return host.proc.pid if host is not None and host.proc.poll() is None else None

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the host and its workers (killed past ``timeout_s``); pending futures fail.
        Never waits on a send stuck behind a host that stopped reading."""
        with self._lock:
            host, self._host = self._host, None
        if host is None or self._pid != os.getpid():
            return
        host.stopping = True
        if host.send_lock.acquire(timeout=1.0):
            try:
                with contextlib.suppress(OSError, ValueError):
                    host.outbox.send(("stop",))
                host.outbox.close()
            finally:
                host.send_lock.release()
        try:
            host.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            host.proc.kill()
            host.proc.wait()

    def _ensure_host(self) -> _Host:
        if self._pid != os.getpid():  # a forked child: the parent's host and reader are not ours
            self._pid, self._host, self._deaths = os.getpid(), None, 0
        host = self._host
        if host is not None and host.proc.poll() is None:
            return host
        if self._deaths >= self.max_restarts:
            raise RewardHostBroken(
                f"the reward host died {self._deaths} times in a row ({self._last_death}); "
                "see its stderr above"
            )
        self._host = self._start()
        self._last_progress = time.monotonic()
        return self._host

    def _start(self) -> _Host:
        to_host_r, to_host_w = os.pipe()
        from_host_r, from_host_w = os.pipe()
        outbox = Connection(to_host_w, readable=False)
        inbox = Connection(from_host_r, writable=False)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        proc = None
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", ENTRY, str(to_host_r), str(from_host_w)],
                pass_fds=(to_host_r, from_host_w),
                stdin=subprocess.DEVNULL,
                env=env,
            )
            outbox.send(("init", self.num_workers, self.verify))
        except BaseException:
            outbox.close()
            inbox.close()
            if proc is not None:
                proc.kill()
                proc.wait()
            raise
        finally:
            os.close(to_host_r)
            os.close(from_host_w)
        host = _Host(proc, outbox)
        threading.Thread(
            target=self._read, args=(inbox, host), name="reward-host-reader", daemon=True
        ).start()
        return host

    def _read(self, inbox: Connection, host: _Host) -> None:
        try:
            while True:
                _, rid, outcome, value = inbox.recv()
                with self._lock:
                    future = host.pending.pop(rid, None)
                    self._deaths = 0
                    self._last_progress = time.monotonic()
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
            code = host.proc.wait()
            with self._lock:
                if self._host is host:
                    self._host = None
                if not host.stopping:
                    self._deaths += 1
                    self._last_death = f"last exit code {code}"
                lost, host.pending = list(host.pending.values()), {}
            for future in lost:
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
    parent = os.getppid()
    inbox = Connection(int(argv[0]), writable=False)
    outbox = Connection(int(argv[1]), readable=False)
    _, num_workers, ref = inbox.recv()
    verify_fn = resolve(ref)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["rstar2.reward.verify"])
    lock = threading.Lock()
    pool = ProcessPool(max_workers=num_workers, initializer=warm_up, context=context)
    try:
        while os.getppid() == parent:
            try:
                if not inbox.poll(1.0):
                    continue
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
