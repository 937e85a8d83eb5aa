"""The zygote: a warm process that pre-forks isolated children ahead of demand, and reaps them.

Started by :class:`sandbox_pool.pool.SandboxPool` as ``python -P -m sandbox_pool.zygote CONFIG``
with a scrubbed environment and one end of a SOCK_SEQPACKET socket pair. It imports the
configured modules once (BLAS thread counts set to 1 first), applies its own isolation layers
and probes the per-child ones, and sends the pool one report ``{"isolation": {"missing": [...]}}``;
with something missing it exits unless weak isolation was accepted. Then it keeps
``num_children`` children outstanding: each is forked, isolated, and handed to the pool as one
message ``{pid, uid}`` with four descriptors (the pipe the call is written to, the pipe its
result comes back on, and its stdout and stderr, two memfds the pool reads after the call).
A child writes ``{"ready": true}`` on its result pipe once it is isolated; the pool only hands
calls to ready children and talks to them directly, so neither a fork, a child's preparation nor
this process is on a call's latency path.

Messages from the pool: ``{"op": "release", "pid": P}`` once the pool has SIGKILLed child P's
process group (the zygote reaps it, frees its uid, and forks a replacement), and
``{"op": "shutdown"}``. EOF on the socket also means shutdown.

Each child is one process, PID 1 of its own PID and IPC namespaces (so when it dies the kernel
kills everything it started), in a mount namespace with a private /tmp and a network namespace
that no other running call shares (reused, and its /tmp emptied, once the call has ended:
:mod:`sandbox_pool.namespaces`). The zygote
keeps a copy of each child's result pipe: if a child ends without writing a result, the zygote
writes ``{"died": code, "cpu_s": seconds}`` (its exit code, 128 + signal number when killed, and
the CPU time it used) so the pool always learns how the call ended. A fork that fails is tried
again; forks failing for :data:`FORK_FAILURES_FATAL_AFTER_S` end the zygote.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import selectors
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from sandbox_pool import isolation, runner, seccomp
from sandbox_pool.child import CALL_DIR, child_main
from sandbox_pool.namespaces import CallNamespaces
from sandbox_pool.protocol import encode_frame

# Under load the stock is refilled in batches (at low_watermark); once no message has come for
# this long, it is topped up to num_children, so an idle pool always has its full stock.
TOP_UP_AFTER_S = 0.05
# A fork that fails (EAGAIN or ENOMEM on a loaded machine) is tried again on the loop's next pass;
# only forks failing for this long end the zygote, and with it every call in flight (the pool
# starts a new one and runs those calls again)
FORK_FAILURES_FATAL_AFTER_S = 10.0
BLAS_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")


@dataclass(frozen=True, kw_only=True)
class ZygoteConfig:
    num_children: int = 3  # children outstanding at the pool (ready + busy) after a refill
    low_watermark: int = 1  # refill (and reap released children) when outstanding <= this
    preload: tuple[str, ...] = ()
    root_dir: str | None = None  # weak isolation only: where per-call temp dirs go
    uid_base: int | None = None  # None: no uid drop (a missing layer)
    allow_weak_isolation: bool = False  # serve even when a layer cannot be applied
    max_processes: int = 16
    max_file_mb: int = 16
    max_open_files: int = 64
    tmp_size_mb: int = 256  # each call's private /tmp

    @classmethod
    def from_json(cls, text: str) -> ZygoteConfig:
        data = json.loads(text)
        data["preload"] = tuple(data.get("preload", ()))
        return cls(**data)


@dataclass
class Child:
    pid: int
    uid: int | None
    workdir: str | None  # weak isolation only (an isolated child's temp dir dies with it)
    res_w: int  # the zygote's copy: for the "died" report, closed once the child is reaped
    slot: CallNamespaces | None  # its namespaces (reset and reused once the child is reaped)


class ForkFailures:
    """Since when forks have failed without a success in between, and whether for too long."""

    def __init__(self, fatal_after_s: float = FORK_FAILURES_FATAL_AFTER_S) -> None:
        self.fatal_after_s = fatal_after_s
        self.since: float | None = None

    def failed(self, now_s: float) -> bool:
        """Record a failure at ``now_s`` (monotonic); True once failures have lasted
        ``fatal_after_s``."""
        if self.since is None:
            self.since = now_s
        return now_s - self.since >= self.fatal_after_s

    def succeeded(self) -> None:
        self.since = None


class IsolationRefused(RuntimeError):
    """A layer of isolation could not be applied and weak isolation was not accepted."""


class Zygote:
    def __init__(self, cfg: ZygoteConfig, sock: socket.socket) -> None:
        self.cfg = cfg
        self.sock = sock
        self.use_uids = cfg.uid_base is not None and isolation.is_root()
        self.free_uids: deque[int] = deque()
        if cfg.uid_base is not None and self.use_uids:
            self.free_uids.extend(range(cfg.uid_base, cfg.uid_base + 2 * cfg.num_children + 8))
        self.keeps: tuple[str, ...] = ()
        self.free_slots: deque[CallNamespaces] = deque()
        self.missing = self._set_up_isolation()
        self.deny_keyrings = _keyring_filter_works()
        if not self.deny_keyrings:
            self.missing.append("a seccomp filter denying kernel keyrings (the kernel refused)")
        self.isolated = isolation.is_root() and not any("namespace" in m for m in self.missing)
        report = {"isolation": {"missing": self.missing}}
        self.sock.send(json.dumps(report).encode())
        if self.missing and not cfg.allow_weak_isolation:
            raise IsolationRefused("; ".join(self.missing))
        self.root_dir = None
        if not self.isolated:
            self.root_dir = cfg.root_dir or tempfile.mkdtemp(prefix="sandbox-pool-")
            if self.use_uids:  # the calls' uids must reach their own dirs (not list the others)
                os.chmod(self.root_dir, 0o711)
        isolation.scrub_environment("/tmp" if self.isolated else str(self.root_dir))
        self.outstanding: dict[int, Child] = {}  # handed to the pool, not released yet
        self.dying: dict[int, Child] = {}  # released (killed by the pool), not reaped yet
        self.fork_failures = ForkFailures()
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)  # SIGCHLD wakes the loop up to reap
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def _set_up_isolation(self) -> list[str]:
        """Apply the zygote-wide layers and probe the per-child ones; return what is missing."""
        if not isolation.is_root():
            return ["per-call uids, PID/mount/network namespaces and a private /tmp (needs root)"]
        missing = [] if self.use_uids else ["per-call uids (uid_base is None)"]
        plan = isolation.python_visibility_plan() if self.use_uids else []
        missing += isolation.enter_zygote_namespace(plan)
        if isolation.CHROOTED in missing:
            return missing  # no namespace work: it would put this process on the host's root
        try:
            self.keeps = isolation.tmp_keeps()
        except ValueError as exc:
            return [*missing, f"a private /tmp per call: {exc}"]
        problem = self._probe_child()
        if problem:
            missing.append(f"per-call PID/mount/network namespaces: {problem}")
        return missing

    def _probe_child(self) -> str:
        """Make one slot of namespaces and fork one isolated child that enters it and exits:
        '' if that works."""
        try:
            slot = CallNamespaces.create(self.keeps, self.cfg.tmp_size_mb)
        except OSError as exc:
            return f"a private /tmp and network: {exc}"
        try:
            pid = isolation.fork_into_namespaces(True)
        except OSError as exc:
            slot.close()
            return str(exc)
        if pid == 0:
            try:
                slot.enter()
            except BaseException:
                os._exit(1)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        self.free_slots.append(slot)
        if os.waitstatus_to_exitcode(status) != 0:
            return "a private /tmp or network namespace could not be entered"
        return ""

    def serve(self) -> None:
        isolation.become_subreaper()
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ)
        sel.register(self.wake_r, selectors.EVENT_READ)
        idle = False
        while True:
            low = len(self.outstanding) <= self.cfg.low_watermark
            if (low or idle) and not self._refill():
                return
            under = len(self.outstanding) < self.cfg.num_children
            events = sel.select(TOP_UP_AFTER_S if under else None)
            idle = not events  # quiet for a moment: top the stock up (uids permitting)
            for key, _ in events:
                if key.fileobj is self.sock and not self._on_message():
                    return
                if key.fileobj == self.wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_r, 4096)
            self._reap()

    def _refill(self) -> bool:
        """Fork replacements in one batch; False if the pool left.

        Batching keeps forks off most calls' way: between batches the pool serves calls from
        ready children while the zygote sleeps.
        """
        for pid in self.dying:  # the pool kills them; this only covers a pool that could not
            _kill(pid)
        while len(self.outstanding) < self.cfg.num_children and self._uid_available():
            try:
                sent = self._fork_child()
            except OSError as exc:
                if self.fork_failures.failed(time.monotonic()):
                    print(
                        f"sandbox zygote: forks failing for {self.fork_failures.fatal_after_s:.0f}"
                        f" s ({exc}): exiting, the pool starts another",
                        file=sys.stderr,
                    )
                    return False
                return True  # tried again on the loop's next pass
            self.fork_failures.succeeded()
            try:
                self._hand_out(sent)
            except OSError:  # the pool is gone
                return False
        return True

    def _on_message(self) -> bool:
        """Handle one message from the pool; False means shut down."""
        try:
            data = self.sock.recv(4096)
        except BlockingIOError:
            return True
        except OSError:  # the pool went away
            return False
        if not data:
            return False
        msg = json.loads(data)
        if msg.get("op") == "shutdown":
            return False
        if msg.get("op") == "release":
            child = self.outstanding.pop(int(msg["pid"]), None)
            if child is not None and child.res_w < 0:  # already reaped (it died on its own)
                self._cleanup(child)
            elif child is not None:
                self.dying[child.pid] = child
        return True

    def _hand_out(self, sent: tuple[Child, list[int]]) -> None:
        child, fds = sent
        self.outstanding[child.pid] = child
        msg = json.dumps({"pid": child.pid, "uid": child.uid}).encode()
        try:
            socket.send_fds(self.sock, [msg], fds)
        finally:
            for fd in fds:
                os.close(fd)

    def _uid_available(self) -> bool:
        return bool(self.free_uids) or not self.use_uids

    def _fork_child(self) -> tuple[Child, list[int]]:
        """Fork one child; on failure (OSError) everything taken for it is given back."""
        uid = self.free_uids.popleft() if self.use_uids else None
        workdir: str | None = None
        slot: CallNamespaces | None = None
        fds: list[int] = []
        try:
            if not self.isolated:
                workdir = tempfile.mkdtemp(dir=self.root_dir, prefix="call-")
                if uid is not None:
                    os.chown(workdir, uid, uid)
            else:
                slot = self._take_slot()
            fds += [os.memfd_create("stdout"), os.memfd_create("stderr")]
            fds += [*os.pipe(), *os.pipe()]
            pid = isolation.fork_into_namespaces(self.isolated)
        except OSError:
            for fd in fds:
                os.close(fd)
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
            if uid is not None:
                self.free_uids.appendleft(uid)
            if slot is not None:
                self.free_slots.appendleft(slot)
            raise
        out_fd, err_fd, job_r, job_w, res_r, res_w = fds
        if pid == 0:
            stdio = (out_fd, err_fd)
            child_main(self.cfg, workdir, uid, slot, job_r, res_w, stdio, self.deny_keyrings)
        os.close(job_r)
        # res_w stays blocking: O_NONBLOCK would be shared with the child's copy. The zygote
        # only writes a ~20-byte "died" report to it, which never blocks.
        child = Child(pid=pid, uid=uid, workdir=workdir, res_w=res_w, slot=slot)
        return child, [job_w, res_r, out_fd, err_fd]

    def _take_slot(self) -> CallNamespaces:
        if self.free_slots:
            return self.free_slots.popleft()
        return CallNamespaces.create(self.keeps, self.cfg.tmp_size_mb)

    def _reap(self) -> None:
        """Reap every exited descendant (we are their subreaper) and settle its call."""
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.outstanding.get(pid)
            if child is not None:  # ended while the pool holds it: say how
                code = os.waitstatus_to_exitcode(status)
                report = {
                    "died": 128 - code if code < 0 else code,
                    "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),  # tells a CPU cap kill
                }
                with contextlib.suppress(OSError):
                    os.write(child.res_w, encode_frame(report))
                os.close(child.res_w)
                child.res_w = -1
                continue
            child = self.dying.pop(pid, None)
            if child is not None:
                os.close(child.res_w)
                self._cleanup(child)

    def _cleanup(self, child: Child) -> None:
        if child.workdir is not None:
            shutil.rmtree(child.workdir, ignore_errors=True)
        if child.uid is not None:
            self.free_uids.append(child.uid)  # reusable: its PID namespace is gone
        if child.slot is not None:  # every process of the call has ended
            if child.slot.reset():
                self.free_slots.append(child.slot)
            else:
                child.slot.close()

    def shutdown(self) -> None:
        for child in list(self.outstanding.values()):
            del self.outstanding[child.pid]
            if child.res_w < 0:
                self._cleanup(child)
            else:
                self.dying[child.pid] = child
        for pid in self.dying:
            _kill(pid)
        deadline = time.monotonic() + 5
        while self.dying and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.005)
        if self.root_dir is not None:
            shutil.rmtree(self.root_dir, ignore_errors=True)


def _keyring_filter_works() -> bool:
    """Whether a forked process can install :mod:`sandbox_pool.seccomp`'s filter."""
    try:
        seccomp.prepare()
    except ValueError:  # no filter for this machine
        return False
    pid = os.fork()
    if pid == 0:
        try:
            isolation.set_no_new_privs()
            seccomp.deny_keyrings()
        except BaseException:
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def _kill(pid: int) -> None:
    """SIGKILL a child and its process group (a child forked a moment ago may not have called
    setsid yet, so it is not a group leader: the group kill alone would miss it)."""
    for kill in (os.kill, os.killpg):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


