"""Where a run's components live: in this process, or in Ray actors.

:func:`placement_for` is the one place that reads ``cluster.ray``. A :class:`Placement` starts
engines, the embedded sandbox pool and the learner; it does not own them: the
:class:`~rstar2.runtime.Runtime` registers every handle it returns for closing. ``open`` /
``close`` bracket the placement itself (for Ray: joining or starting the cluster, checking the
actors fit, and shutting down a cluster it started).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

from rstar2.agent.loop import Sandbox
from rstar2.config import Config

if TYPE_CHECKING:
    from rstar2.learner.build import LearnerSettings
    from rstar2.learner.protocol import Learner
    from rstar2.rollout.engine import Engine
    from rstar2.rollout.vllm_engine import VLLMEngineConfig
    from sandbox_pool.pool import PoolConfig


class ClosableSandbox(Sandbox, Protocol):
    async def aclose(self) -> None: ...


class Placement(Protocol):
    """Starts components somewhere; see the module docstring."""

    def open(self) -> None: ...

    def close(self) -> None: ...

    def describe_learner(self, learner: Learner) -> str | None:
        """Where ``learner`` runs, for the console (None: in this process, nothing to say)."""
        ...

    async def start_engine(self, config: VLLMEngineConfig, tasks: asyncio.TaskGroup) -> Engine:
        """A started vLLM engine; its background work (if any) runs in ``tasks``."""
        ...

    async def start_sandbox(self, config: PoolConfig) -> ClosableSandbox:
        """A started embedded sandbox pool (IsolationUnavailable when a layer is missing)."""
        ...

    def start_learner(self, settings: LearnerSettings) -> Learner: ...


class LocalPlacement:
    """Everything in this process."""

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def describe_learner(self, learner: Learner) -> str | None:
        return None

    async def start_engine(self, config: VLLMEngineConfig, tasks: asyncio.TaskGroup) -> Engine:
        from rstar2.rollout.vllm_engine import VLLMEngine

        return await VLLMEngine.create(config)

    async def start_sandbox(self, config: PoolConfig) -> ClosableSandbox:
        from sandbox_pool.pool import SandboxPool

        pool = SandboxPool(config)
        try:
            await pool.start()
        except BaseException:
            await pool.aclose()
            raise
        return pool

    def start_learner(self, settings: LearnerSettings) -> Learner:
        from rstar2.learner.build import build_learner

        return build_learner(settings)


class RayPlacement:
    """Learner, engines and the embedded pool each in a Ray actor (see ``cluster.ray``)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self._started_ray = False

    def open(self) -> None:
        """Join RAY_ADDRESS's cluster when set, else start a local one; fail now (ConfigError)
        when the actors cannot be placed, rather than leaving them pending forever."""
        import ray

        from rstar2.trainer.ray_resources import actor_demands, check_fits

        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False)
            self._started_ray = True
        try:
            check_fits(actor_demands(self.cfg), [n["Resources"] for n in ray.nodes() if n["Alive"]])
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._started_ray:
            import ray

            ray.shutdown()
            self._started_ray = False

    def describe_learner(self, learner: Learner) -> str | None:
        from rstar2.learner.ray_learner import RayLearner

        if not isinstance(learner, RayLearner):
            return None
        if learner.num_ranks == 1:
            return f"in a Ray actor on {learner.device}"
        return f"{learner.num_ranks} ranks in Ray actors on {learner.device}"

    async def start_engine(self, config: VLLMEngineConfig, tasks: asyncio.TaskGroup) -> Engine:
        from rstar2.rollout.ray_engine import RayEngine
        from rstar2.trainer.ray_resources import engine_demand

        d = engine_demand(self.cfg)
        return await RayEngine.create(config, tasks, num_cpus=d.cpus, num_gpus=d.gpus)

    async def start_sandbox(self, config: PoolConfig) -> ClosableSandbox:
        from rstar2.rollout.ray_sandbox import RaySandbox
        from rstar2.trainer.ray_resources import sandbox_demand

        return await RaySandbox.create(config, num_cpus=sandbox_demand(self.cfg).cpus)

    def start_learner(self, settings: LearnerSettings) -> Learner:
        from rstar2.learner.ray_learner import RayLearner
        from rstar2.trainer.ray_resources import learner_demand

        demand = learner_demand(self.cfg)
        return RayLearner.create(settings, num_cpus=demand.cpus, num_gpus=demand.gpus)


def placement_for(cfg: Config) -> Placement:
    """The placement ``cluster`` names (the only reader of ``cluster.ray``)."""
    return RayPlacement(cfg) if cfg.cluster.ray else LocalPlacement()
