"""The job script of a :class:`~launcher.plan.JobPlan`, from ``launcher/templates`` (pure:
the same plan and paths give the same bytes; nothing time- or host-dependent is rendered)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from launcher.container import DOCKER_ENV_PATTERN, StepWrap, step_wrap
from launcher.plan import PORT_BLOCKS, PORT_FIRST, PORT_OFFSETS, PORT_STRIDE, JobPlan

TEMPLATES = Path(__file__).parent / "templates"
PROFILES = Path(__file__).parent / "profiles"


@dataclass(frozen=True)
class JobPaths:
    run_dir: str  # the training run's folder (rstar2 train --run-dir)
    attempt_dir: str  # this rendering: job.sbatch, config.json, env.sh
    log_dir: str
    workdir: str  # where `python -m launcher...` and `-m rstar2.cli` import from
    python: str  # the interpreter on the compute nodes


def render_sbatch(plan: JobPlan, paths: JobPaths, template: str = "slurm.sbatch.j2") -> str:
    """The job script of ``plan`` (``template``: ``slurm.sbatch.j2``, the Ray job of
    ``rstar2 launch slurm``, or ``torchrun.sbatch.j2``, a learner-only job)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # a shell script: values are quoted with |q where they are paths
    )
    env.filters["q"] = lambda v: shlex.quote(str(v))
    groups = ",".join(str(i) for i in range(len(plan.components)))
    ports = {
        "first": PORT_FIRST, "stride": PORT_STRIDE, "blocks": PORT_BLOCKS, "offsets": PORT_OFFSETS,
    }  # fmt: skip
    wrap, wrap_cpu = _wrap(plan, paths, gpus=True), _wrap(plan, paths, gpus=False)
    if plan.container == "pyxis":  # pyxis works through srun only: a one-task step on the head
        on_batch_host = (
            "srun --het-group=0 --nodes=1 --ntasks=1 --overlap "
            f'-J wait -w "$HEAD_NODE" {wrap_cpu.srun_options}'
        )
    else:
        on_batch_host = wrap_cpu.prefix
    return env.get_template(template).render(
        plan=plan,
        run_dir=paths.run_dir,
        attempt_dir=paths.attempt_dir,
        log_dir=paths.log_dir,
        batch_dir=paths.workdir if plan.container == "none" else paths.run_dir,
        w=wrap,
        w_cpu=wrap_cpu,
        on_batch_host=on_batch_host,
        docker_env_pattern=DOCKER_ENV_PATTERN,
        all_groups=groups,
        ports=ports,
    )


def _wrap(plan: JobPlan, paths: JobPaths, *, gpus: bool) -> StepWrap:
    mounts = [f"{paths.run_dir}:{paths.run_dir}"]
    if not paths.log_dir.startswith(paths.run_dir.rstrip("/") + "/"):
        mounts.append(f"{paths.log_dir}:{paths.log_dir}")
    mounts += plan.container_mounts
    return step_wrap(
        plan.container, plan.image, plan.accelerator, tuple(mounts),
        host_python=paths.python, host_workdir=paths.workdir, gpus=gpus,
    )  # fmt: skip


def render_env(plan: JobPlan) -> str:
    """``env.sh``: the environment profile (if any), sourced on every node before each step."""
    lines = ["# rstar2 job environment, sourced by job.sbatch (rendered by rstar2 launch)\n"]
    if plan.profile == "nvidia" and plan.learner_backend != "megatron":
        lines.append(
            "# torch backend: CUDA's default 8 queues; one (the profile's value, for megatron's\n"
            "# TP overlap) serialises FSDP2's prefetch and compute streams (source: verl PR\n"
            "# #6976, https://github.com/verl-project/verl/pull/6976; the profile's note)\n"
            "export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-8}\n"
        )
    if plan.profile:
        lines.append(f"# profile: launcher/profiles/{plan.profile}.env\n")
        lines.append((PROFILES / f"{plan.profile}.env").read_text())
    return "".join(lines)