def _preload(modules: tuple[str, ...]) -> None:
    for var in BLAS_ENV:
        os.environ[var] = "1"
    for name in modules:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def _on_sigterm(zygote: int, parent: int) -> None:
    """The zygote exits when the pool's process is gone (the parent-death signal). A SIGTERM
    to the whole process group (systemd, Slurm, ``kill -TERM -PGID``) while the pool lives is
    left to the pool: it stops this zygote (``shutdown`` over the socket) once its running
    calls have finished, which exiting now would kill. A child still being prepared (forked,
    not yet in its own session) ignores it likewise: the zygote owns it."""
    if os.getpid() == zygote and os.getppid() != parent:
        sys.exit(0)


def main() -> None:
    cfg = ZygoteConfig.from_json(sys.argv[1])
    sock = socket.socket(fileno=int(sys.argv[2]))
    # Nothing an imported module prints may reach a child's stdio: stdin from /dev/null,
    # stdout to stderr.
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    own_pid, parent = os.getpid(), os.getppid()
    isolation.set_parent_death_signal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: _on_sigterm(own_pid, parent))
    _preload(cfg.preload)
    # Forking and preparing children is background work: it yields the CPU to running calls.
    # The pool raises a child to normal priority when it hands it a call.
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    try:
        zygote = Zygote(cfg, sock)
    except IsolationRefused:  # the pool has the report and says why, once
        sys.exit(3)
    runner.prebuild(CALL_DIR if zygote.isolated else None)
    gc.freeze()  # children never scan (and so never copy) what the zygote allocated
    try:
        zygote.serve()
    finally:
        zygote.shutdown()


def recv_child(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """Pool side: receive one message (a child's, with its descriptors, or the isolation
    report, without); None at EOF."""
    msg, fds, _flags, _addr = socket.recv_fds(sock, 4096, 4)
    if not msg:
        for fd in fds:
            os.close(fd)
        return None
    data: dict[str, Any] = json.loads(msg)
    return data, list(fds)


if __name__ == "__main__":
    main()
