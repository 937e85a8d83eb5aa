"""Where a job step runs: this node's Slurm name, a node's address, the GPU environment Ray
needs. Pure functions apart from :func:`node_ip` (asks ``scontrol``) and :func:`this_node`."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Mapping

# Slurm hands a GPU step these; Ray on ROCm must see HIP_VISIBLE_DEVICES only (Ray >= 2.45
# asserts when ROCR_VISIBLE_DEVICES is set next to it, ray issue 53737)
SLURM_GPU_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")


def this_node() -> str:
    """This step's node name as Slurm knows it (several fake nodes may share one hostname)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def _node_fields(node: str) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "show", "node", node, "-o"], capture_output=True, text=True, check=True
    ).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def node_ip(node: str) -> str:
    """The IPv4 address of ``node``'s NodeAddr (what Slurm reaches it at)."""
    return socket.gethostbyname(_node_fields(node).get("NodeAddr", node))


def node_hostnames(nodes: list[str]) -> dict[str, str]:
    """The host each node runs on (several fake nodes of a test cluster share one): one
    ``scontrol`` call for all of them."""
    out = subprocess.run(
        ["scontrol", "show", "node", ",".join(nodes), "-o"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    hosts = {}
    for line in out.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "NodeName" in fields:
            hosts[fields["NodeName"]] = fields.get("NodeHostName", fields["NodeName"])
    return {n: hosts.get(n, n) for n in nodes}


def ray_gpu_env(env: Mapping[str, str], accelerator: str, gpus: int) -> dict[str, str]:
    """``env`` as Ray's node process needs it: on ROCm, Slurm's GPU variables become
    ``HIP_VISIBLE_DEVICES`` (Ray then narrows it per actor to the GPUs it gives the actor;
    colocated engines opt out per actor, see rstar2.runtime.placement); on a node without
    GPUs, none is visible."""
    out = dict(env)
    if gpus == 0:
        for name in SLURM_GPU_VARS:
            out.pop(name, None)
        return out
    if accelerator == "rocm":
        visible = next((out[n] for n in SLURM_GPU_VARS if out.get(n)), None)
        for name in SLURM_GPU_VARS:
            out.pop(name, None)
        out["HIP_VISIBLE_DEVICES"] = visible or ",".join(str(i) for i in range(gpus))
        out.pop("RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES", None)
    return out
