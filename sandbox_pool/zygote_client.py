"""The pool's handle on one zygote process: start, stop, and a queue of ready children.

A child arrives from the zygote as ``{pid, uid}`` plus four descriptors; it joins the ready queue
once it writes ``{"ready": true}``. :meth:`ZygoteHandle.release` SIGKILLs a used child's process
group and tells the zygote, which reaps it and, in batches, forks replacements. The zygote's
first message is its isolation report: a zygote that refuses to serve (a layer missing, weak
isolation not accepted) makes :meth:`ZygoteHandle.ensure_started` raise
:class:`IsolationUnavailable` with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from dataclasses import asdict, dataclass

from sandbox_pool.protocol import FrameReader, ProtocolError
from sandbox_pool.zygote import ZygoteConfig, recv_child

_SAFE_ENV_KEYS = ("PATH", "LANG", "LC_ALL", "PYTHONPATH", "VIRTUAL_ENV")
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class IsolationUnavailable(RuntimeError):
    """The sandbox cannot apply every isolation layer here; the message names what is missing."""


@dataclass
class ChildHandle:
    pid: int
    job_w: int
    res_r: int
    out_fd: int  # the call's stdout (a memfd, read with pread after the call)
    err_fd: int

    def fds(self) -> tuple[int, int, int, int]:
        return (self.job_w, self.res_r, self.out_fd, self.err_fd)


class ZygoteHandle:
    def __init__(self, config: ZygoteConfig) -> None:
        self.config = config
        self.ready: asyncio.Queue[ChildHandle] = asyncio.Queue()
        self._proc: asyncio.subprocess.Process | None = None
        self._sock: socket.socket | None = None
        self._lock = asyncio.Lock()
        self._report: asyncio.Future[list[str]] | None = None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None and self._sock is not None

    async def ensure_started(self) -> None:
        """Start the zygote unless it runs (a dead one is replaced)."""
        async with self._lock:
            if self.alive:
                return
            self.stop()
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            loop = asyncio.get_running_loop()
            self._report = loop.create_future()
            # -P: the server's working directory never lands on the children's import path.
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-P",
                "-m",
                "sandbox_pool.zygote",
                json.dumps(asdict(self.config)),
                str(theirs.fileno()),
                pass_fds=(theirs.fileno(),),
                env=_scrubbed_env(),
                cwd="/",
            )
            theirs.close()
            ours.setblocking(False)
            self._sock = ours
            loop.add_reader(ours.fileno(), self._on_child, ours)
            missing = await self._report
            if missing and not self.config.allow_weak_isolation:
                self.stop()
                raise IsolationUnavailable(
                    "sandbox isolation unavailable: missing " + "; ".join(missing)
                )

    async def take(self, timeout_s: float) -> ChildHandle:
        """A ready child (waits for one up to ``timeout_s``; TimeoutError past it)."""
        await self.ensure_started()
        return await asyncio.wait_for(self.ready.get(), timeout_s)

    def release(self, child: ChildHandle) -> None:
        """Kill the call's process group (its teardown at idle priority); the zygote reaps it."""
        set_scheduling(child.pid, os.SCHED_IDLE)
        signal_group(child.pid, signal.SIGKILL)
        for fd in child.fds():
            with contextlib.suppress(OSError):
                os.close(fd)
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.send(json.dumps({"op": "release", "pid": child.pid}).encode())

    def stop(self) -> None:
        """Ask the zygote to shut down (it kills every child) and drop the ready ones."""
        if self._sock is not None:
            with contextlib.suppress(OSError, RuntimeError):
                asyncio.get_running_loop().remove_reader(self._sock.fileno())
            with contextlib.suppress(OSError):
                self._sock.send(json.dumps({"op": "shutdown"}).encode())
            self._sock.close()
            self._sock = None
        while not self.ready.empty():
            child = self.ready.get_nowait()
            for fd in child.fds():
                with contextlib.suppress(OSError):
                    os.close(fd)

    async def wait_stopped(self, timeout_s: float = 10.0) -> None:
        if self._proc is None:
            return
        try:
            await asyncio.wait_for(self._proc.wait(), timeout_s)
        except TimeoutError:
            self._proc.kill()
            await self._proc.wait()

    def _on_child(self, sock: socket.socket) -> None:
        try:
            got = recv_child(sock)
        except BlockingIOError:
            return
        except OSError:
            got = None
        loop = asyncio.get_running_loop()
        if got is None:  # the zygote exited; the next call starts a new one
            loop.remove_reader(sock.fileno())
            if self._sock is sock:
                self._sock.close()
                self._sock = None
            if self._report is not None and not self._report.done():
                self._report.set_result(["the sandbox zygote exited before it could start"])
            return
        msg, fds = got
        if "isolation" in msg:
            if self._report is not None and not self._report.done():
                self._report.set_result(list(msg["isolation"].get("missing", [])))
            return
        os.set_blocking(fds[1], False)
        child = ChildHandle(
            pid=int(msg["pid"]), job_w=fds[0], res_r=fds[1], out_fd=fds[2], err_fd=fds[3]
        )
        loop.add_reader(child.res_r, self._on_child_ready, child)

    def _on_child_ready(self, child: ChildHandle) -> None:
        asyncio.get_running_loop().remove_reader(child.res_r)
        try:
            frames = FrameReader().feed(os.read(child.res_r, 64))
        except (OSError, ProtocolError):
            frames = []
        if frames and frames[0].get("ready"):
            self.ready.put_nowait(child)
        else:  # it died while preparing; the zygote replaces it
            self.release(child)


def signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def set_scheduling(pid: int, policy: int) -> None:
    with contextlib.suppress(OSError):
        os.sched_setscheduler(pid, policy, os.sched_param(0))


def _scrubbed_env() -> dict[str, str]:
    """The zygote (and so every child) never sees the server's secrets. This package's parent
    leads PYTHONPATH, since ``-P`` leaves the working directory off the path."""
    env = {k: os.environ[k] for k in _SAFE_ENV_KEYS if k in os.environ}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_PARENT, env.get("PYTHONPATH")]))
    return env
