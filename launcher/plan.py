"""What a Slurm job of a run asks for, decided from the run's config alone (no I/O).

:func:`plan_job` checks the ``launch:`` section against the rest of the config (one
:class:`~rstar2.config.ConfigError` naming the key, before anything is written or submitted)
and returns a :class:`JobPlan`: one hetjob component per role that has nodes, in the order
learner, rollout, sandbox, so every role's nodes are the node list Slurm gives its component
(never a position in a sorted host list). :func:`port_block` is the job's port range.
"""

from __future__ import annotations

from dataclasses import dataclass

from rstar2.config import Config, ConfigError
from rstar2.config_launch import LaunchRoleConfig
from rstar2.config_rules import check_launch

ROLES = ("learner", "rollout", "sandbox")

# Ray and the sandbox listen on a block of ports chosen from the job id, below Linux's
# ephemeral range (32768+), so two jobs sharing a node do not clash and no port is picked at
# random by a process that a later one collides with.
PORT_FIRST = 20000
PORT_STRIDE = 400
PORT_BLOCKS = 30  # 20000 .. 31999
PORT_OFFSETS = {  # job-wide; "metrics": the driver's Prometheus endpoint (logging.metrics_port)
    "ray_gcs": 0, "ray_client": 1, "redis": 2, "sandbox_http": 3, "metrics": 4,
}  # fmt: skip
# every node's own Ray ports (`ray start` options), one set per node sharing a host: nodes of a
# real cluster are slot 0; a test cluster's fake nodes on one machine take slots 0, 1, 2
NODE_PORTS = (
    "node-manager-port",
    "object-manager-port",
    "metrics-export-port",
    "dashboard-agent-grpc-port",
    "dashboard-agent-listen-port",
    "runtime-env-agent-port",
)
# worker ports: the block's rest, shared by the nodes of a host (a 192-core node prestarts a
# worker per core, each holding a port)
NODE_PORTS_FIRST, WORKER_PORTS_FIRST = 10, 64
MAX_NODES_PER_HOST = (WORKER_PORTS_FIRST - NODE_PORTS_FIRST) // len(NODE_PORTS)


@dataclass(frozen=True)
class Component:
    """One hetjob component: a role's nodes and its ``#SBATCH`` options."""

    role: str
    nodes: int
    gpus_per_node: int
    options: tuple[str, ...]  # "--partition=gpu", ... (without "#SBATCH ")


@dataclass(frozen=True)
class JobPlan:
    job_name: str
    components: tuple[Component, ...]
    accelerator: str
    profile: str | None  # a file in launcher/profiles, without ".env"
    container: str
    image: str | None
    container_mounts: tuple[str, ...]
    requeue: bool
    start_timeout_s: float
    learner_backend: str = "torch"
    # logging.metrics_port is set: the driver serves on the job's "metrics" port (any fixed
    # port of the config would clash between two jobs on one head node)
    serve_metrics: bool = False

    def component(self, role: str) -> Component | None:
        return next((c for c in self.components if c.role == role), None)

    def het_group(self, role: str) -> int | None:
        """The role's hetjob component index (None: the role has no nodes)."""
        roles = [c.role for c in self.components]
        return roles.index(role) if role in roles else None


def port_block(job_id: int) -> dict[str, int]:
    """The job-wide ports of job ``job_id`` (the job script computes the same in shell)."""
    first = PORT_FIRST + (job_id % PORT_BLOCKS) * PORT_STRIDE
    return {name: first + offset for name, offset in PORT_OFFSETS.items()} | {"base": first}


def node_ray_ports(base: int, slot: int, slots: int = 1) -> list[str]:
    """``ray start`` port options of the node in ``slot`` of the ``slots`` job nodes on its host
    (one on a real cluster: the whole worker range is its own)."""
    if not 0 <= slot < slots <= MAX_NODES_PER_HOST:
        raise ValueError(f"at most {MAX_NODES_PER_HOST} nodes of one job per host (slot {slot})")
    first = base + NODE_PORTS_FIRST + slot * len(NODE_PORTS)
    out = [f"--{name}={first + i}" for i, name in enumerate(NODE_PORTS)]
    width = (PORT_STRIDE - WORKER_PORTS_FIRST) // slots
    workers = base + WORKER_PORTS_FIRST + slot * width
    return [*out, f"--min-worker-port={workers}", f"--max-worker-port={workers + width - 1}"]


def plan_job(cfg: Config) -> JobPlan:
    """The job ``cfg`` asks for; ConfigError (the key and why) for a launch it cannot run
    (:func:`rstar2.config_rules.check_launch`: the run placed on the roles, in Ray)."""
    check_launch(cfg, ray_job=True)
    components = tuple(
        Component(role, r.nodes, r.gpus_per_node, _options(r))
        for role in ROLES
        if (r := getattr(cfg.launch, role)).nodes
    )
    return _job_plan(cfg, components)


def plan_torchrun_job(cfg: Config) -> JobPlan:
    """A learner-only job (``rstar2 sft`` under torchrun, one rank per GPU of the
    ``launch.learner`` nodes); ConfigError (the key and why) for one it cannot run. The other
    roles' nodes are not asked for."""
    from rstar2.trainer.wiring import check_learner_supported

    check_launch(cfg, ray_job=False)
    learner = cfg.launch.learner
    ranks = learner.nodes * ranks_per_node(learner)
    if cfg.learner.num_ranks != ranks:
        raise ConfigError(
            "learner.num_ranks",
            f"a torchrun job starts one rank per GPU: {learner.nodes} x "
            f"{ranks_per_node(learner)} = {ranks}, but learner.num_ranks is "
            f"{cfg.learner.num_ranks}",
        )
    check_learner_supported(cfg, torchrun_ranks=ranks)
    component = Component("learner", learner.nodes, learner.gpus_per_node, _options(learner))
    return _job_plan(cfg, (component,))


def ranks_per_node(learner: LaunchRoleConfig) -> int:
    """torchrun's ranks on each learner node: one per GPU (one on a CPU node without GPUs)."""
    return learner.gpus_per_node or 1


def _job_plan(cfg: Config, components: tuple[Component, ...]) -> JobPlan:
    launch = cfg.launch
    profile = {"rocm": "mi300x", "cuda": "nvidia", "cpu": None}[cfg.cluster.accelerator]
    if launch.profile != "auto":
        profile = None if launch.profile == "none" else launch.profile
    return JobPlan(
        job_name=launch.job_name or cfg.name,
        components=components,
        accelerator=cfg.cluster.accelerator,
        profile=profile,
        container=launch.container,
        image=launch.image,
        container_mounts=tuple(launch.container_mounts),
        requeue=launch.requeue,
        start_timeout_s=launch.start_timeout_s,
        learner_backend=cfg.learner.backend,
        serve_metrics=cfg.logging.metrics_port is not None,
    )


def _options(role: LaunchRoleConfig) -> tuple[str, ...]:
    out = [f"--nodes={role.nodes}", "--ntasks-per-node=1", "--exclusive"]
    if role.gpus_per_node:
        out.append(f"--gpus-per-node={role.gpus_per_node}")
    for name in ("partition", "account", "qos", "time", "constraint"):
        value = getattr(role, name)
        if value:
            out.append(f"--{name}={value}")
    if role.exclude:
        out.append(f"--exclude={','.join(role.exclude)}")
    if role.nodelist:
        out.append(f"--nodelist={','.join(role.nodelist)}")
    return tuple(out)
