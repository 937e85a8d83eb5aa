"""Where a job step runs: this node's Slurm name, the job's nodes' addresses and hosts, the GPU
environment Ray needs. Pure functions apart from :func:`node_info` (one ``scontrol`` call for
all the nodes asked about) and :func:`this_node`."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

# Slurm hands a GPU step these; Ray on ROCm must see HIP_VISIBLE_DEVICES only (Ray >= 2.45
# asserts when ROCR_VISIBLE_DEVICES is set next to it, ray issue 53737)
SLURM_GPU_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")


@dataclass(frozen=True)
class NodeInfo:
    """A Slurm node as the job's steps need it."""

    ip: str  # the IPv4 address of its NodeAddr (what Slurm reaches it at)
    hostname: str  # the host it runs on (several fake nodes of a test cluster share one)


def this_node() -> str:
    """This step's node name as Slurm knows it (several fake nodes may share one hostname)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def parse_scontrol_nodes(text: str) -> dict[str, dict[str, str]]:
    """Each node's ``key=value`` fields in ``scontrol show node -o`` output (one line a node),
    by NodeName (pure). A key's first occurrence wins: free-text fields (OS, Reason) come
    after the node's own and may hold spaces and ``=``."""
    nodes = {}
    for line in text.splitlines():
        fields: dict[str, str] = {}
        for key, _, value in (f.partition("=") for f in line.split() if "=" in f):
            fields.setdefault(key, value)
        if "NodeName" in fields:
            nodes[fields["NodeName"]] = fields
    return nodes


def node_info(nodes: list[str]) -> dict[str, NodeInfo]:
    """Each of ``nodes``' address and host, from one ``scontrol show node a,b,c`` call; a
    field Slurm does not give (NodeAddr, NodeHostName) is the node's name."""
    names = list(dict.fromkeys(nodes))  # once each; an empty list would show every node
    if not names:
        return {}
    out = subprocess.run(
        ["scontrol", "show", "node", ",".join(names), "-o"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    fields = parse_scontrol_nodes(out)
    return {n: _info(n, fields.get(n, {})) for n in names}


def _info(name: str, fields: dict[str, str]) -> NodeInfo:
    ip = socket.gethostbyname(fields.get("NodeAddr", name))
    return NodeInfo(ip=ip, hostname=fields.get("NodeHostName", name))


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
