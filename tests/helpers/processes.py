"""The live processes of this machine, for tests that check what a launch left running."""

from __future__ import annotations

from pathlib import Path


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
