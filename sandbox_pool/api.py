"""The call surface shared by SandboxPool and SandboxClient (kept out of protocol.py, which the
zygote imports: its memory is what every fork copies)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sandbox_pool.protocol import ExecRequest, ExecResult


class SandboxAPI:
    """The calls SandboxPool and SandboxClient share, defined once over ``execute``."""

    async def execute(self, request: ExecRequest) -> ExecResult:
        raise NotImplementedError

    async def run(
        self,
        code: str,
        stdin: str = "",
        timeout_s: float | None = None,
        memory_mb: int | None = None,
    ) -> ExecResult:
        """Run ``code`` with ``stdin``; always returns a result (never raises for user code)."""
        return await self.execute(
            ExecRequest(code=code, stdin=stdin, timeout_s=timeout_s, memory_mb=memory_mb)
        )

    async def run_batch(self, requests: Sequence[ExecRequest]) -> list[ExecResult]:
        """Results of ``requests`` in order, run concurrently (up to the implementation's bound)."""
        return list(await asyncio.gather(*(self.execute(r) for r in requests)))
