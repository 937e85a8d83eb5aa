"""The `sandbox-pool` command (the service itself lands with the sandbox_pool issue)."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    print("sandbox-pool: the execution service is not built yet in this version", file=sys.stderr)
    return 2
