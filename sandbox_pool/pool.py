"""``SandboxPool``: the embedded, in-process (asyncio) sandbox.

Two warm zygotes (:mod:`sandbox_pool.images`: ``light`` and ``heavy``) hand the pool
pre-forked, isolated children; each call goes to a ready child of the image its code
needs, is written straight to it and its result read straight back: two pipe hops, no fork.
The pool enforces the wall-clock deadline: at the deadline it SIGKILLs the child's process group.

Lifecycle: ``start()`` (or ``async with``) launches the zygotes; ``close()`` lets in-flight calls
finish, then stops them; a call on a closed pool raises :class:`PoolClosed`. At most
``num_workers`` calls execute at once; up to ``max_queued`` more wait; past that
:class:`PoolBusy` (the HTTP server answers 429). A zygote that dies is restarted by the next
call; every call is answered with a result, ``internal_error`` at worst.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass, field, replace
from typing import Any

from sandbox_pool.api import SandboxAPI
from sandbox_pool.images import HEAVY, LIGHT, Image, ImageName, image_for
from sandbox_pool.protocol import (
    ExecRequest,
    ExecResult,
    FrameReader,
    Limits,
    ProtocolError,
    encode_frame,
)
from sandbox_pool.zygote import ZygoteConfig
from sandbox_pool.zygote_client import ChildHandle, ZygoteHandle, set_scheduling, signal_group

DEFAULT_UID_BASE = 1_500_000
_PIPE_CAPACITY = 65536


class PoolClosed(RuntimeError):
    """The pool was closed; create a new one."""


class PoolBusy(RuntimeError):
    """The wait queue is full; retry later."""


@dataclass(frozen=True, kw_only=True)
class PoolConfig:
    num_workers: int = 0  # calls executing at once; 0: one per CPU core
    max_queued: int = 4096  # calls waiting for a worker before PoolBusy
    limits: Limits = field(default_factory=Limits)  # per-call caps; a call may ask for less
    light: Image = LIGHT
    heavy: Image = HEAVY
    uid_base: int | None = DEFAULT_UID_BASE  # first of the unprivileged uids (root only)
    startup_timeout_s: float = 60.0

    def resolved_workers(self) -> int:
        return self.num_workers or os.cpu_count() or 1


class SandboxPool(SandboxAPI):
    """Runs Python snippets in isolated, pre-forked processes. See the module docstring."""

    def __init__(self, config: PoolConfig | None = None, **overrides: Any) -> None:
        cfg = config or PoolConfig()
        self.config = replace(cfg, **overrides) if overrides else cfg
        self.num_workers = self.config.resolved_workers()
        self._zygotes: dict[ImageName, ZygoteHandle] = {
            "light": ZygoteHandle(self._zygote_config(self.config.light)),
            "heavy": ZygoteHandle(self._zygote_config(self.config.heavy)),
        }
        self._slots = asyncio.Semaphore(self.num_workers)
        self._waiting = 0
        self._running = 0
        self._closed = False
        self.completed = 0

    # ---- lifecycle ----

    async def __aenter__(self) -> SandboxPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Launch both zygotes and wait until each has a ready child (idempotent)."""
        if self._closed:
            raise PoolClosed("SandboxPool is closed")
        for zygote in self._zygotes.values():
            child = await zygote.take(self.config.startup_timeout_s)
            zygote.ready.put_nowait(child)

    async def close(self) -> None:
        """Let in-flight calls finish, then stop the zygotes. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        while self._running:
            await asyncio.sleep(0.01)
        for zygote in self._zygotes.values():
            zygote.stop()
        for zygote in self._zygotes.values():
            await zygote.wait_stopped()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_flight(self) -> int:
        return self._running

    @property
    def queued(self) -> int:
        return self._waiting

    def status(self) -> dict[str, Any]:
        return {
            "num_workers": self.num_workers,
            "in_flight": self._running,
            "queued": self._waiting,
            "completed": self.completed,
            "ready": {name: z.ready.qsize() for name, z in self._zygotes.items()},
        }

    async def wait_warm(self, timeout_s: float = 30.0) -> None:
        """Wait until every image has its full stock of ready children (benchmarks use this)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline and any(
            z.ready.qsize() < z.config.num_children for z in self._zygotes.values()
        ):
            await asyncio.sleep(0.05)

    # ---- calls (run and run_batch come from SandboxAPI) ----

    async def execute(self, request: ExecRequest) -> ExecResult:
        if self._closed:
            raise PoolClosed("SandboxPool is closed")
        if self._waiting >= self.config.max_queued:
            raise PoolBusy(f"{self._waiting} calls already waiting")
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        self._running += 1
        zygote = self._zygotes[image_for(request.code)]
        try:
            child = await zygote.take(self.config.startup_timeout_s)
        except TimeoutError:
            self._running -= 1
            self._slots.release()
            return ExecResult(status="internal_error", stderr="no sandbox process became ready")
        try:
            return await self._call(child, request, self._limits_for(request))
        finally:
            zygote.release(child)
            self.completed += 1
            self._running -= 1
            self._slots.release()

    def _limits_for(self, request: ExecRequest) -> Limits:
        caps = self.config.limits
        return replace(
            caps,
            timeout_s=min(request.timeout_s or caps.timeout_s, caps.timeout_s),
            memory_mb=min(request.memory_mb or caps.memory_mb, caps.memory_mb),
        )

    async def _call(self, child: ChildHandle, request: ExecRequest, limits: Limits) -> ExecResult:
        loop = asyncio.get_running_loop()
        set_scheduling(child.pid, os.SCHED_OTHER)
        frame = encode_frame(
            {
                "code": request.code,
                "stdin": request.stdin,
                "timeout_s": limits.timeout_s,
                "memory_mb": limits.memory_mb,
                "max_output_chars": limits.max_output_chars,
            }
        )
        done: asyncio.Future[dict[str, Any]] = loop.create_future()
        started = time.perf_counter()
        loop.add_reader(child.res_r, _on_result, child.res_r, FrameReader(), done)
        try:
            try:
                if len(frame) > _PIPE_CAPACITY:  # the child drains it; keep the loop free
                    await loop.run_in_executor(None, _write_all, child.job_w, frame)
                else:
                    _write_all(child.job_w, frame)
            except OSError:
                return ExecResult(status="internal_error", stderr="sandbox process vanished")
            timer = loop.call_later(limits.timeout_s, _expire, done)
            msg = await done
            timer.cancel()
            if msg is _TIMED_OUT:
                signal_group(child.pid, signal.SIGKILL)
                return ExecResult(
                    status="timeout",
                    stderr=f"TimeoutError: execution exceeded {limits.timeout_s:g} s",
                    duration_s=time.perf_counter() - started,
                )
            return _to_result(msg, time.perf_counter() - started)
        finally:
            loop.remove_reader(child.res_r)

    def _zygote_config(self, image: Image) -> ZygoteConfig:
        lim = self.config.limits
        n = self.num_workers
        return ZygoteConfig(
            num_children=3 * n + 2,
            low_watermark=n + 1,
            preload=image.preload,
            uid_base=None
            if self.config.uid_base is None
            else self.config.uid_base + (0 if image.name == "light" else 100_000),
            max_processes=lim.max_processes,
            max_file_mb=lim.max_file_mb,
            max_open_files=lim.max_open_files,
        )


