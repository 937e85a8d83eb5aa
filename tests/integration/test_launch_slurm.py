"""`rstar2 launch slurm` against a real Slurm (tests/helpers/slurm_cluster.py: two "GPU" nodes
with fake gres devices and a CPU node on this machine, each its own loopback address).

A job of three roles (learner on one GPU node, rollout on the other, the HTTP sandbox on the
CPU node) brings up the sandbox and a Ray cluster of the three nodes with their role
resources, trains the tiny CPU model for 2 steps with the actors on their roles' nodes, and
exits 0 leaving no process and no Ray session folder; ``scancel`` during start-up does the
same; a node whose Ray never starts fails the job within the deadline, naming the node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.plan import port_block
from tests.conftest import REPO
from tests.helpers.launch_config import launch_config, sft_launch_config
from tests.helpers.processes import live_commands
from tests.helpers.slurm_cluster import SlurmCluster, skip_reason, slurm_cluster

# serial: the job's preflight refuses a node where other Ray/vLLM processes run, and the
# leftover check looks for any raylet or redis-server
pytestmark = [
    pytest.mark.full,  # minutes: a Slurm cluster (bash scripts/test.sh --full)
    pytest.mark.serial,
    pytest.mark.skipif(bool(skip_reason()), reason=skip_reason() or ""),
]

LEFTOVERS = ("raylet", "gcs_server", "launcher.ray_node", "launcher.sandbox_node", "redis-server")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as c:
        yield c


def _submit(
    cluster: SlurmCluster, config: Path, *overrides: str, kind: str = "slurm"
) -> tuple[str, Path]:
    proc = subprocess.run(
        [sys.executable, "-m", "rstar2.cli", "launch", kind, "--config", str(config),
         *overrides],
        env=cluster.env, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.split("submitted job ", 1)[1].split(";")[0].strip()
    attempt = Path(proc.stdout.split("job script: ", 1)[1].splitlines()[0]).parent
    return job, attempt


def _wait_gone(cluster: SlurmCluster, job: str, deadline_s: float) -> float:
    """Seconds until ``job`` left the queue; fails (with Slurm's view) past the deadline."""
    start = time.monotonic()
    while time.monotonic() - start < deadline_s:
        out = cluster.run(["squeue", "-h", "-j", job], check=False).stdout
        if not out.strip():
            return time.monotonic() - start
        time.sleep(1)
    pytest.fail(f"job {job} still queued after {deadline_s:.0f} s:\n{cluster.diagnostics()}")


def _leftovers(job: str) -> list[str]:
    sessions = [p.name for p in Path("/tmp").glob(f"rstar2-ray-{job}-*")]
    return live_commands(*LEFTOVERS) + sessions


def _settled(job: str, deadline_s: float = 30) -> list[str]:
    """What the job left behind once its processes had ``deadline_s`` to exit."""
    end = time.monotonic() + deadline_s
    while (left := _leftovers(job)) and time.monotonic() < end:
        time.sleep(0.5)
    return left


def test_a_launched_job_trains_with_every_role_on_its_nodes(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    job, attempt = _submit(cluster, launch_config(tmp_path), "logging.metrics_port=9")
    took = _wait_gone(cluster, job, 480)
    out = (attempt / "logs" / f"slurm-{job}.out").read_text()
    assert "rstar2 train exited with 0" in out, out[-3000:]
    logs = attempt / "logs" / "restart_0"
    reports = [json.loads(p.read_text()) for p in sorted((logs / "preflight").glob("*.json"))]
    assert [r["node"] for r in reports] == ["cpu1", "gpu1", "gpu2"]
    assert all(r["ok"] for r in reports) and all(r["facts"]["canary"] for r in reports)
    # the roles' nodes are the components Slurm gave: which GPU node is the learner's is
    # Slurm's choice, read from the job's own record of it
    driver = (logs / "driver.log").read_text()
    addrs = cluster.node_addrs
    learner_line = next(x for x in driver.splitlines() if x.startswith("learner:"))
    engines_line = next(x for x in driver.splitlines() if x.startswith("engines:"))
    learner_ip, engine_ip = learner_line.rsplit(" ", 1)[1], engines_line.rsplit(" ", 1)[1]
    assert {learner_ip, engine_ip} == {addrs["gpu1"], addrs["gpu2"]}, (learner_line, engines_line)
    # the driver served its metrics on the job's own port (not the config's 9, a root port)
    port = port_block(int(job))["metrics"]
    assert f"live metrics: http://{learner_ip}:{port}/metrics" in out
    assert any(x.endswith(f":{port}/metrics") for x in driver.splitlines() if "Prometheus" in x)
    assert "sandbox on cpu1" in out
    rows = [json.loads(x) for x in (tmp_path / "runs" / "launched" / "metrics.jsonl").open()]
    assert [r["step"] for r in rows if "step" in r][-1] == 2
    assert _settled(job) == []
    print(f"launched job: {took:.0f} s from submit to gone")


def test_scancel_during_start_up_leaves_nothing_behind(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    job, attempt = _submit(cluster, launch_config(tmp_path))
    log = attempt / "logs" / f"slurm-{job}.out"
    end = time.monotonic() + 120
    while "waiting for every node to join Ray" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < end, cluster.diagnostics()
        time.sleep(0.5)
    cluster.run(["scancel", job])
    _wait_gone(cluster, job, 120)
    assert _settled(job) == []


def test_a_node_lost_during_start_up_fails_the_job_at_once_naming_it(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    """The CPU node's Ray process is killed (SIGKILL, as a node loss would) while the job waits
    for every node to join: the job fails well within its start-up deadline, and the message
    names the node."""
    job, attempt = _submit(cluster, launch_config(tmp_path))
    log = attempt / "logs" / f"slurm-{job}.out"
    end = time.monotonic() + 120
    victim = None
    while victim is None:
        assert time.monotonic() < end, cluster.diagnostics()
        victim = next(iter(_pids_of("launcher.ray_node --role sandbox")), None)
        time.sleep(0.2)
    os.kill(victim, 9)
    took = _wait_gone(cluster, job, 100)  # the start-up deadline is 120 s
    out = log.read_text()
    assert "Ray on the sandbox nodes cpu1 ended" in out, out[-2000:]
    assert "rstar2 train" not in out.split("ended", 1)[1]
    assert _settled(job) == []
    print(f"node lost during start-up: job gone {took:.0f} s after the kill")


def _pids_of(pattern: str) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if pattern in cmd:
                out.append(int(entry.name))
    return out


def test_a_torchrun_job_trains_one_learner_over_two_nodes(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    """`rstar2 launch torchrun`: rstar2 sft under torchrun, one agent per learner node (two
    ranks over the two GPU nodes, c10d rendezvous on the first, gloo), rank 0 writing the run."""
    config = sft_launch_config(tmp_path)
    job, attempt = _submit(cluster, config, "learner.num_ranks=2", kind="torchrun")
    took = _wait_gone(cluster, job, 300)
    out = (attempt / "logs" / f"slurm-{job}.out").read_text()
    assert "rstar2 sft exited with 0" in out, out[-3000:]
    logs = attempt / "logs" / "restart_0"
    assert len(list(logs.glob("sft-*.log"))) == 2  # one torchrun agent per node
    run = tmp_path / "runs" / "sft-torchrun-sft"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").open()]
    assert len(rows) == 3 and rows[-1]["nll"] < rows[0]["nll"]
    assert (run / "model" / "model.safetensors").is_file()
    summary = "".join(p.read_text() for p in logs.glob("sft-*.log"))
    assert summary.count("on 2 ranks") == 1, summary[-2000:]
    assert _settled(job) == []
    print(f"torchrun job: {took:.0f} s from submit to gone")
