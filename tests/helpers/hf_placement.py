"""A placement whose engines are :class:`rstar2.rollout.hf_engine.HFEngine` (no vLLM): the
trainer's fast tests run the real loop on it, with the real learner, sandbox and scorer."""

from __future__ import annotations

import asyncio
from typing import Any

from rstar2.rollout.hf_engine import HFEngine
from rstar2.runtime.placement import LocalPlacement


class HFPlacement(LocalPlacement):
    async def start_engine(self, config: Any, tasks: asyncio.TaskGroup) -> HFEngine:
        return HFEngine.load(config.model_path, seed=config.seed)
