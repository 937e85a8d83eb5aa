"""The launcher's node facts and host checks without a Slurm or a tuned host: the parse of
``scontrol show node -o`` text, :func:`node_info` against a fake ``scontrol`` on PATH (one call
for all the nodes), and the preflight's host warnings on fake /sys and /proc trees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.nodes import NodeInfo, node_info, parse_scontrol_nodes
from launcher.preflight import (
    cpu_idle_warning,
    host_warnings,
    iommu_warning,
    main,
    numa_balancing_warning,
)
from launcher.ray_node import host_slot

# `scontrol show node gpu1,gpu2,localhost -o` of Slurm 22.05 (the test cluster's shape: two
# fake nodes on one host, each its own loopback address); free-text fields hold spaces and `=`
SCONTROL = """\
NodeName=gpu1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.31 \
AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:2 NodeAddr=127.0.0.2 \
NodeHostName=ci-host Version=22.05.8 OS=Linux 6.5.0-1025-azure #26~22.04.1-Ubuntu SMP \
RealMemory=4000 AllocMem=0 FreeMem=1800 Sockets=2 Boards=1 State=IDLE ThreadsPerCore=1 \
Partitions=gpu CfgTRES=cpu=2,mem=4000M,billing=2,gres/gpu=2 AllocTRES= \
Reason=moved NodeAddr=10.9.9.9 by hand [root@2024-07-30T10:00:00]
NodeName=gpu2 Arch=x86_64 CPUTot=2 Gres=gpu:2 NodeAddr=127.0.0.3 NodeHostName=ci-host \
Version=22.05.8 State=IDLE Partitions=gpu
NodeName=localhost Arch=x86_64 CPUTot=2 Gres=(null) State=IDLE Partitions=cpu
"""


def test_the_parse_gives_each_nodes_fields_by_name_first_occurrence_winning() -> None:
    nodes = parse_scontrol_nodes(SCONTROL)
    assert list(nodes) == ["gpu1", "gpu2", "localhost"]
    gpu1 = nodes["gpu1"]
    assert gpu1["NodeAddr"] == "127.0.0.2"  # not the one in Reason's free text
    assert gpu1["NodeHostName"] == "ci-host"
    assert gpu1["CfgTRES"] == "cpu=2,mem=4000M,billing=2,gres/gpu=2"
    assert gpu1["AllocTRES"] == ""
    assert nodes["gpu2"]["NodeAddr"] == "127.0.0.3"
    assert "NodeAddr" not in nodes["localhost"]


def test_the_parse_skips_lines_that_name_no_node() -> None:
    assert parse_scontrol_nodes("") == {}
    assert parse_scontrol_nodes("\nNode gpu9 not found\nState=IDLE\n") == {}


def _fake_scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``scontrol`` on PATH that prints SCONTROL and appends its arguments to a file."""
    calls = tmp_path / "calls"
    (tmp_path / "bin").mkdir()
    script = tmp_path / "bin" / "scontrol"
    (tmp_path / "SCONTROL").write_text(SCONTROL)
    script.write_text(f'#!/bin/sh\necho "$*" >> {calls}\ncat {tmp_path / "SCONTROL"}\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin:/bin")
    return calls


def test_node_info_asks_scontrol_once_for_all_nodes_and_resolves_their_addresses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_scontrol(tmp_path, monkeypatch)
    info = node_info(["gpu2", "gpu1", "gpu2", "localhost"])
    assert calls.read_text().splitlines() == ["show node gpu2,gpu1,localhost -o"]
    assert info == {
        "gpu2": NodeInfo(ip="127.0.0.3", hostname="ci-host"),
        "gpu1": NodeInfo(ip="127.0.0.2", hostname="ci-host"),
        # no NodeAddr, no NodeHostName: the name is both (as Slurm defaults them)
        "localhost": NodeInfo(ip="127.0.0.1", hostname="localhost"),
    }
    assert host_slot(
        "gpu2", ["gpu1", "gpu2", "localhost"], {n: i.hostname for n, i in info.items()}
    ) == (1, 2)


def test_node_info_of_no_nodes_asks_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _fake_scontrol(tmp_path, monkeypatch)
    assert node_info([]) == {}
    assert not calls.exists()  # `scontrol show node "" -o` would list every node


def _cpuidle(root: Path, cpus: int, disable: dict[int, str]) -> None:
    """A fake cpuidle tree: states POLL, C1, C2 (AMD EPYC's) on ``cpus`` CPUs."""
    for cpu in range(cpus):
        for index, name in enumerate(["POLL", "C1", "C2"]):
            state = root / f"sys/devices/system/cpu/cpu{cpu}/cpuidle/state{index}"
            state.mkdir(parents=True)
            (state / "name").write_text(f"{name}\n")
            (state / "disable").write_text(f"{disable.get(index, '0')}\n")


def test_deep_idle_states_enabled_warn_naming_them(tmp_path: Path) -> None:
    _cpuidle(tmp_path, cpus=4, disable={})
    warning = cpu_idle_warning(tmp_path)
    assert warning is not None
    assert "C2 (state2) on 4 CPUs" in warning and "cpupower idle-set -d 2" in warning
    assert "C1" not in warning and "POLL" not in warning  # the shallow states may stay


def test_deep_idle_states_disabled_or_absent_do_not_warn(tmp_path: Path) -> None:
    assert cpu_idle_warning(tmp_path) is None  # no cpuidle (a VM, a container)
    _cpuidle(tmp_path, cpus=2, disable={2: "1"})
    assert cpu_idle_warning(tmp_path) is None


def test_one_cpu_with_a_deep_state_left_on_is_enough_to_warn(tmp_path: Path) -> None:
    _cpuidle(tmp_path, cpus=3, disable={2: "1"})
    (tmp_path / "sys/devices/system/cpu/cpu1/cpuidle/state2/disable").write_text("0\n")
    deeper = tmp_path / "sys/devices/system/cpu/cpu1/cpuidle/state10"
    deeper.mkdir()
    (deeper / "name").write_text("C6\n")
    (deeper / "disable").write_text("0\n")
    warning = cpu_idle_warning(tmp_path)
    assert warning is not None
    # by state index, not by text ("state10" after "state2")
    assert "C2 (state2) on 1 CPUs, C6 (state10) on 1 CPUs" in warning
    assert "cpupower idle-set -d 2; cpupower idle-set -d 10" in warning


def _iommu(root: Path, cmdline: str, units: int = 1) -> None:
    (root / "sys/class/iommu").mkdir(parents=True)
    for unit in range(units):
        (root / f"sys/class/iommu/ivhd{unit}").mkdir()
    (root / "proc").mkdir()
    (root / "proc/cmdline").write_text(f"{cmdline}\n")


def test_an_active_iommu_without_pass_through_warns(tmp_path: Path) -> None:
    _iommu(tmp_path, "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro amd_iommu=on")
    warning = iommu_warning(tmp_path)
    assert warning is not None and "iommu=pt" in warning


@pytest.mark.parametrize(
    ("units", "cmdline"),
    [
        (1, "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro iommu=pt pci=realloc=off"),
        (0, "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro"),  # no IOMMU active: nothing to pass through
    ],
)
def test_pass_through_or_no_active_iommu_does_not_warn(
    tmp_path: Path, units: int, cmdline: str
) -> None:
    _iommu(tmp_path, cmdline, units)
    assert iommu_warning(tmp_path) is None
    assert iommu_warning(tmp_path / "nothing") is None  # no /sys/class/iommu at all


def test_numa_balancing_on_warns_off_or_absent_does_not(tmp_path: Path) -> None:
    assert numa_balancing_warning(tmp_path) is None
    numa = tmp_path / "proc/sys/kernel/numa_balancing"
    numa.parent.mkdir(parents=True)
    numa.write_text("1\n")
    assert "numa_balancing=0" in str(numa_balancing_warning(tmp_path))
    numa.write_text("0\n")
    assert numa_balancing_warning(tmp_path) is None


def _untuned_host(root: Path) -> None:
    _cpuidle(root, cpus=2, disable={})
    _iommu(root, "ro quiet")
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/numa_balancing").write_text("1\n")


def test_the_cpu_idle_and_iommu_checks_apply_on_rocm_nodes_only(tmp_path: Path) -> None:
    _untuned_host(tmp_path)
    rocm = host_warnings("rocm", tmp_path)
    assert len(rocm) == 3
    assert [w for w in rocm if "C2" in w] and [w for w in rocm if "iommu=pt" in w]
    for accelerator in ("cpu", "cuda"):
        assert host_warnings(accelerator, tmp_path) == [w for w in rocm if "NUMA" in w]


def test_the_cli_takes_an_accelerator_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    canary.write_text("job 1\n")
    args = ["--out", str(tmp_path / "out"), "--canary", str(canary), "--gpus", "0"]
    with pytest.raises(SystemExit) as refused:
        main([*args, "--accelerator", "tpu"])
    assert refused.value.code == 2
    main([*args, "--accelerator", "rocm"])  # this host's own settings: any outcome
    (report,) = (tmp_path / "out").glob("*.json")
    assert json.loads(report.read_text())["facts"]["canary"] == "job 1"
