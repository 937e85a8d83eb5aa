"""One node's Ray process in a launched job; the job script runs it on every node of a role
(one ``srun`` per role):

    python -m launcher.ray_node --role learner --head NODE --job-nodes N1,N2,.. --gpus 8 \\
        --accelerator rocm --port-base P

The head node starts the head; the others wait until its GCS accepts connections, then join.
Each node advertises its role as a resource (``{role: GPUs}``, or ``{role: CPUs}`` on a CPU
node, with ``--num-gpus 0``) and keeps its session under its own
``/tmp/rstar2-ray-<job>-<node>``. Its ports come from the job's block (launcher.plan): the
head's GCS and client ports, and one set per node of a host (a test cluster's fake nodes share
a machine: the job's nodes with the same Slurm NodeHostname take one slot each). On TERM it
removes its session folder and stops the Ray processes it started (Slurm signals them too), so a
cancelled job leaves neither processes nor sessions behind.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

from launcher.nodes import node_info, ray_gpu_env, this_node
from launcher.plan import PORT_OFFSETS, node_ray_ports


def temp_dir(job_id: str, node: str) -> str:
    return f"/tmp/rstar2-ray-{job_id}-{node}"


def host_slot(node: str, job_nodes: list[str], hosts: dict[str, str]) -> tuple[int, int]:
    """(how many of the job's nodes before ``node`` share its host, how many do in all)."""
    same = [n for n in job_nodes if hosts[n] == hosts[node]]
    return same.index(node), len(same)


def start_command(
    args: argparse.Namespace, node: str, ip: str, head_ip: str, tmp: str, slot: tuple[int, int]
) -> list[str]:
    """The ``ray start --block`` command for this node (pure)."""
    gcs = args.port_base + PORT_OFFSETS["ray_gcs"]
    client = args.port_base + PORT_OFFSETS["ray_client"]
    amount = args.gpus if args.gpus else (os.cpu_count() or 1)
    ray = [sys.executable, "-m", "ray.scripts.scripts"]  # the job's Python's Ray, PATH or not
    cmd = [*ray, "start", "--block", f"--node-ip-address={ip}", f"--temp-dir={tmp}"]
    cmd += [f"--num-gpus={args.gpus}", f"--resources={json.dumps({args.role: amount})}"]
    if node == args.head:
        cmd += ["--head", f"--port={gcs}", f"--ray-client-server-port={client}"]
        cmd += ["--include-dashboard=false"]
    else:
        cmd += [f"--address={head_ip}:{gcs}"]
    return cmd + node_ray_ports(args.port_base, *slot)


def _wait_for_port(host: str, port: int, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=2):
                return
        except OSError:
            if time.monotonic() > end:
                raise SystemExit(f"ray_node: the Ray head {host}:{port} did not come up") from None
            time.sleep(0.5)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.ray_node")
    parser.add_argument("--role", required=True)
    parser.add_argument("--head", required=True, help="the head node's Slurm name")
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--accelerator", default="cuda")
    parser.add_argument("--job-nodes", required=True, help="every node of the job, comma-separated")
    parser.add_argument("--port-base", type=int, required=True, help="the job's port block")
    parser.add_argument("--head-timeout-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    node = this_node()
    job_nodes = args.job_nodes.split(",")
    info = node_info([node, args.head, *job_nodes])
    ip, head_ip = info[node].ip, info[args.head].ip
    slot = host_slot(node, job_nodes, {n: i.hostname for n, i in info.items()})
    tmp = temp_dir(os.environ.get("SLURM_JOB_ID", "0"), node)
    cmd = start_command(args, node, ip, head_ip, tmp, slot)
    if node != args.head:
        _wait_for_port(head_ip, args.port_base + PORT_OFFSETS["ray_gcs"], args.head_timeout_s)
    env = ray_gpu_env(os.environ, args.accelerator, args.gpus)
    # a stop is the job's end (the driver is done or checkpointed): no 30 s drain, which would
    # outlast Slurm's kill wait and leave the session folder behind
    env.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")
    # the Ray processes stay in this step (Slurm signals and reaps them with it); never
    # `ray stop`, which kills every Ray process of the host: other jobs', other fake nodes'
    proc = subprocess.Popen(cmd, env=env)
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        print(f"ray_node: signal {signum}: stopping", file=sys.stderr, flush=True)
        proc.terminate()  # `ray start --block` stops what it started on TERM
        shutil.rmtree(tmp, ignore_errors=True)  # first: Slurm's kill wait may be short

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        code = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if stopping else code


if __name__ == "__main__":
    sys.exit(main())
