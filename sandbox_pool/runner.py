"""What a sandbox child does with one call: run it as ``python3 -u main.py`` would.

The child is already isolated (:mod:`sandbox_pool.isolation`); fds 1 and 2 are files the pool
reads after the call. Guarantees, in both modes:
- stdin, stdout and stderr are real file descriptors: ``sys.stdout.buffer``, ``fileno()``,
  ``open(0)``, ``os.write(1, ...)``, ``os.system`` and child processes behave as in a script
  whose streams are redirected to files. Output is unbuffered (``python3 -u``), so what was
  printed survives ``os._exit``, a crash and a timeout.
- The code is the file ``main.py`` in the call's working directory: ``sys.argv == [path]``,
  ``__file__`` is that path, ``sys.path[0]`` its directory, tracebacks show its lines.
- The call ends when the script and every process it started have ended: the interpreter's
  own shutdown runs (non-daemon threads joined, atexit handlers), then lingering child
  processes are waited for (the pool's deadline bounds the wait).
- ``os._exit(n)`` in the call's own process reports ``n`` before exiting (so the pool does not
  wait for the zygote to reap the process); the stdlib function is replaced in sandbox
  processes only (the zygote and its children), here and nowhere else. A process the snippet
  forks (``os.fork``, ``multiprocessing``) ends on its own (``os._exit``, ``sys.exit`` or the
  snippet's end, as under ``python3 main.py``) and never ends the call.

Modes: ``script`` is plain Python (code-judge's endpoints): an uncaught exception prints the
standard traceback, exit code 1. ``cell`` is the rStar2 tool's (our agent loop and /v1): a final
bare expression is printed as its ``repr``, and an exception is reported as ``<ErrType> at line
N: msg`` plus the source line. In both, ``MemoryError`` gives status ``memory``.

C++ (``language: cpp``): ``main.cpp`` is compiled with g++ ``-O2`` inside the sandbox; a compile
error is status ``error`` with the compiler's message on stderr; the program then runs with the
call's stdin, stdout and stderr, its address space capped at the call's memory limit.
"""

from __future__ import annotations

import ast
import atexit
import builtins
import contextlib
import io
import os
import resource
import subprocess
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable
from typing import Any

from sandbox_pool.protocol import write_all

SCRIPT_NAME = "main.py"
CPP_SOURCE = "main.cpp"
CPP_EXE = "main"
CPP_EXTRA_VM_BYTES = 64 * 1024 * 1024  # the C++ runtime's own mappings, on top of memory_mb
MEMORY_EXIT = "memory"

Report = Callable[[dict[str, Any]], None]


