"""The fault-injection harness the fault tests share (issue #21 item 7): real processes and
real signals, nothing mocked of the part that fails.

- :func:`kill_engine_core`: SIGKILL one vLLM engine-core process under a trainer or test;
- :func:`frozen`: SIGSTOP a process (a hung engine core: alive, answering nothing), SIGKILLed
  on exit;
- :func:`kill_group`: SIGKILL a process group (a sandbox worker and its zygotes, a trainer's
  engines and hosts after it died);
- :func:`start_redis`, :class:`RestartableRedis`: a redis-server, and one restarted on the
  same port and data dir;
- :class:`RestartableSandboxServer`: ``sandbox-pool serve``, crashed (SIGKILL), stopped
  (SIGTERM) and started again on the same port;
- :func:`wait_answered`: wait until a share of concurrent calls has been answered (to place a
  fault mid-load);
- :func:`train_until_failpoint`: ``rstar2 train`` SIGKILLed by itself at a named point
  (:mod:`rstar2.failpoints`: during rollout, during the learner step, mid checkpoint write);
- :func:`small_tmpfs`: a real tmpfs of a few MiB, to fill a disk;
- :func:`train_into_step_2`, :func:`sigterm_group`, :func:`kill_if_running`,
  :func:`wait_until_group_is_gone`, :func:`wait_until_gone`: a ``rstar2 train`` stopped
  mid-step as Slurm and systemd stop one, and the checks that it left no process behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from rstar2.failpoints import ENV as FAILPOINTS_ENV
from tests.conftest import REPO


def kill_engine_core(root_pid: int, expect: int = 1, which: int = -1) -> int:
    """SIGKILL the ``which``-th of the ``expect`` engine-core processes under ``root_pid``;
    returns its pid. Fails when the count differs (the fault would land elsewhere)."""
    from tests.helpers.processes import engine_cores

    cores = engine_cores(root_pid, expect)
    cores[which].kill()
    return cores[which].pid


@contextlib.contextmanager
def frozen(pid: int) -> Iterator[int]:
    """SIGSTOP ``pid`` for the block (a hung process: it exists, holds its sockets, does
    nothing); SIGKILL on exit, so nothing stays stopped behind a test."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def kill_group(pid: int) -> None:
    """SIGKILL process group ``pid`` (gone already: nothing to do)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def train_until_failpoint(point: str, *args: str, timeout_s: float = 600) -> str:
    """``rstar2 train *args`` with ``point`` (e.g. ``"learn@3"``) armed, in its own session;
    asserts the trainer died by its own SIGKILL there (not by an error, not by finishing), then
    SIGKILLs what it left in its group (engines, hosts) as an operator's cleanup would.
    Returns the trainer's output (through a file: its orphans would hold a pipe open)."""
    env = {**os.environ, FAILPOINTS_ENV: point}
    cmd = [sys.executable, "-m", "rstar2.cli", "train", *args]
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            proc.wait(timeout=timeout_s)
        finally:
            kill_group(proc.pid)
            proc.wait()
        out.seek(0)
        text = out.read()
    assert proc.returncode == -signal.SIGKILL, f"{point}: exit {proc.returncode}\n{text[-3000:]}"
    return text