_TIMED_OUT: dict[str, Any] = {"timed_out": True}


def _expire(done: asyncio.Future[dict[str, Any]]) -> None:
    if not done.done():
        done.set_result(_TIMED_OUT)


def _on_result(fd: int, reader: FrameReader, done: asyncio.Future[dict[str, Any]]) -> None:
    if done.done():
        return
    try:
        data = os.read(fd, 1 << 16)
        frames = reader.feed(data) if data else [{"died": -1}]
    except (OSError, ProtocolError) as exc:
        frames = [{"status": "internal_error", "stderr": f"bad result channel: {exc}"}]
    if frames:
        done.set_result(frames[0])


def _to_result(msg: dict[str, Any], wall_s: float) -> ExecResult:
    if "died" in msg:  # the runner ended without writing a result
        code = int(msg["died"])
        if code - 128 in (signal.SIGXCPU, signal.SIGKILL):
            return ExecResult(
                status="timeout", stderr="TimeoutError: CPU time limit exceeded", duration_s=wall_s
            )
        reason = "the snippet ended without a result"
        if code > 128:
            with contextlib.suppress(ValueError):
                reason = f"the snippet was killed by signal {signal.Signals(code - 128).name}"
        return ExecResult(status="error", stderr=reason, duration_s=wall_s)
    try:
        return ExecResult.from_json(msg)
    except (ProtocolError, TypeError, ValueError):
        return ExecResult(status="internal_error", stderr="malformed result from sandbox")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
