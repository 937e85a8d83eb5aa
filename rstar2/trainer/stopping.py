"""A stop request (SIGTERM) and the two ways the trainer honours it.

Guarantees: :meth:`StopRequest.unless` cancels work that is still running when a stop is
requested and raises :class:`Stopped`; :meth:`StopRequest.check` raises it between steps. What
was cancelled must be undone by the caller (the trainer restores the step's state).
:meth:`StopRequest.on_signal` may be called from a signal handler at any point, also while
synchronous work (SFT) holds the event loop: :attr:`requested` is true at once, and waiters in
the loop are woken as soon as it runs again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Stopped(Exception):
    """A stop was requested; the run checkpoints and returns."""


class StopRequest:
    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._requested = False

    def request(self) -> None:
        """From the event loop's thread, outside a signal handler."""
        self._requested = True
        self._event.set()

    def on_signal(self, loop: asyncio.AbstractEventLoop) -> None:
        """From a signal handler: a flag now, the event set by ``loop`` when it next runs."""
        self._requested = True
        loop.call_soon_threadsafe(self._event.set)

    @property
    def requested(self) -> bool:
        return self._requested

    def check(self) -> None:
        if self._requested:
            raise Stopped

    async def unless(self, work: Coroutine[Any, Any, T]) -> T:
        """``work``'s result, unless a stop is requested first: then it is cancelled and
        Stopped raised."""
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self._event.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # we were cancelled (e.g. a failed background task): so is work
            await _cancel(task)
            raise
        finally:
            stop.cancel()
        if not task.done():
            await _cancel(task)
            raise Stopped
        return task.result()


async def _cancel(task: asyncio.Future[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
