"""The live processes of this machine, for tests that check what a launch left running."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def live_commands(*markers: str) -> list[str]:
    """The command lines (first 120 characters) of live processes holding any of ``markers``
    (zombies and dead ones left out: they hold nothing)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X") and any(m in cmd for m in markers):
            found.append(cmd[:120])
    return found


def _title(process: Any) -> str:
    """``process``'s argv and kernel comm name, or "" once it is gone."""
    import psutil

    try:
        return " ".join(process.cmdline()) + " " + process.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def _is_engine_core(process: Any) -> bool:
    """vLLM titles its engine-core process ``VLLM::EngineCore`` (argv and, cut to 15
    characters, the kernel's comm name). The title can silently fail to take: setproctitle
    gives up in a process whose first environment variable was rewritten before the call
    (seen in CI, in an engine under a Ray actor, whose worker was left untitled too). An
    untitled engine core is then told by its shape: a ``multiprocessing`` spawn child that
    has spawned its own worker (no other spawn child under a trainer or an engine actor
    spawns one)."""
    import psutil

    title = _title(process)
    if "EngineCor" in title:
        return True
    if "spawn_main" not in title:
        return False
    try:
        children = process.children()
    except psutil.NoSuchProcess:
        return False
    return any("spawn_main" in (t := _title(c)) or "VLLM::Worker" in t for c in children)


def engine_cores(root_pid: int, expect: int, deadline_s: float = 60.0) -> list[Any]:
    """The ``expect`` engine-core processes under ``root_pid``, polled until that many are
    there (a loaded machine names a fresh process late) or ``deadline_s`` passes; then an
    AssertionError listing what was found."""
    import psutil

    end = time.monotonic() + deadline_s
    while True:
        children = psutil.Process(root_pid).children(recursive=True)
        cores = [p for p in children if _is_engine_core(p)]
        if len(cores) == expect:
            return cores
        if time.monotonic() > end:
            found = [(p.pid, _title(p)[:100]) for p in children]
            raise AssertionError(f"{len(cores)} engine cores, not {expect}, among {found}")
        time.sleep(0.2)
