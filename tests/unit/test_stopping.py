"""The stop request: work still running when a stop comes is cancelled (Stopped), work that
ends first returns, and work is never left running when its awaiter is cancelled."""

from __future__ import annotations

import asyncio

import pytest

from rstar2.trainer.stopping import Stopped, StopRequest


async def test_a_stop_cancels_running_work() -> None:
    stop, cancelled = StopRequest(), asyncio.Event()

    async def work() -> int:
        try:
            await asyncio.Event().wait()  # never ends by itself
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 1

    asyncio.get_running_loop().call_soon(stop.request)
    with pytest.raises(Stopped):
        await stop.unless(work())
    assert cancelled.is_set() and stop.requested
    with pytest.raises(Stopped):
        stop.check()


async def test_work_that_ends_first_returns_and_its_errors_surface() -> None:
    stop = StopRequest()

    async def value() -> int:
        return 7

    async def fails() -> int:
        raise ValueError("boom")

    assert await stop.unless(value()) == 7
    with pytest.raises(ValueError, match="boom"):
        await stop.unless(fails())
    stop.check()  # no stop requested: nothing raised


async def test_cancelling_the_awaiter_cancels_the_work() -> None:
    stop, cancelled = StopRequest(), asyncio.Event()

    async def work() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    outer = asyncio.ensure_future(stop.unless(work()))
    await asyncio.sleep(0)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert cancelled.is_set()
