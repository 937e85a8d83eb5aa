"""Preflight of one node of a launched job (the job script runs it on every node at once):

    python -m launcher.preflight --out DIR --canary FILE --ports FIRST COUNT [--gpus N] \\
        [--accelerator {cpu,cuda,rocm}]

Writes ``DIR/<node>.json``: ``{"node", "ok", "errors": [...], "warnings": [...], "facts": {...}}``
and exits 1 when a check failed. Failures: Ray or vLLM processes of this user still running
(a previous job's), the shared-file-system canary the batch step wrote not readable here, fewer
GPUs visible than asked for, a port of the job's block taken. Warnings: files of this user left
in /dev/shm, and host settings a job cannot change: NUMA balancing on; on ``rocm`` nodes only,
also CPU idle states deeper than C1 enabled and an active IOMMU not in pass-through mode (AMD's
MI300X system optimization guide advises against both; NVIDIA's guides differ, so ``cpu`` and
``cuda`` nodes are not checked for them). The host checks read files under a root folder, so
tests give them a fake /sys and /proc.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from launcher.nodes import node_info, this_node

ACCELERATORS = ("cpu", "cuda", "rocm")
STALE = ("raylet", "gcs_server", "ray::", "VLLM::", "vllm.entrypoints", "vllm serve")


def stale_processes(uid: int, own: set[int]) -> list[str]:
    """``pid cmdline`` of this user's Ray / vLLM processes outside ``own`` (this step's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in own:
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(s in cmd for s in STALE) and "launcher.preflight" not in cmd:
            found.append(f"{entry.name} {cmd.strip()[:120]}")
    return found


def taken_ports(host: str, first: int, count: int) -> list[int]:
    out = []
    for port in range(first, first + count):
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind
            try:
                sock.bind((host, port))
            except OSError:
                out.append(port)
    return out


def visible_gpus() -> int:
    """GPUs this step sees: Slurm's visible-devices list, else the device files."""
    for name in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        value = os.environ.get(name)
        if value:
            return len([v for v in value.split(",") if v])
    nvidia = [p for p in Path("/dev").glob("nvidia[0-9]*")]
    amd = list(Path("/dev/dri").glob("renderD*")) if Path("/dev/kfd").exists() else []
    return len(nvidia) or len(amd)


def check(args: argparse.Namespace) -> dict[str, object]:
    errors: list[str] = []
    warnings: list[str] = []
    facts: dict[str, object] = {}
    stale = stale_processes(os.getuid(), {os.getpid(), os.getppid()})
    if stale:
        errors.append(f"{len(stale)} Ray/vLLM processes of this user still run: {stale[:3]}")
    try:
        facts["canary"] = Path(args.canary).read_text().strip()
    except OSError as e:
        errors.append(f"shared file system: {args.canary} not readable here ({e.strerror})")
    gpus, wanted = visible_gpus(), args.gpus
    if wanted is None:
        wanted = int(os.environ.get("SLURM_GPUS_ON_NODE") or 0)
    facts["gpus"] = gpus
    if gpus < wanted:
        errors.append(f"{gpus} GPUs visible, {wanted} allocated")
    if args.ports:
        first, count = args.ports
        host = args.host or _own_address()
        taken = taken_ports(host, first, count)
        if taken:
            errors.append(f"ports of this job's block taken on {host}: {taken[:10]}")
    uid = os.getuid()
    shm = [p.name for p in Path("/dev/shm").iterdir() if _owned(p, uid)]
    if shm:
        warnings.append(f"{len(shm)} files of this user in /dev/shm: {shm[:5]}")
    warnings += host_warnings(args.accelerator)
    return {"node": this_node(), "ok": not errors, "errors": errors, "warnings": warnings,
            "facts": facts}  # fmt: skip


# Host settings: pure functions of the files under ``root``, each the warning or None. The
# advice is AMD's "AMD Instinct MI300X system optimization" guide,
# https://rocm.docs.amd.com/en/latest/how-to/system-optimization/mi300x.html


