"""The native weight syncs' deadline: a transfer that hangs or fails ends the sync with one
error naming the cause and the engines that stopped answering, instead of a trainer waiting on
a hung peer (the transfers themselves run on GPUs only: tests/integration/test_sync_gpu.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rstar2.rollout.dispatch import AllEnginesDown
from rstar2.rollout.engine import EngineDown
from rstar2.sync import vllm_native
from rstar2.sync.vllm_native import IpcSync, NativeSyncFailed, transfer_deadline_s


class _Engine:
    """An engine client whose liveness probe answers or not (what ``_bounded`` asks of one)."""

    def __init__(self, alive: bool) -> None:
        self.alive = alive

    async def ping(self) -> None:
        if not self.alive:
            raise EngineDown("gone")


def _sync(engines: list[Any]) -> IpcSync:
    return IpcSync(learner=None, engines=engines, bucket_bytes=1 << 20)  # type: ignore[arg-type]


def test_the_deadline_grows_with_the_bytes() -> None:
    small, large = transfer_deadline_s(0), transfer_deadline_s(int(3.4e9))
    assert small == vllm_native.DEADLINE_BASE_S
    assert large == pytest.approx(small + 3.4e9 / (vllm_native.DEADLINE_MIN_GB_PER_S * 1e9))


async def test_a_hung_transfer_ends_at_its_deadline_naming_the_dead_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(vllm_native, "DEADLINE_BASE_S", 0.2)
    sync = _sync([_Engine(True), _Engine(False)])
    with pytest.raises(NativeSyncFailed) as failed:
        await sync._bounded("the IPC send", asyncio.Event().wait())
    text = str(failed.value)
    assert "the IPC send: no end in 0.2 s" in text and "engine(s) [1] no longer answer" in text
    assert "\n" not in text and isinstance(failed.value, AllEnginesDown)  # the CLI's one line


async def test_a_failed_transfer_ends_the_sync_with_its_cause() -> None:
    async def broken() -> None:
        raise RuntimeError("NCCL error: unhandled system error\nmore lines")

    with pytest.raises(NativeSyncFailed, match=r"NCCL error: unhandled system error\); every"):
        await _sync([_Engine(True)])._bounded("the broadcast", broken())
