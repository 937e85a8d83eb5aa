"""How a job's steps run in ``launch.image`` (pure: from the plan's fields, no I/O).

Every step of a job script is ``srun [SRUN_OPTIONS] PREFIX PYTHON -m ...``:

- ``none``: the host's interpreter and checkout (``PYTHON`` is the launching venv's python,
  the working folder the checkout);
- ``pyxis``: srun's ``--container-image`` / ``--container-mounts`` / ``--container-workdir``
  (enroot; the host environment is passed in by pyxis);
- ``apptainer``: ``apptainer exec`` with the vendor's GPU flag (``--nv`` / ``--rocm``), binds
  and ``--pwd`` (apptainer passes the host environment in);
- ``docker``: ``docker run --rm --init`` as the job's user, on the host network, IPC and PID
  namespaces (preflight sees the host's processes), the vendor's GPU devices on GPU steps, the
  job's variables by name (``$(docker_env)`` in the script: docker passes nothing by default;
  by name, so each task's own values) and the mounts.

In an image the code is the image's (``/opt/rstar2``, docker/*.Dockerfile) and the interpreter
its ``python3``; the runs folder (and the log folder, and ``launch.container_mounts``) is
mounted at the same path, so every path in the job means the same inside and out.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

IMAGE_WORKDIR = "/opt/rstar2"  # where docker/*.Dockerfile install rstar2
IMAGE_PYTHON = "python3"


@dataclass(frozen=True)
class StepWrap:
    """What a step's ``srun`` gets: options before the command, a prefix to it, the
    interpreter and the folder the step runs in."""

    srun_options: str  # "" or "--container-image=... " (ends with a space when not empty)
    prefix: str  # "" or "apptainer exec ... IMAGE " (ends with a space when not empty)
    python: str
    workdir: str


def step_wrap(
    container: str,
    image: str | None,
    accelerator: str,
    mounts: tuple[str, ...],
    *,
    host_python: str,
    host_workdir: str,
    gpus: bool = True,
) -> StepWrap:
    """The wrap of a step for ``container`` (``mounts``: SRC:DST, the run folders first;
    ``gpus``: the step uses the node's GPUs, so the container gets the vendor's devices — never
    on a CPU node, where docker would refuse devices that are not there)."""
    if container == "none":
        return StepWrap("", "", shlex.quote(host_python), host_workdir)
    if not image:
        raise ValueError(f"container {container} needs an image")
    q = shlex.quote
    if container == "pyxis":
        opts = [
            f"--container-image={q(image)}",
            f"--container-mounts={q(','.join(mounts))}",
            f"--container-workdir={IMAGE_WORKDIR}",
        ]
        return StepWrap(" ".join(opts) + " ", "", IMAGE_PYTHON, IMAGE_WORKDIR)
    if container == "apptainer":
        gpu = {"cuda": ["--nv"], "rocm": ["--rocm"]}.get(accelerator, []) if gpus else []
        binds = [f"--bind={q(m)}" for m in mounts]
        words = ["apptainer", "exec", *gpu, *binds, f"--pwd={IMAGE_WORKDIR}", q(image)]
        return StepWrap("", " ".join(words) + " ", IMAGE_PYTHON, IMAGE_WORKDIR)
    if container == "docker":
        gpu = {
            # every GPU, numbered as on the host; the task's own CUDA_VISIBLE_DEVICES (passed by
            # name, so each task's value) narrows to Slurm's allocation
            "cuda": ["--gpus=all"],
            # every GPU's device files; the task's HIP/ROCR_VISIBLE_DEVICES narrow them
            "rocm": [
                "--device=/dev/kfd", "--device=/dev/dri", "--group-add=video",
                "--security-opt=seccomp=unconfined",
            ],
        }.get(accelerator, []) if gpus else []  # fmt: skip
        volumes = [f"--volume={q(m)}" for m in mounts]
        words = [
            "docker", "run", "--rm", "--init", "--network=host", "--ipc=host", "--pid=host",
            '--user="$(id -u):$(id -g)"', "--env=HOME=/tmp", "--ulimit=memlock=-1",
            "--shm-size=16g", *gpu, "$(docker_env)", *volumes,
            f"--workdir={IMAGE_WORKDIR}", q(image),
        ]  # fmt: skip
        return StepWrap("", " ".join(words) + " ", IMAGE_PYTHON, IMAGE_WORKDIR)
    raise ValueError(f"unknown container mode {container!r}")


# the variables a docker step is given by name (the job's own, Slurm's, the profiles' and the
# GPU runtimes'); PATH, HOME and the like stay the image's
DOCKER_ENV_PATTERN = (
    "^(RAY_|SANDBOX_POOL_|REDIS_|SLURM|NCCL_|RCCL_|HIP_|HSA_|ROCR_|GPU_|TORCH_|PYTORCH_|VLLM_|"
    "CUDA_|OMP_|MASTER_|RSTAR2_|SAFETENSORS_|HF_|TRANSFORMERS_)"
)
