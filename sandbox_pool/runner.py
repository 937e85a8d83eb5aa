"""What a sandbox child does with one snippet: IPython-style execution with captured, capped output.

Semantics (the rStar2 tool's):
- ``stdin`` feeds ``input()`` / ``sys.stdin``.
- The value of a final bare expression is printed as its ``repr`` (unless it is None).
- An exception is reported on stderr as ``<ErrType> at line N: msg`` followed by the source line,
  exit code 1, status ``error``; ``SyntaxError`` the same way. ``sys.exit(n)`` gives exit code n.
- ``MemoryError`` gives status ``memory``; output past ``max_output_chars`` gives ``output_limit``.
This module does no isolation: :mod:`sandbox_pool.isolation` has done that before it runs.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import sys
import traceback
from typing import Any

FILENAME = "<tool>"


class OutputLimitExceeded(BaseException):
    """Raised into the snippet when it prints past the cap (BaseException: not caught by except
    Exception in user code)."""


class CappedWriter(io.TextIOBase):
    """A text stream keeping at most ``cap`` characters; writing past the cap raises."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.parts: list[str] = []
        self.size = 0
        self.overflowed = False

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        if self.overflowed:
            raise OutputLimitExceeded
        room = self.cap - self.size
        if len(s) > room:
            self.parts.append(s[:room])
            self.size = self.cap
            self.overflowed = True
            raise OutputLimitExceeded
        self.parts.append(s)
        self.size += len(s)
        return len(s)

    def getvalue(self) -> str:
        return "".join(self.parts)


def run_code(code: str, stdin: str, max_output_chars: int) -> dict[str, Any]:
    """Execute ``code``; return ``{status, stdout, stderr, exit_code}``. Never raises."""
    out, err = CappedWriter(max_output_chars), CappedWriter(max_output_chars)
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = io.StringIO(stdin), out, err
    status, exit_code = "ok", 0
    try:
        _execute(code)
    except OutputLimitExceeded:
        status, exit_code = "output_limit", 1
    except SystemExit as exc:
        exit_code = _exit_code(exc, err)
        status = "ok" if exit_code == 0 else "error"
    except MemoryError:
        status, exit_code = "memory", 1
        _safe_write(err, "MemoryError: the snippet exceeded its memory limit\n")
    except BaseException as exc:
        status, exit_code = "error", 1
        _safe_write(err, format_exception(exc, code) + "\n")
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    if out.overflowed or err.overflowed:
        status = "output_limit"
    return {
        "status": status,
        "stdout": out.getvalue(),
        "stderr": err.getvalue(),
        "exit_code": exit_code,
    }


def _execute(code: str) -> None:
    tree = ast.parse(code, FILENAME, "exec")
    last: ast.Expression | None = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        final = tree.body.pop()
        assert isinstance(final, ast.Expr)
        last = ast.Expression(final.value)
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    exec(compile(tree, FILENAME, "exec"), namespace)
    if last is not None:
        value = eval(compile(last, FILENAME, "eval"), namespace)
        if value is not None:
            print(repr(value))


def format_exception(exc: BaseException, code: str) -> str:
    """``<ErrType> at line N: msg`` plus the offending source line (when it is in the snippet)."""
    lineno: int | None = None
    if isinstance(exc, SyntaxError) and exc.filename == FILENAME:
        lineno = exc.lineno
        message = exc.msg
    else:
        message = str(exc)
        for frame in traceback.extract_tb(exc.__traceback__):
            if frame.filename == FILENAME:
                lineno = frame.lineno
    name = type(exc).__name__
    if lineno is None:
        return f"{name}: {message}"
    lines = code.splitlines()
    source = lines[lineno - 1].strip() if 0 < lineno <= len(lines) else ""
    return f"{name} at line {lineno}: {message}" + (f"\n    {source}" if source else "")


def _exit_code(exc: SystemExit, err: CappedWriter) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    _safe_write(err, f"{exc.code}\n")
    return 1


def _safe_write(stream: CappedWriter, text: str) -> None:
    with contextlib.suppress(OutputLimitExceeded):
        stream.write(text)
