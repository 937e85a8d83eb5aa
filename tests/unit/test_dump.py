"""rstar2.trainer.dump: the stacks of a stuck loop's tasks, and of its threads."""

from __future__ import annotations

import asyncio

from rstar2.trainer.dump import dump_stacks


async def _waits_forever(never: asyncio.Future[None]) -> None:
    await _inner(never)


async def _inner(never: asyncio.Future[None]) -> None:
    await never


async def test_the_dump_names_the_await_that_never_returns(tmp_path):
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    stuck = asyncio.create_task(_waits_forever(never), name="rollout-7")
    await asyncio.sleep(0)
    try:
        path = dump_stacks(tmp_path / "logs")
    finally:
        stuck.cancel()
    text = path.read_text()
    assert path.parent == tmp_path / "logs" and path.name.startswith("stacks-")
    assert "--- rollout-7" in text and "_waits_forever (" in text
    assert "=== threads" in text and "Current thread" in text
    chain = text.split("--- rollout-7\n", 1)[1].splitlines()
    assert chain[0].strip().startswith("_waits_forever (") and "test_dump.py:" in chain[0]
    assert chain[1].strip().startswith("_inner (")  # the await inside, not only the task
    assert "awaiting" in chain[2]


def test_without_a_running_loop_it_dumps_the_threads(tmp_path):
    text = dump_stacks(tmp_path).read_text()
    assert text.startswith("0 asyncio task(s)") and "=== threads" in text
