"""Check results and how they print (pure).

A check is required or optional. A failed required check makes the exit status 1; a failed
optional one prints ``warn`` and changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    required: bool = False


def status(check: Check) -> str:
    if check.ok:
        return "ok"
    return "FAIL" if check.required else "warn"


def render(check: Check, name_width: int = 22) -> str:
    """``ok    torch                  2.13.0+cpu``: status, name, detail on one line."""
    detail = " ".join(check.detail.split())  # one line, whatever an exception said
    return f"{status(check):<5} {check.name:<{name_width}} {detail}".rstrip()


def exit_code(checks: Sequence[Check]) -> int:
    return 1 if any(c.required and not c.ok for c in checks) else 0
