"""What a stuck trainer is waiting on: ``kill -USR2 <pid>`` writes every asyncio task's stack
and every thread's stack to ``logs/stacks-<time>.txt`` in the run folder, and the run goes on.

A hung step shows its main thread idle in the event loop (py-spy sees no more); the task
stacks say which await never returns.
"""

from __future__ import annotations

import asyncio
import faulthandler
import io
import time
from pathlib import Path
from typing import Any


def await_chain(coro: Any, limit: int = 60) -> list[str]:
    """``coro`` and what it awaits, outermost first, as ``qualname (file:line)``: the chain a
    task is suspended in (a task's own stack shows only its outermost frame)."""
    lines: list[str] = []
    while coro is not None and len(lines) < limit:
        code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None)
        code = code or getattr(coro, "ag_code", None)
        if code is None:  # a future's iterator, or something else awaitable: the end
            lines.append(f"awaiting {coro!r}")
            break
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        frame = frame or getattr(coro, "ag_frame", None)
        line = frame.f_lineno if frame is not None else "?"
        lines.append(f"{code.co_qualname} ({code.co_filename}:{line})")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        coro = coro or getattr(coro, "ag_await", None)
    return lines


def dump_stacks(folder: Path) -> Path:
    """Write the stacks of the running loop's tasks (if a loop runs in this thread) and of
    every thread into a new file in ``folder``; returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"stacks-{time.strftime('%Y%m%d-%H%M%S')}.txt"
    try:
        tasks = asyncio.all_tasks()
    except RuntimeError:  # no running loop in this thread
        tasks = set()
    out = io.StringIO()
    out.write(f"{len(tasks)} asyncio task(s)\n")
    for task in sorted(tasks, key=lambda t: t.get_name()):
        out.write(f"\n--- {task.get_name()}\n")
        out.writelines(f"  {line}\n" for line in await_chain(task.get_coro()))
    with path.open("w") as fh:
        fh.write(out.getvalue())
        fh.write("\n=== threads\n")
        fh.flush()
        faulthandler.dump_traceback(file=fh, all_threads=True)
    return path
