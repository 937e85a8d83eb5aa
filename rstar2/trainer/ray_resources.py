"""What a run's Ray actors ask of the cluster, and the check that the cluster can give it.

Ray keeps an actor whose resources no node can offer pending, without an error, so a run whose
engines, sandbox pool and learner do not fit would hang at start-up. :func:`check_fits` raises
a :class:`ConfigError` naming what each part asks and what the cluster has. Pure: the caller
reads the nodes' resources from Ray (``ray.nodes()``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rstar2.config import Config, ConfigError


@dataclass(frozen=True)
class ActorDemand:
    """``count`` actors of one kind, each asking Ray for ``cpus`` and ``gpus``."""

    name: str
    count: int
    cpus: float
    gpus: float


def engine_demand(cfg: Config) -> ActorDemand:
    gpus: float = cfg.rollout.tensor_parallel_size if cfg.cluster.accelerator != "cpu" else 0
    if cfg.cluster.colocate:  # on its learner ranks' GPUs (rstar2.runtime.placement)
        gpus = 0
    return ActorDemand("rollout engine", cfg.rollout.num_engines, 1, gpus)


def sandbox_demand(cfg: Config) -> ActorDemand:
    """The embedded pool's actor (an ``http`` sandbox runs outside Ray: count 0)."""
    return ActorDemand("sandbox pool", 1 if cfg.sandbox.mode == "embedded" else 0, 1, 0)


def learner_demand(cfg: Config) -> ActorDemand:
    # on CPU the learner takes turns with the engines on the same cores; Ray places by its CPU
    # count, so it asks for none there
    gpu = cfg.cluster.accelerator != "cpu"
    return ActorDemand("learner rank", cfg.learner.num_ranks, 1 if gpu else 0, 1 if gpu else 0)


def actor_demands(cfg: Config) -> list[ActorDemand]:
    return [engine_demand(cfg), sandbox_demand(cfg), learner_demand(cfg)]


def check_fits(demands: Sequence[ActorDemand], nodes: Sequence[Mapping[str, float]]) -> None:
    """Raise ConfigError when the cluster's alive ``nodes`` (each a Ray resource map: "CPU",
    "GPU") cannot hold ``demands``: more CPUs or GPUs than the cluster has in all, or one actor
    larger than any node. Passing does not promise placement (Ray packs actors onto nodes
    itself); failing means Ray would never place them."""
    wanted = [d for d in demands if d.count > 0]
    need_cpus = sum(d.count * d.cpus for d in wanted)
    need_gpus = sum(d.count * d.gpus for d in wanted)
    have_cpus = sum(n.get("CPU", 0.0) for n in nodes)
    have_gpus = sum(n.get("GPU", 0.0) for n in nodes)
    asks = ", ".join(
        f"{d.count} {d.name}{'s' if d.count > 1 else ''} x {d.cpus:g} CPU"
        + (f" + {d.gpus:g} GPU" if d.gpus else "")
        for d in wanted
    )
    if need_cpus > have_cpus or need_gpus > have_gpus:
        raise ConfigError(
            "cluster.ray",
            f"the actors need {need_cpus:g} CPUs and {need_gpus:g} GPUs ({asks}); the Ray "
            f"cluster has {have_cpus:g} CPUs and {have_gpus:g} GPUs. Lower rollout.num_engines, "
            "use sandbox.mode=http, or give Ray more (ray start --num-cpus N --num-gpus M)",
        )
    for d in wanted:
        if not any(n.get("CPU", 0.0) >= d.cpus and n.get("GPU", 0.0) >= d.gpus for n in nodes):
            raise ConfigError(
                "cluster.ray",
                f"one {d.name} needs {d.cpus:g} CPU and {d.gpus:g} GPU on one node; no node of "
                "the Ray cluster has that much",
            )
