"""``SandboxPool``: the embedded, in-process (asyncio) sandbox.

Two warm zygotes (:mod:`sandbox_pool.images`: ``light`` and ``heavy``) hand the pool
pre-forked, isolated children; each call goes to a ready child of the image its code
needs, is written straight to it and its end read straight back: two pipe hops, no fork. The
call's stdout and stderr are files the pool reads once it has ended, so what was printed before
a crash, an ``os._exit`` or the deadline is kept. The pool enforces the wall-clock deadline: at
the deadline it SIGKILLs the child's process group (a C++ call's deadline starts once it has
compiled; compiling has its own, ``cpp_compile_timeout_s``).

Isolation fails closed: :meth:`SandboxPool.start` raises
:class:`~sandbox_pool.zygote_client.IsolationUnavailable` when a layer cannot be applied here,
unless ``allow_weak_isolation`` is set.

Lifecycle: ``start()`` (or ``async with``) launches the zygotes; ``close()`` lets in-flight calls
finish, then stops them; a call on a closed pool raises :class:`PoolClosed`. ``drain()`` (a
server's SIGTERM) hands back what has not started: waiting and new calls raise
:class:`PoolDraining` at once, running ones finish. At most
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
from sandbox_pool.isolation import cpu_limit_s, is_root
from sandbox_pool.protocol import (
    ExecRequest,
    ExecResult,
    FrameReader,
    Limits,
    ProtocolError,
    encode_frame,
    timeout_message,
    write_all,
)
from sandbox_pool.uids import UidBlocksExhausted, claim_uid_block
from sandbox_pool.zygote import ZygoteConfig
from sandbox_pool.zygote_client import (
    ChildHandle,
    IsolationUnavailable,
    ZygoteHandle,
    set_scheduling,
    signal_group,
)

DEFAULT_UID_BASE = 1_500_000
# a snippet SIGKILLed within this much of its CPU-seconds cap was ended by the cap
CPU_LIMIT_SLACK_S = 0.25
_PIPE_CAPACITY = 65536


class _Vanished(Exception):
    """The child was gone before it received the call (killed from outside): nothing ran."""


class _Lost(Exception):
    """The call's result channel closed with no report: its zygote ended (killed, or a fork
    failed for long) while the call ran, and took the child with it. The snippet may have run
    in part; a call is stateless and isolated, so it can run again on a fresh child."""


class PoolClosed(RuntimeError):
    """The pool was closed; create a new one."""


class PoolBusy(RuntimeError):
    """The wait queue is full; retry later."""


class PoolDraining(PoolClosed):
    """The pool is draining (:meth:`SandboxPool.drain`): this call did not run; send it to
    another (or the restarted) service."""


@dataclass(frozen=True, kw_only=True)
class PoolConfig:
    num_workers: int = 0  # calls executing at once; 0: one per CPU core
    max_queued: int = 4096  # calls waiting for a worker before PoolBusy
    limits: Limits = field(default_factory=Limits)  # per-call caps; a call may ask for less
    light: Image = LIGHT
    heavy: Image = HEAVY
    # first of the unprivileged uids (root only); each pool on a host takes its own block of
    # them from here (sandbox_pool.uids), so two pools never share a uid
    uid_base: int | None = DEFAULT_UID_BASE
    startup_timeout_s: float = 60.0
    allow_weak_isolation: bool = False  # serve even where a layer cannot be applied (unsafe)
    cpp_compiler: str = "g++"
    cpp_compile_timeout_s: float = 10.0

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
        self._uid_lock: int | None = None  # a descriptor held while the pool owns its uids
        self._uids_claimed = False
        self._slots = asyncio.Semaphore(self.num_workers)
        self._draining = asyncio.Event()
        self._waiting = 0
        self._running = 0
        self._closed = False
        self.completed = 0
        self.vanished = 0  # ready children found dead when a call came (the call took another)
        self.lost = 0  # calls whose child went with its zygote mid-call (each ran again once)

    # ---- lifecycle ----

    async def __aenter__(self) -> SandboxPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Launch both zygotes and wait until each has a ready child (idempotent). When that
        fails the pool is closed (what started is stopped, its uids let go) and the error
        raised."""
        if self._closed:
            raise PoolClosed("SandboxPool is closed")
        try:
            self._claim_uids()
            for zygote in self._zygotes.values():
                child = await zygote.take(self.config.startup_timeout_s)
                zygote.ready.put_nowait(child)
        except BaseException:
            await asyncio.shield(self.aclose())
            raise

    async def aclose(self) -> None:
        """Let in-flight calls finish, then stop the zygotes. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        stopped = False
        try:
            while self._running:
                await asyncio.sleep(0.01)
            for zygote in self._zygotes.values():
                zygote.stop()
            stopped = True
            for zygote in self._zygotes.values():
                await zygote.wait_stopped()
        finally:
            # cancelled before its children were gone, the block is let go all the same: a
            # claim skips a block while processes of its uids live (sandbox_pool.uids)
            if not stopped:
                for zygote in self._zygotes.values():
                    zygote.stop()
            if self._uid_lock is not None:
                os.close(self._uid_lock)
                self._uid_lock = None

    def _claim_uids(self) -> None:
        """Take this pool's own block of uids before its zygotes first start (root only: uids
        are dropped only there). Raises IsolationUnavailable when every block is held."""
        if self._uids_claimed or self.config.uid_base is None or not is_root():
            return
        try:
            first, self._uid_lock = claim_uid_block(self.config.uid_base)
        except UidBlocksExhausted as exc:
            raise IsolationUnavailable(str(exc)) from None
        self._uids_claimed = True
        self._zygotes["light"].config = self._zygote_config(self.config.light, first)
        self._zygotes["heavy"].config = self._zygote_config(self.config.heavy, first)

    def drain(self) -> None:
        """Hand back every call that has not started (it raises :class:`PoolDraining`, now or
        when it would wait) and let running ones finish; :meth:`aclose` then stops quickly."""
        self._draining.set()

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
            await self._acquire_slot()
        finally:
            self._waiting -= 1
        if self._closed:  # closed while this call waited: its zygotes and uids are gone
            self._slots.release()
            raise PoolClosed("SandboxPool is closed")
        self._running += 1
        zygote = self._zygotes[image_for(request.code, request.language)]
        try:
            # a killed zygote takes its whole stock of ready children with it: one call may
            # find every one of them dead before a fresh one comes
            lost_once = False
            for _ in range(zygote.config.num_children + 1):
                try:
                    self._claim_uids()  # a pool used without start()
                    child = await zygote.take(self.config.startup_timeout_s)
                except (TimeoutError, IsolationUnavailable) as exc:
                    reason = str(exc) or "no sandbox process became ready"
                    return ExecResult(status="internal_error", stderr=reason)
                try:
                    return await self._call(child, request, self._limits_for(request))
                except _Vanished:  # killed before it got the code: nothing ran, take another
                    self.vanished += 1
                except _Lost:  # not the snippet's doing (it cannot reach its zygote): once more
                    self.lost += 1
                    if self._closed:  # its zygote was stopped: no new one for a closed pool
                        reason = "the sandbox pool was closed while the call ran"
                        return ExecResult(status="internal_error", stderr=reason)
                    if lost_once:
                        reason = "the sandbox process was lost twice (its zygote ended)"
                        return ExecResult(status="internal_error", stderr=reason)
                    lost_once = True
                finally:
                    zygote.release(child)
            return ExecResult(status="internal_error", stderr="sandbox process vanished")
        finally:
            self.completed += 1
            self._running -= 1
            self._slots.release()

    async def _acquire_slot(self) -> None:
        """One of the ``num_workers`` slots, or :class:`PoolDraining` when the pool drains
        first (a slot won in the same instant is given back)."""
        if self._draining.is_set():
            raise PoolDraining("the sandbox pool is draining")
        if not self._slots.locked():
            await self._slots.acquire()  # free: no wait, no tasks (the common case)
            return
        acquired = asyncio.ensure_future(self._slots.acquire())
        drained = asyncio.ensure_future(self._draining.wait())
        try:
            await asyncio.wait({acquired, drained}, return_when=asyncio.FIRST_COMPLETED)
            if self._draining.is_set():
                raise PoolDraining("the sandbox pool is draining")
        except BaseException:  # draining, or the caller cancelled: hold no slot
            if acquired.done() and not acquired.cancelled():
                self._slots.release()
            acquired.cancel()
            raise
        finally:
            drained.cancel()

    def _limits_for(self, request: ExecRequest) -> Limits:
        caps = self.config.limits
        stream_cap = caps.max_file_mb * 1024 * 1024  # no stream can be longer
        return replace(
            caps,
            timeout_s=min(request.timeout_s or caps.timeout_s, caps.timeout_s),
            memory_mb=min(request.memory_mb or caps.memory_mb, caps.memory_mb),
            max_output_chars=min(request.max_output_chars or caps.max_output_chars, stream_cap),
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
                "language": request.language,
                "mode": request.mode,
                "cpp_compiler": self.config.cpp_compiler,
            }
        )
        cpp = request.language == "cpp"
        call = _CallState(loop, limits.timeout_s)
        started = time.perf_counter()
        loop.add_reader(child.res_r, call.on_readable, child.res_r)
        try:
            try:
                if len(frame) > _PIPE_CAPACITY:  # the child drains it; keep the loop free
                    await loop.run_in_executor(None, write_all, child.job_w, frame)
                else:
                    write_all(child.job_w, frame)
            except OSError:
                raise _Vanished from None
            call.arm(self.config.cpp_compile_timeout_s if cpp else limits.timeout_s)
            msg = await call.done
            call.disarm()
        finally:
            loop.remove_reader(child.res_r)
        wall_s = time.perf_counter() - started
        if msg is _LOST:
            raise _Lost
        if msg is _TIMED_OUT:
            signal_group(child.pid, signal.SIGKILL)
        cap = limits.max_output_chars
        stdout, cut_out = _read_stream(child.out_fd, cap)
        stderr, cut_err = _read_stream(child.err_fd, cap)
        if msg is _TIMED_OUT:
            compiling = cpp and not call.compiled
            limit_s = self.config.cpp_compile_timeout_s if compiling else limits.timeout_s
            return ExecResult(
                status="timeout",
                stdout=stdout,
                stderr=_append_line(stderr, timeout_message(limit_s)),
                duration_s=wall_s,
            )
        result = _to_result(msg, stdout, stderr, wall_s, cpu_limit_s(limits.timeout_s))
        if (cut_out or cut_err) and result.status in ("ok", "error"):
            result = replace(result, status="output_limit")
        return result

    def _zygote_config(self, image: Image, uid_base: int | None = None) -> ZygoteConfig:
        lim = self.config.limits
        n = self.num_workers
        base = self.config.uid_base if uid_base is None else uid_base
        children = 3 * n + 2
        if 2 * children + 8 > 100_000:  # the light image's uids would reach the heavy one's
            raise ValueError(f"num_workers={n} is more than a uid block serves")
        return ZygoteConfig(
            num_children=children,
            low_watermark=n + 1,
            preload=image.preload,
            uid_base=None if base is None else base + (0 if image.name == "light" else 100_000),
            max_processes=lim.max_processes,
            max_file_mb=lim.max_file_mb,
            max_open_files=lim.max_open_files,
            allow_weak_isolation=self.config.allow_weak_isolation,
        )


_TIMED_OUT: dict[str, Any] = {"timed_out": True}
_LOST: dict[str, Any] = {"lost": True}  # EOF: neither the child nor its zygote reported


class _CallState:
    """The pool's side of one running call: the frames it reports and its deadline timer.

    A C++ call reports ``{"started": true}`` once compiled: the deadline restarts there."""

    def __init__(self, loop: asyncio.AbstractEventLoop, run_timeout_s: float) -> None:
        self.loop = loop
        self.run_timeout_s = run_timeout_s
        self.done: asyncio.Future[dict[str, Any]] = loop.create_future()
        self.reader = FrameReader()
        self.timer: asyncio.TimerHandle | None = None
        self.compiled = False

    def arm(self, timeout_s: float) -> None:
        self.disarm()
        self.timer = self.loop.call_later(timeout_s, self._expire)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expire(self) -> None:
        if not self.done.done():
            self.done.set_result(_TIMED_OUT)

    def on_readable(self, fd: int) -> None:
        if self.done.done():
            return
        try:
            data = os.read(fd, 1 << 16)
            frames = self.reader.feed(data) if data else [_LOST]
        except (OSError, ProtocolError) as exc:
            frames = [{"status": "internal_error", "stderr": f"bad result channel: {exc}"}]
        for frame in frames:
            if frame.get("started"):
                self.compiled = True
                self.arm(self.run_timeout_s)
                continue
            self.done.set_result(frame)
            return


def _to_result(
    msg: dict[str, Any], stdout: str, stderr: str, wall_s: float, cpu_cap_s: float
) -> ExecResult:
    if "died" in msg:  # the process ended without reporting (a crash, a signal, posix._exit)
        code = int(msg["died"])
        cpu_s = msg.get("cpu_s")
        # RLIMIT_CPU (soft = hard) ends a snippet with SIGKILL (SIGXCPU on some kernels); a
        # SIGKILL from anywhere else (the OOM killer, an operator) is named as such
        at_cpu_limit = cpu_s is not None and float(cpu_s) >= cpu_cap_s - CPU_LIMIT_SLACK_S
        if code - 128 == signal.SIGXCPU or (code - 128 == signal.SIGKILL and at_cpu_limit):
            stderr = _append_line(stderr, "TimeoutError: CPU time limit exceeded")
            return ExecResult(status="timeout", stdout=stdout, stderr=stderr, duration_s=wall_s)
        if code > 128:
            name = str(code - 128)
            with contextlib.suppress(ValueError):
                name = signal.Signals(code - 128).name
            stderr = _append_line(stderr, f"the snippet was killed by signal {name}")
        return ExecResult(
            status="ok" if code == 0 else "error",
            stdout=stdout,
            stderr=stderr,
            exit_code=code,
            duration_s=wall_s,
        )
    if msg.get("status") == "internal_error":
        return ExecResult(status="internal_error", stderr=str(msg.get("stderr", "")))
    try:
        reported = ExecResult.from_json(msg)
    except (ProtocolError, TypeError, ValueError):
        return ExecResult(status="internal_error", stderr="malformed result from sandbox")
    return replace(reported, stdout=stdout, stderr=stderr)


def _read_stream(fd: int, cap_chars: int) -> tuple[str, bool]:
    """The first ``cap_chars`` characters of a call's output file, and whether it was longer."""
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, min(size, 4 * cap_chars), 0) if size else b""
    except OSError:
        return "", False
    text = data.decode("utf-8", "replace")
    return text[:cap_chars], len(data) < size or len(text) > cap_chars


def _append_line(text: str, line: str) -> str:
    if text and not text.endswith("\n"):
        text += "\n"
    return text + line