def host_warnings(accelerator: str, root: Path = Path("/")) -> list[str]:
    """The host settings' warnings for a node of ``accelerator`` (cpu, cuda, rocm)."""
    checks = [numa_balancing_warning]
    if accelerator == "rocm":  # AMD's advice; NVIDIA's guides differ
        checks += [cpu_idle_warning, iommu_warning]
    return [w for w in (c(root) for c in checks) if w]


def numa_balancing_warning(root: Path = Path("/")) -> str | None:
    # AMD's guide: automatic NUMA balancing (page-fault sampling, page moves) can slow GPU
    # workloads; it advises turning it off
    numa = root / "proc/sys/kernel/numa_balancing"
    if numa.exists() and numa.read_text().strip() != "0":
        return "NUMA balancing is on (sysctl kernel.numa_balancing=0 is advised)"
    return None


def cpu_idle_warning(root: Path = Path("/")) -> str | None:
    """CPU idle states deeper than C1 (cpuidle state2 and up) enabled on any CPU, by name."""
    # AMD's guide: waking a CPU from a deep C-state delays the host threads that feed the GPUs;
    # it advises disabling them (`cpupower idle-set -d 2`)
    cpus: dict[tuple[int, str], int] = {}  # (state index, name): CPUs it is enabled on
    for state in root.glob("sys/devices/system/cpu/cpu[0-9]*/cpuidle/state[0-9]*"):
        index = int(state.name.removeprefix("state"))
        if index < 2 or _read(state / "disable") != "0":
            continue
        key = (index, _read(state / "name") or state.name)
        cpus[key] = cpus.get(key, 0) + 1
    if not cpus:
        return None
    states = ", ".join(f"{name} (state{i}) on {n} CPUs" for (i, name), n in sorted(cpus.items()))
    fix = "; ".join(f"cpupower idle-set -d {i}" for i in sorted({i for i, _ in cpus}))
    return f"deep CPU idle states enabled: {states} ({fix} is advised)"


def iommu_warning(root: Path = Path("/")) -> str | None:
    """An IOMMU active (``/sys/class/iommu`` not empty) without ``iommu=pt`` on the kernel
    command line."""
    # AMD's guide advises `iommu=pt` on the kernel command line: in pass-through mode the
    # devices' DMA (GPUs, NICs) skips the IOMMU's address translation
    iommu = root / "sys/class/iommu"
    if not iommu.is_dir() or not any(iommu.iterdir()):
        return None
    cmdline = _read(root / "proc/cmdline")
    if cmdline is None or "iommu=pt" in cmdline.split():
        return None
    return "the IOMMU is not in pass-through mode (iommu=pt on the kernel command line is advised)"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _own_address() -> str:
    try:
        node = this_node()
        return node_info([node])[node].ip
    except (OSError, subprocess.CalledProcessError):  # not under Slurm
        return "0.0.0.0"


def _owned(path: Path, uid: int) -> bool:
    try:
        return path.stat().st_uid == uid
    except OSError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.preflight")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--canary", required=True)
    parser.add_argument("--ports", nargs=2, type=int, metavar=("FIRST", "COUNT"))
    parser.add_argument("--host", default=None, help="address the job's ports bind to")
    parser.add_argument("--gpus", type=int, default=None, help="default: Slurm's allocation")
    parser.add_argument(
        "--accelerator", choices=ACCELERATORS, default="cpu", help="rocm adds AMD's host checks"
    )
    args = parser.parse_args(argv)
    report = check(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{report['node']}.json").write_text(json.dumps(report, indent=1) + "\n")
    for line in report["errors"]:  # type: ignore[attr-defined]
        print(f"preflight {report['node']}: {line}", file=sys.stderr)
    for line in report["warnings"]:  # type: ignore[attr-defined]
        print(f"preflight {report['node']}: warning: {line}", file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
