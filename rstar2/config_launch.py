"""The ``launch:`` section: how ``rstar2 launch`` asks a cluster for the run's nodes.

One role each — ``learner`` (GPU), ``rollout`` (GPU, the vLLM engines) and ``sandbox`` (CPU:
Redis and the sandbox service) — with its node count and the Slurm fields that pick the nodes.
A role of 0 nodes is not asked for (engines then share the learner nodes, the sandbox runs in
the trainer). Checks that need the rest of the run's config (GPUs enough for the learner ranks
and engines, the sandbox mode a sandbox node serves) are :func:`launcher.plan.check_launch`'s.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from rstar2.config_base import Section

# Slurm's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
_TIME = re.compile(r"^(\d+|\d+:\d{2}|\d+:\d{2}:\d{2}|\d+-\d+|\d+-\d+:\d{2}|\d+-\d+:\d{2}:\d{2})$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # partition, account, qos, node names


class LaunchRoleConfig(Section):
    """The nodes of one role: one hetjob component of the Slurm job when ``nodes`` > 0."""

    nodes: int = Field(0, ge=0, description="Nodes of this role; 0: the role is not asked for.")
    gpus_per_node: int = Field(
        0, ge=0, description="GPUs asked for on each node (--gpus-per-node)."
    )
    partition: str | None = Field(None, description="Slurm partition; None: the cluster's default.")
    account: str | None = Field(None, description="Slurm account to charge.")
    qos: str | None = Field(None, description="Slurm quality of service.")
    time: str | None = Field(
        None, description="Wall-time limit in Slurm's form (H:MM:SS, D-H:MM:SS); None: default."
    )
    constraint: str | None = Field(None, description="Slurm node features (--constraint).")
    exclude: list[str] = Field(default_factory=list, description="Nodes never to use (--exclude).")
    nodelist: list[str] = Field(default_factory=list, description="Nodes to use (--nodelist).")

    @field_validator("partition", "account", "qos")
    @classmethod
    def _slurm_name(cls, value: str | None) -> str | None:
        if value is not None and not _NAME.match(value):
            raise ValueError(
                f"{value!r} is not a Slurm name: letters, digits, '_', '.' and '-' only"
            )
        return value

    @field_validator("exclude", "nodelist")
    @classmethod
    def _node_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.\[\]\-,]*$", name):
                raise ValueError(f"{name!r} is not a node name or range (such as gpu[01-04])")
        return value

    @field_validator("time")
    @classmethod
    def _slurm_time(cls, value: str | None) -> str | None:
        if value is not None and not _TIME.match(value):
            raise ValueError(f"{value!r} is not a Slurm time: use H:MM:SS or D-H:MM:SS")
        return value


class LaunchConfig(Section):
    """What ``rstar2 launch slurm`` renders into the job script."""

    job_name: str | None = Field(
        None, pattern=r"^[A-Za-z0-9._-]+$", description="Slurm job name; None: the run's name."
    )
    learner: LaunchRoleConfig = Field(
        default_factory=lambda: LaunchRoleConfig(nodes=1, gpus_per_node=8),
        description="Learner nodes (GPU); the Ray head runs on the first.",
    )
    rollout: LaunchRoleConfig = Field(
        default_factory=lambda: LaunchRoleConfig(nodes=0, gpus_per_node=8),
        description="Rollout engine nodes (GPU); 0: engines on the learner nodes.",
    )
    sandbox: LaunchRoleConfig = Field(
        default_factory=LaunchRoleConfig,
        description="Sandbox nodes (CPU: Redis and sandbox-pool); 0: the sandbox runs in the "
        "trainer (sandbox.mode embedded).",
    )
    container: Literal["none", "pyxis", "apptainer", "docker"] = Field(
        "none", description="How every step runs: on the host or in launch.image."
    )
    image: str | None = Field(None, description="Container image (needed unless container none).")
    container_mounts: list[str] = Field(
        default_factory=list, description="SRC:DST mounts into the container (the run folder is)."
    )
    requeue: bool = Field(True, description="Requeue on preemption / node failure (--requeue).")
    log_dir: str | None = Field(
        None, description="Folder for the job's logs; None: the attempt folder's logs/."
    )
    profile: Literal["auto", "mi300x", "nvidia", "none"] = Field(
        "auto",
        description="Environment profile sourced on every node (launcher/profiles); auto: by "
        "cluster.accelerator (rocm: mi300x, cuda: nvidia, cpu: none).",
    )
    start_timeout_s: float = Field(
        600.0, gt=0, description="Deadline for every node to join Ray with its role's resources."
    )
