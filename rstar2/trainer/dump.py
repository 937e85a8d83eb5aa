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
        out.write(f"\n--- {task.get_name()}: {task.get_coro()!r}\n")
        task.print_stack(limit=30, file=out)
    with path.open("w") as fh:
        fh.write(out.getvalue())
        fh.write("\n=== threads\n")
        fh.flush()
        faulthandler.dump_traceback(file=fh, all_threads=True)
    return path
