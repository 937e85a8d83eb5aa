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


def _is_engine_core(process: Any) -> bool:
    """vLLM titles its engine-core process ``VLLM::EngineCore`` (argv and, cut to 15
    characters, the kernel's comm name); either may be what a glance sees first."""
    import psutil

    try:
        title = " ".join(process.cmdline()) + " " + process.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return "EngineCor" in title


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
            found = [(p.pid, p.name()) for p in children]
            raise AssertionError(f"{len(cores)} engine cores, not {expect}, among {found}")
        time.sleep(0.2)