class Runner:
    """One sandbox child's runtime, set up before its call arrives (off the latency path):
    the standard streams over fds 0-2, a fresh ``__main__`` and ``sys.argv`` for ``main.py`` in
    ``workdir``, and the ``os._exit`` hook (``sys.path[0]`` is :func:`runner_for`'s)."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.path = os.path.join(workdir, SCRIPT_NAME)
        self.report: Report | None = None
        self.start = 0.0
        self.pid = 0  # the call's own process; the processes it forks never report its end
        streams = _PREBUILT_STREAMS or _make_streams()
        self.module = types.ModuleType("__main__")
        sys.stdin, sys.stdout, sys.stderr = streams
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams  # type: ignore[misc]
        self.module.__dict__.update(
            {"__file__": self.path, "__builtins__": builtins, "__cached__": None}
        )
        sys.modules["__main__"] = self.module
        sys.argv = [self.path]
        self._hook_os_exit()

    def run(self, call: dict[str, Any], report: Report) -> None:
        """Run one call in this process, then ``report`` its end; never raises.

        ``report`` receives ``{status, exit_code, duration_s}``; a C++ call first reports
        ``{"started": true}`` once compiled (the pool's run deadline starts there).
        """
        self.report, self.start, self.pid = report, time.perf_counter(), os.getpid()
        os.register_at_fork(after_in_child=self._forked)  # even one that is PID 1 of its own
        if call.get("stdin"):
            _install_stdin(call["stdin"])  # else fd 0 stays /dev/null: an empty stdin
        if call.get("language") == "cpp":
            status, code = _run_cpp(call, self.workdir, report)
        else:
            status, code = self._run_python(call)
            if os.getpid() != self.pid:  # a process the snippet forked, at its own end
                self._real_exit(code)  # as a script's forked child ends (it flushed above)
        _reap_all()
        report(
            {"status": status, "exit_code": code, "duration_s": time.perf_counter() - self.start}
        )

    def _run_python(self, call: dict[str, Any]) -> tuple[str, int]:
        source: str = call["code"]
        _write_file(self.path, source)
        cell = call.get("mode", "cell") == "cell"
        status, code = "ok", 0
        try:
            _execute(source, self.path, self.module.__dict__, print_last=cell)
        except SystemExit as exc:
            code = _exit_code(exc)
        except MemoryError:
            status, code = MEMORY_EXIT, 1
            _write_stderr("MemoryError: the snippet exceeded its memory limit\n")
        except BaseException as exc:
            code = 1
            if cell:
                _write_stderr(format_cell_error(exc, source, self.path))
            else:
                _write_stderr(_script_traceback(exc))
        code = _finalize(code)
        if status == "ok" and code != 0:
            status = "error"
        return status, code

    def _forked(self) -> None:
        self.pid = -1  # a process the snippet forked: it never reports the call's end

    def _hook_os_exit(self) -> None:
        real_exit = self._real_exit = os._exit

        def _exit(code: int) -> None:
            if self.report is not None and os.getpid() == self.pid:
                status = "ok" if code == 0 else "error"
                elapsed = time.perf_counter() - self.start
                with contextlib.suppress(BaseException):
                    self.report({"status": status, "exit_code": code, "duration_s": elapsed})
            real_exit(code)

        os._exit = _exit  # type: ignore[assignment]


# ---- Python ----


def _execute(source: str, path: str, namespace: dict[str, Any], *, print_last: bool) -> None:
    tree = ast.parse(source, path, "exec")
    last: ast.Expression | None = None
    if print_last and tree.body and isinstance(tree.body[-1], ast.Expr):
        final = tree.body.pop()
        assert isinstance(final, ast.Expr)
        last = ast.Expression(final.value)
    exec(compile(tree, path, "exec"), namespace)
    if last is not None:
        value = eval(compile(last, path, "eval"), namespace)
        if value is not None:
            print(repr(value))


def _finalize(code: int) -> int:
    """What the interpreter does at exit: join non-daemon threads, run atexit handlers, flush."""
    try:
        if threading.active_count() > 1:
            threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's own exit step
        atexit._run_exitfuncs()
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException as exc:
        _write_stderr(_script_traceback(exc))
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    return code


def format_cell_error(exc: BaseException, code: str, path: str) -> str:
    """``<ErrType> at line N: msg`` plus the offending source line (when it is in the snippet)."""
    lineno: int | None = None
    if isinstance(exc, SyntaxError) and exc.filename == path:
        lineno = exc.lineno
        message = exc.msg
    else:
        message = str(exc)
        for frame in traceback.extract_tb(exc.__traceback__):
            if frame.filename == path:
                lineno = frame.lineno
    name = type(exc).__name__
    if lineno is None:
        return f"{name}: {message}\n"
    lines = code.splitlines()
    source = lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""
    return f"{name} at line {lineno}: {message}" + (f"\n    {source}" if source else "") + "\n"


def _script_traceback(exc: BaseException) -> str:
    """The traceback Python prints for an uncaught exception, without this module's frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    _write_stderr(f"{exc.code}\n")
    return 1


# ---- C++ ----


def _run_cpp(call: dict[str, Any], workdir: str, report: Report) -> tuple[str, int]:
    source = os.path.join(workdir, CPP_SOURCE)
    exe = os.path.join(workdir, CPP_EXE)
    _write_file(source, call["code"])
    compiler = call.get("cpp_compiler") or "g++"
    try:
        built = subprocess.run(
            [compiler, "-O2", "-o", exe, source],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=False,
        )
    except OSError as exc:
        _write_stderr(f"could not run the C++ compiler {compiler!r}: {exc}\n")
        return "error", 1
    if built.returncode != 0:
        os.write(2, built.stdout + built.stderr)
        return "error", built.returncode if built.returncode > 0 else 1
    report({"started": True})
    wanted = int(call["memory_mb"]) * 1024 * 1024 + CPP_EXTRA_VM_BYTES
    vm_bytes = min(wanted, resource.getrlimit(resource.RLIMIT_AS)[1])

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (vm_bytes, vm_bytes))

    proc = subprocess.Popen([exe], preexec_fn=limit_memory, close_fds=True)  # inherits 0, 1, 2
    code = proc.wait()
    if code < 0:  # killed by a signal: report it as a shell would
        return "error", 128 - code
    return ("ok" if code == 0 else "error"), code


# ---- process plumbing ----


def _write_file(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, text.encode("utf-8", "surrogateescape"))
    finally:
        os.close(fd)


def _install_stdin(text: str) -> None:
    fd = os.memfd_create("stdin")
    write_all(fd, text.encode("utf-8", "surrogateescape"))
    os.lseek(fd, 0, os.SEEK_SET)
    os.dup2(fd, 0)
    os.close(fd)


Streams = tuple[io.TextIOWrapper, io.TextIOWrapper, io.TextIOWrapper]
_PREBUILT_STREAMS: Streams | None = None
_PREBUILT_RUNNER: Runner | None = None


def prebuild(workdir: str | None) -> None:
    """In the zygote, once: the stream objects every child takes over (its own copies, by
    fork) and, when every child's working directory is ``workdir`` (each in a /tmp of its own),
    the whole :class:`Runner`, installed in the zygote itself. What a child would otherwise
    build costs it copy-on-write page faults (~70 of them, 0.2 ms). The streams name fds 0-2 by
    number: in a child those are the call's (:func:`isolation.prepare`)."""
    global _PREBUILT_STREAMS, _PREBUILT_RUNNER
    _PREBUILT_STREAMS = _make_streams()
    if workdir is not None:
        _PREBUILT_RUNNER = Runner(workdir)


def runner_for(workdir: str) -> Runner:
    """In a child: the runner for a call in ``workdir`` (the zygote's, when it prebuilt one)."""
    prepared = _PREBUILT_RUNNER
    if prepared is None or prepared.workdir != workdir:
        prepared = Runner(workdir)
    # here, not in the zygote: the zygote's /tmp is the host's, where anyone can make that dir
    sys.path.insert(0, workdir)
    return prepared


def _make_streams() -> Streams:
    """``sys.stdin/stdout/stderr`` over fds 0-2, as ``python3 -u`` makes them."""
    stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8")
    stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", write_through=True
    )
    stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False),
        encoding="utf-8",
        errors="backslashreplace",
        write_through=True,
    )
    return stdin, stdout, stderr


def _reap_all() -> None:
    """Wait for every process the call left behind (as PID 1 of its namespace, orphans are
    re-parented here); the pool's deadline kills the lot if they do not end."""
    while True:
        try:
            os.wait()
        except ChildProcessError:
            return
        except InterruptedError:
            continue


def _write_stderr(text: str) -> None:
    with contextlib.suppress(BaseException):
        sys.stderr.write(text)
        return
    with contextlib.suppress(OSError):
        os.write(2, text.encode("utf-8", "backslashreplace"))