def free_port() -> int:
    """A TCP port on 127.0.0.1 free at the time of the call."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(port: int, *args: str) -> subprocess.Popen[bytes]:
    """redis-server on 127.0.0.1:``port`` (extra config ``args``), once it accepts connections."""
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", *args],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    return proc


class RestartableRedis:
    """A redis-server with an append-only file fsynced per write (an acknowledged write is on
    disk, see sandbox_pool.redis_queue), restartable on the same port and data dir."""

    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._args = ("--dir", str(data_dir), "--save", "", "--appendonly", "yes")
        self._args += ("--appendfsync", "always")
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        return start_redis(self.port, *self._args)

    def restart(self) -> None:
        self.stop()
        self.proc = self._start()

    def stop(self) -> None:
        self.proc.terminate()  # SIGTERM: redis-server shuts down cleanly, AOF flushed
        self.proc.wait(timeout=30)


class RestartableSandboxServer:
    """``sandbox-pool serve`` on 127.0.0.1 in its own session (its zygotes in its process
    group), restartable on the same port; its stderr goes to ``log_dir``."""

    def __init__(self, log_dir: Path, workers: int = 2) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log_dir = log_dir
        self._workers = workers
        self.starts = 0
        self.proc = self.start()

    def start(self) -> subprocess.Popen[bytes]:
        """A new server, once its /healthz answers (60 s at most: a loaded machine)."""
        self.starts += 1
        log = open(self._log_dir / f"serve-{self.starts}.log", "wb")  # noqa: SIM115 (the child's)
        cmd = [sys.executable, "-m", "sandbox_pool.cli", "serve", "--port", str(self.port)]
        cmd += ["--workers", str(self._workers)]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=log, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 60
        while not self._healthy():
            assert self.proc.poll() is None, f"serve exited {self.proc.returncode}"
            assert time.monotonic() < deadline, "serve did not answer /healthz in 60 s"
            time.sleep(0.05)
        return self.proc

    def _healthy(self) -> bool:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as answer:
                return bool(answer.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def crash(self) -> None:
        """SIGKILL the server's process group (the server and its zygotes)."""
        kill_group(self.proc.pid)
        self.proc.wait()

    def terminate(self, group: bool = True, timeout_s: float = 120) -> tuple[float, int]:
        """SIGTERM the server's process group (``group``: as systemd, Slurm or ``docker
        stop`` of a shell-less container would) or the server alone; returns (seconds to
        exit, exit code). ``timeout_s`` catches a hang, not a slow stop."""
        start = time.monotonic()
        if group:
            os.killpg(self.proc.pid, signal.SIGTERM)
        else:
            self.proc.terminate()
        try:
            code = self.proc.wait(timeout=timeout_s)
        finally:
            kill_group(self.proc.pid)  # what a hung stop left
        return time.monotonic() - start, code


async def wait_answered(calls: Sequence[asyncio.Future[Any]], fraction: float) -> None:
    """Until ``fraction`` of the calls are answered (or 60 s pass: then the fault runs anyway,
    later in the load than planned, which a loaded machine may need)."""
    deadline = time.monotonic() + 60
    while sum(c.done() for c in calls) < fraction * len(calls) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


@contextlib.contextmanager
def small_tmpfs(mount: Path, size_mib: int = 3) -> Iterator[Path]:
    """A real ``size_mib`` MiB tmpfs at ``mount`` (skips the test where mounting needs root
    this process lacks); unmounted on exit."""
    mount.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(mount)])
    if done.returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def train_into_step_2(config_file: Path, run_dir: Path, *args: str) -> subprocess.Popen[str]:
    """``rstar2 train`` in its own session (pipes captured), returned once step 1 is logged
    and step 2 is under way (or the run ended, or 400 s passed)."""
    cmd = [sys.executable, "-m", "rstar2.cli", "train", "--config", str(config_file)]
    proc = subprocess.Popen(
        [*cmd, *args, "--run-dir", str(run_dir)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 400
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if metrics.is_file() and '"reward_mean"' in metrics.read_text():
                break
            time.sleep(0.05)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return proc


def sigterm_group(proc: subprocess.Popen[str], label: str) -> tuple[str, str]:
    """SIGTERM ``proc``'s whole process group (as Slurm and systemd stop a run); its output
    once it exited, and the time that took printed after ``label``."""
    stopping = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=300)  # a hang, not a slow stop on a loaded machine
    print(f"\n{label}: {time.monotonic() - stopping:.1f} s")
    return out, err


def kill_if_running(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_until_group_is_gone(pgid: int, timeout_s: float = 60) -> None:
    """Every process of the run's session has exited (engines, zygotes, reward workers)."""
    deadline = time.monotonic() + timeout_s  # generous: a loaded machine reaps slowly
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    left = subprocess.run(["ps", "-o", "pid,args", "-g", str(pgid)], capture_output=True, text=True)
    raise AssertionError(f"processes left behind:\n{left.stdout}")


def wait_until_gone(match: Callable[[Any], bool], what: str, timeout_s: float = 60) -> None:
    """No process ``match`` accepts is left (Ray's own processes live in groups of their
    own; a loaded machine reaps slowly)."""
    import psutil

    def left() -> list[str]:
        found = []
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if match(p):
                    found.append(" ".join(p.cmdline())[:200])
        return found

    deadline = time.monotonic() + timeout_s
    while left() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left(), f"processes of {what} left behind: {left()}"
