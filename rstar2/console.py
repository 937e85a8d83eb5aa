"""Where a command's output goes: rstar2's own lines to the console, everything else to files.

``with run_console(run_dir / "logs") as log:`` guarantees, for the block's duration:

- The console (the process's stdout and stderr as they were on entry) shows what rstar2 writes:
  its print() lines, its tqdm bars, its messages, tracebacks it prints. A write counts as ours
  when the code that asked for it, looking past tqdm, contextlib, traceback and Ray's
  replacement of ``print`` (which write on their caller's behalf), is in one of
  ``own_packages`` (rstar2's by default).
- Everything else goes to ``log`` (``logs/third_party.log``): file descriptors 1 and 2 point
  there, so child processes (vLLM's engine core and workers, Ray's raylet, sandbox and reward
  workers) and C code write there; in this process, writes to ``sys.stdout`` / ``sys.stderr``
  by other code (a logging handler of vLLM, Ray, transformers or torch, whatever stream it
  holds or looks up; a library's progress bar or print) go there too, and so do warnings
  (``logging.captureWarnings``, through the ``py.warnings`` logger).
- :func:`link_logs` names another program's log folder in ``logs/`` (Ray's session logs, as
  ``logs/ray``: Ray actors write there, not to fd 1/2).
- On exit fds 1 and 2, ``sys.stdout`` / ``sys.stderr``, the warnings hook and the environment
  are as they were; an error leaving the block first names the log on the console (vLLM's
  "see root cause above" points there), and its traceback is printed after exit, on the console.

Not covered: a library that opens the terminal itself (/dev/tty); a write with no code of
either side behind it (tqdm's monitor thread redrawing a stalled bar) goes to the log.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import FrameType
from typing import TextIO

from rstar2.config import ConfigError
from rstar2.data.schema import DataError

THIRD_PARTY_LOG = "third_party.log"
# the logs folder of the command running, for link_logs (inherited by our child processes)
LOGS_DIR_ENV = "RSTAR2_LOGS_DIR"
OWN_PACKAGES = ("rstar2", "sandbox_pool", "scheduler", "launcher")
# packages and functions (module, name) that write on behalf of their caller: the caller
# decides where the text goes. Ray's tqdm_ray replaces builtins.print with its safe_print, for
# the whole process, once a worker's log or a cluster error (a worker that died) is printed in
# the driver (its own bar redraws stay Ray's)
_ON_BEHALF = frozenset({"tqdm", "contextlib", "traceback"})
_ON_BEHALF_FUNCTIONS = frozenset({("ray.experimental.tqdm_ray", "safe_print")})
# vLLM colours its lines when sys.stdout (our console) is a terminal: not in a file; Ray leaves
# builtins.print alone (see _ON_BEHALF_FUNCTIONS for a process where it already replaced it)
_ENV_DEFAULTS = {"VLLM_LOGGING_COLOR": "0", "RAY_TQDM_PATCH_PRINT": "0"}


@contextlib.contextmanager
def run_console(logs_dir: Path, *, own_packages: Iterable[str] = OWN_PACKAGES) -> Iterator[Path]:
    """Send third-party output to ``logs_dir/third_party.log`` (yielded) for the block; see
    the module docstring. Appends, so a resumed run keeps the earlier runs' lines; a block
    that left nothing in a new log (a user error found first) leaves no folder behind."""
    made = [p for p in (logs_dir, *logs_dir.parents) if not p.exists()]  # innermost first
    logs_dir.mkdir(parents=True, exist_ok=True)
    log_path = logs_dir / THIRD_PARTY_LOG
    header_bytes = -1
    try:
        with _routed(log_path, frozenset(own_packages)) as header_bytes:
            yield log_path
    except Exception as exc:  # its traceback may end "see root cause above": that is in the log
        user_error = isinstance(exc, ConfigError | DataError)  # one line, printed by the CLI
        if not _removed_if_empty(log_path, header_bytes, made) and not user_error:
            print(f"rstar2: stopped by an error; library logs in {log_path}", file=sys.stderr)
        raise
    else:
        _removed_if_empty(log_path, header_bytes, made)


def _removed_if_empty(log_path: Path, header_bytes: int, made: list[Path]) -> bool:
    """Remove a log this command made that holds its header only, and the folders made for
    it (one holding something else stays); whether it was removed."""
    if not made or header_bytes < 0 or log_path.stat().st_size != header_bytes:
        return False
    log_path.unlink()
    for folder in made:
        with contextlib.suppress(OSError):
            folder.rmdir()
    return True


@contextlib.contextmanager
def _routed(log_path: Path, own_packages: frozenset[str]) -> Iterator[int]:
    """run_console's body: each change undone on exit, in reverse order; yields the log's size
    after its header."""
    with contextlib.ExitStack() as undo:
        log = undo.enter_context(
            open(log_path, "a", buffering=1, encoding="utf-8", errors="backslashreplace")
        )
        args = " ".join(sys.argv[1:])
        log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} rstar2 {args} (pid {os.getpid()})\n")
        log.flush()
        header_bytes = log_path.stat().st_size
        undo.enter_context(_fds_to(log_path, log, _Owner(own_packages)))
        undo.enter_context(_environment({LOGS_DIR_ENV: str(log_path.parent.resolve())}))
        undo.enter_context(_warnings_logged(log))
        yield header_bytes


def link_logs(name: str, target: Path) -> Path | None:
    """Name ``target``, another program's log folder, as ``logs/NAME`` (a symlink) in the logs
    folder of the :func:`run_console` running, and note it in the third-party log; a later
    call for the same name (a resumed run's new Ray session) moves the link. None outside
    run_console, when ``target`` is not a folder here, or when the link cannot be made: naming
    logs never stops a run."""
    logs = os.environ.get(LOGS_DIR_ENV)
    if not logs or not target.is_dir():
        return None
    link = Path(logs) / name
    staged = link.with_name(f".{name}.{os.getpid()}")
    try:
        staged.unlink(missing_ok=True)
        staged.symlink_to(target, target_is_directory=True)
        os.replace(staged, link)
        with open(Path(logs) / THIRD_PARTY_LOG, "a", encoding="utf-8") as fh:
            fh.write(f"=== logs/{name} -> {target}\n")
    except OSError:
        return None
    return link


class _Owner:
    """Tells our writes from the rest by the code that asked for them (see the docstring)."""

    def __init__(self, own_packages: frozenset[str]) -> None:
        self.own_packages = own_packages

    def ours(self, frame: FrameType | None) -> bool:
        while frame is not None:
            name = _module_name(frame)
            package = name.partition(".")[0]
            if (
                package not in _ON_BEHALF
                and (name, frame.f_code.co_name) not in _ON_BEHALF_FUNCTIONS
            ):
                return package in self.own_packages
            frame = frame.f_back
        return False


def _module_name(frame: FrameType) -> str:
    # `python -m rstar2.cli` runs the CLI as __main__: its spec keeps the real name
    spec = frame.f_globals.get("__spec__")
    name = getattr(spec, "name", None) or frame.f_globals.get("__name__")
    return name if isinstance(name, str) else ""


class _Console(io.TextIOWrapper):
    """A text stream on a copy of a console fd that takes our writes; others' go to ``log``."""

    def __init__(self, fd: int, like: TextIO, log: TextIO, owner: _Owner) -> None:
        super().__init__(
            io.BufferedWriter(io.FileIO(fd, "w")),
            encoding=getattr(like, "encoding", None) or "utf-8",
            errors=getattr(like, "errors", None) or "backslashreplace",
            line_buffering=True,
        )
        self._log = log
        self._owner = owner
        self._after: TextIO | None = None

    def write(self, text: str) -> int:
        if self._after is not None:
            return self._after.write(text)
        if self._owner.ours(sys._getframe(1)):
            return super().write(text)
        return self._log.write(text)

    def flush(self) -> None:
        if self._after is not None:
            self._after.flush()
            return
        super().flush()
        self._log.flush()

    def retire(self, after: TextIO) -> None:
        """Close the fd copy; a handler that took this stream as sys.stdout / sys.stderr (vLLM's,
        configured in the block) writes to ``after`` from now on, not to a closed file."""
        self._after = after  # first: a thread writing meanwhile never meets a closed file
        super().flush()
        self.close()


@contextlib.contextmanager
def _fds_to(log_path: Path, log: TextIO, owner: _Owner) -> Iterator[None]:
    """fds 1 and 2 onto ``log_path``; sys.stdout / sys.stderr onto copies of the old ones."""
    old_streams = (sys.stdout, sys.stderr)
    for stream in old_streams:
        stream.flush()
    saved_fds = [os.dup(1), os.dup(2)]
    consoles = [
        _Console(os.dup(fd), s, log, owner) for fd, s in zip(saved_fds, old_streams, strict=True)
    ]
    try:
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
        finally:
            os.close(log_fd)
        sys.stdout, sys.stderr = consoles
        yield
    finally:
        sys.stdout, sys.stderr = old_streams
        for console, old in zip(consoles, old_streams, strict=True):
            console.retire(old)
        # what was written meanwhile to the old stream objects went to fds 1/2: the log
        for stream in {id(s): s for s in (*old_streams, sys.__stdout__, sys.__stderr__)}.values():
            if stream is not None:
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
        for fd, saved in zip((1, 2), saved_fds, strict=True):
            os.dup2(saved, fd)
            os.close(saved)


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """``values`` set, and ``_ENV_DEFAULTS`` where unset, in os.environ (children inherit
    them); each variable restored on exit."""
    changes = {**{k: v for k, v in _ENV_DEFAULTS.items() if k not in os.environ}, **values}
    before = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _warnings_logged(log: TextIO) -> Iterator[None]:
    """Warnings through logging, to ``log``: ``py.warnings`` has no handler of its own (logging
    would give it a NullHandler, and they would be lost)."""
    hook: Callable[..., object] = warnings.showwarning
    logging.captureWarnings(True)
    turned_on = warnings.showwarning is not hook  # else someone had it on already: keep it
    handler = logging.StreamHandler(log)
    logger = logging.getLogger("py.warnings")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        if turned_on:
            logging.captureWarnings(False)
