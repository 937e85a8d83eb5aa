"""Fixtures the vLLM integration modules share: the real sandbox pool and the tool model's
chat template, one of each per module, and the trainer's reference run, one per session."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_asyncio

from rstar2.agent.template import ChatTemplate
from sandbox_pool import PoolConfig, SandboxPool
from tests.helpers.reference_run import ReferenceRun, build_reference_run
from tests.helpers.vllm_setup import tool_template


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sandbox():
    async with SandboxPool(PoolConfig(num_workers=2)) as pool:
        yield pool


@pytest.fixture(scope="module")
def template(tool_model_dir: Path) -> ChatTemplate:
    return tool_template(tool_model_dir)


@pytest.fixture(scope="session")
def reference_run(tool_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> ReferenceRun:
    """The uninterrupted run the trainer's tests compare against (built once per session)."""
    return build_reference_run(tool_model_dir, tmp_path_factory)
