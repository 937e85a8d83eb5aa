"""rstar2 launch slurm without a Slurm: the plan's checks, the rendered job script against
golden files (bash parses it, its port arithmetic equals the plan's), and the step helpers'
pure parts. The job itself runs on a real Slurm in tests/integration/test_launch_slurm.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.nodes import ray_gpu_env
from launcher.plan import (
    MAX_NODES_PER_HOST,
    PORT_STRIDE,
    node_ray_ports,
    plan_job,
    plan_torchrun_job,
    port_block,
)
from launcher.render import JobPaths, render_env, render_sbatch
from launcher.wait_for import missing_nodes
from rstar2.config import Config, ConfigError
from rstar2.config_io import load_config
from tests.conftest import REPO, run_cli

PAPER = REPO / "configs" / "rstar2_14b_mi300x.yaml"
GOLDEN = REPO / "tests" / "golden" / "launch"
PATHS = JobPaths(
    run_dir="/shared/runs/rstar2",
    attempt_dir="/shared/runs/rstar2/attempt_1",
    log_dir="/shared/runs/rstar2/attempt_1/logs",
    workdir="/opt/rstar2",
    python="/opt/rstar2/.venv/bin/python",
)
CASES = {
    # the paper's cluster: 8 nodes x 8 MI300X (colocated), 2 CPU sandbox nodes in another
    # partition: a hetjob of two components
    "paper-8x8-mi300x-sandbox-hetjob": (
        PAPER,
        [
            "cluster.colocate=true",
            "learner.num_ranks=64",
            "launch.learner.nodes=8",
            "launch.learner.partition=mi300x",
            "launch.learner.account=rl",
            "launch.learner.time=2-00:00:00",
            "launch.sandbox.nodes=2",
            "launch.sandbox.partition=cpu",
            "logging.metrics_port=9400",  # served on the job's own port, not this one
        ],
    ),
    "one-node": (
        PAPER,
        [
            "cluster.num_nodes=1",
            "cluster.colocate=false",
            "learner.num_ranks=4",
            "rollout.num_engines=1",
            "launch.learner.nodes=1",
            "launch.sandbox.nodes=0",
            "sandbox.mode=embedded",
        ],
    ),
}


# a learner-only job (rstar2 sft under torchrun): 2 nodes x 8 MI300X
TORCHRUN_CASES = {
    "torchrun-2x8-mi300x": (
        PAPER,
        [
            "learner.num_ranks=16",
            "rollout.num_engines=4",  # the config stays one a colocated RL run could take
            "cluster.num_nodes=2",
            "launch.learner.nodes=2",
            "launch.learner.partition=mi300x",
        ],
    ),
}
# every step in launch.image, one case per container mode
_IMAGES = {
    "pyxis": "/images/rstar2.sqsh",
    "apptainer": "/images/rstar2.sif",
    "docker": "rstar2:rocm",
}
for _mode, _image in _IMAGES.items():
    CASES[f"one-node-{_mode}"] = (
        PAPER,
        [*CASES["one-node"][1], f"launch.container={_mode}", f"launch.image={_image}",
         "launch.container_mounts=[/models:/models]"],
    )  # fmt: skip
# NVIDIA nodes in docker, with CPU sandbox nodes: GPU devices on the GPU steps only
CASES["hetjob-cuda-docker"] = (
    PAPER,
    [*CASES["paper-8x8-mi300x-sandbox-hetjob"][1], "cluster.accelerator=cuda",
     "launch.container=docker", "launch.image=rstar2:cuda"],
)  # fmt: skip
TORCHRUN_CASES["torchrun-2x8-mi300x-pyxis"] = (
    PAPER,
    [*TORCHRUN_CASES["torchrun-2x8-mi300x"][1], "launch.container=pyxis",
     "launch.image=/images/rstar2.sqsh"],
)  # fmt: skip


def _render(name: str) -> str:
    if name in TORCHRUN_CASES:
        path, overrides = TORCHRUN_CASES[name]
        plan = plan_torchrun_job(load_config(path, overrides))
        return render_sbatch(plan, PATHS, "torchrun.sbatch.j2")
    path, overrides = CASES[name]
    cfg = load_config(path, overrides)
    return render_sbatch(plan_job(cfg), PATHS)


@pytest.mark.parametrize("name", [*CASES, *TORCHRUN_CASES])
def test_the_job_script_equals_its_golden_file_and_bash_parses_it(name: str) -> None:
    text = _render(name)
    assert text == _render(name)  # deterministic
    golden = GOLDEN / f"{name}.sbatch"
    if os.environ.get("RSTAR2_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), f"re-render with RSTAR2_UPDATE_GOLDEN=1 and review {golden}"
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_the_hetjob_has_one_component_per_role_in_role_order() -> None:
    text = _render("paper-8x8-mi300x-sandbox-hetjob")
    header = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    split = header.index("#SBATCH hetjob")
    learner, sandbox = header[:split], header[split + 1 :]
    assert "#SBATCH --nodes=8" in learner and "#SBATCH --gpus-per-node=8" in learner
    assert "#SBATCH --partition=mi300x" in learner and "#SBATCH --time=2-00:00:00" in learner
    assert "#SBATCH --requeue" in learner
    assert "#SBATCH --nodes=2" in sandbox and "#SBATCH --partition=cpu" in sandbox
    assert not any("gpus" in line for line in sandbox)
    assert "LEARNER_NODES=$(group_nodes 0" in text and "SANDBOX_NODES=$(group_nodes 1" in text
    assert "scontrol show hostnames" in text and "sort" not in text  # roles never by position


def test_the_scripts_port_arithmetic_is_the_plans() -> None:
    text = _render("paper-8x8-mi300x-sandbox-hetjob")
    lines = [line for line in text.splitlines() if line.startswith("PORT_")]
    script = "\n".join(lines) + (
        '\necho "$PORT_BASE $PORT_RAY_GCS $PORT_REDIS $PORT_SANDBOX_HTTP $PORT_METRICS"'
    )
    for job_id in (1, 4242, 987654):
        out = subprocess.run(
            ["bash", "-c", script], env={"SLURM_JOB_ID": str(job_id)}, capture_output=True,
            text=True, check=True,
        ).stdout.split()  # fmt: skip
        ports = port_block(job_id)
        want = [ports[k] for k in ("base", "ray_gcs", "redis", "sandbox_http", "metrics")]
        assert [int(x) for x in out] == want
        # every node's ports, for one node per host (a real cluster) and for as many fake nodes
        # as one host may hold, stay in the block, below Linux's ephemeral range, and apart
        for slots in (1, 3, MAX_NODES_PER_HOST):
            taken = set(want)
            for slot in range(slots):
                options = dict(o.split("=") for o in node_ray_ports(ports["base"], slot, slots))
                low, high = (
                    int(options.pop("--min-worker-port")),
                    int(options.pop("--max-worker-port")),
                )
                mine = {int(v) for v in options.values()} | set(range(low, high + 1))
                assert all(ports["base"] <= x < ports["base"] + PORT_STRIDE < 32768 for x in mine)
                assert not mine & taken
                taken |= mine
            if slots == 1:
                assert high - low + 1 >= 300  # a many-core node prestarts a worker per core
    with pytest.raises(ValueError, match="at most 9 nodes"):
        node_ray_ports(20000, MAX_NODES_PER_HOST, MAX_NODES_PER_HOST + 1)


def test_the_driver_serves_metrics_on_the_jobs_own_port_when_the_config_asks() -> None:
    hetjob = _render("paper-8x8-mi300x-sandbox-hetjob")  # logging.metrics_port=9400
    assert '"logging.metrics_port=$PORT_METRICS"' in hetjob and "9400" not in hetjob
    assert 'step "live metrics: http://$HEAD_IP:$PORT_METRICS/metrics"' in hetjob
    assert "metrics_port" not in _render("one-node")  # not asked: not served


def test_the_mi300x_profile_gives_every_setting_a_reason_and_a_source() -> None:
    cfg = load_config(PAPER, CASES["paper-8x8-mi300x-sandbox-hetjob"][1])
    env = render_env(plan_job(cfg))
    lines = env.splitlines()
    exports = [i for i, line in enumerate(lines) if line.startswith("export ")]
    assert exports
    for i in exports:
        assert "source:" in lines[i - 1], lines[i]
    subprocess.run(["bash", "-n"], input=env, text=True, check=True)


@pytest.mark.parametrize(
    ("overrides", "key", "says"),
    [
        (["launch.learner.nodes=0"], "launch.learner.nodes", "at least one node"),
        (["launch.learner.gpus_per_node=16"], "launch.learner.gpus_per_node", "a node has 8"),
        (["launch.sandbox.partition=cpu nodes"], "launch.sandbox.partition", "not a Slurm name"),
        (["launch.learner.time=tomorrow"], "launch.learner.time", "not a Slurm time"),
        (["launch.sandbox.nodes=1", "sandbox.mode=embedded"], "launch.sandbox.nodes", "embedded"),
        (["launch.container=pyxis"], "launch.image", "needs an image"),
        (
            ["launch.sandbox.nodes=1", "sandbox.mode=redis", "sandbox.redis_url=redis://x:1/0"],
            "sandbox.mode",
            "use sandbox.mode http",
        ),
        (
            ["cluster.colocate=true", "cluster.ray=true", "learner.num_ranks=2"],
            "cluster.colocate",
            "must equal learner.num_ranks",
        ),
        (
            ["learner.num_ranks=8"],
            "launch.learner.nodes",
            "8 learner ranks and 4 engine GPUs need 12 GPUs; 1 x 8 given",
        ),
    ],
)
def test_a_bad_launch_is_one_error_naming_the_key(
    overrides: list[str], key: str, says: str
) -> None:
    with pytest.raises(ConfigError) as err:
        split = ["cluster.colocate=false", "launch.learner.nodes=1"]  # 4 ranks + 1 engine of TP 4
        plan_job(
            load_config(PAPER, ["learner.num_ranks=4", "rollout.num_engines=1", *split, *overrides])
        )
    assert err.value.key == key and says in str(err.value)


def test_the_cli_refuses_a_bad_launch_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    got = run_cli(
        "launch", "slurm", "--config", str(PAPER), "--dry-run", f"runs_dir={tmp_path}",
        "launch.learner.nodes=0",
    )  # fmt: skip
    assert got.returncode == 2
    assert got.stderr.strip().splitlines() == [
        "rstar2: config error: launch.learner.nodes: at least one node runs the learner (0 given)"
    ]
    assert list(tmp_path.iterdir()) == []


def test_the_dry_run_writes_an_attempt_and_prints_the_sbatch_command(tmp_path: Path) -> None:
    args = ["launch", "slurm", "--config", str(PAPER), "--dry-run", f"runs_dir={tmp_path}"]
    args += CASES["one-node"][1]
    first, second = run_cli(*args), run_cli(*args)
    assert first.returncode == second.returncode == 0, first.stderr
    attempt = tmp_path / "rstar2-14b" / "attempt_2"
    assert f"sbatch --parsable {attempt / 'job.sbatch'}" in second.stdout
    assert sorted(p.name for p in attempt.iterdir()) == [
        "canary", "config.json", "env.sh", "job.sbatch", "logs",
    ]  # fmt: skip
    job = Config.model_validate_json((attempt / "config.json").read_text())
    assert job.cluster.ray and job.cluster.num_nodes == 1  # the driver runs in the job's Ray


def test_a_launch_without_sbatch_is_one_line_and_exit_2(tmp_path: Path) -> None:
    python_only = tmp_path / "bin"  # a PATH with python and no sbatch
    python_only.mkdir()
    (python_only / "python").symlink_to(sys.executable)
    args = ["launch", "slurm", "--config", str(PAPER), f"runs_dir={tmp_path}"]
    proc = run_cli(*args, *CASES["one-node"][1], env={"PATH": str(python_only)})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "rstar2: launch error: sbatch not found: run this on a Slurm login node (or use --dry-run)"
    )


def test_ray_sees_hip_devices_only_on_rocm_and_no_gpu_on_cpu_nodes() -> None:
    slurm = {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "ROCR_VISIBLE_DEVICES": "0,1",
        "GPU_DEVICE_ORDINAL": "0,1",
    }
    rocm = ray_gpu_env(slurm, "rocm", 2)
    assert rocm["HIP_VISIBLE_DEVICES"] == "0,1"
    assert "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES" not in rocm  # Ray narrows it per actor
    assert not {"CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL"} & set(rocm)
    assert ray_gpu_env(slurm, "cuda", 2)["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert "CUDA_VISIBLE_DEVICES" not in ray_gpu_env(slurm, "cuda", 0)  # a hetjob's leak


def test_missing_nodes_names_each_node_not_yet_in_ray_with_its_role() -> None:
    ips = {"gpu1": "127.0.0.1", "gpu2": "127.0.0.2", "cpu1": "127.0.0.3"}
    alive: list[dict[str, object]] = [
        {"NodeManagerAddress": "127.0.0.1", "Resources": {"learner": 4.0, "GPU": 4.0}},
        {"NodeManagerAddress": "127.0.0.3", "Resources": {"CPU": 2.0}},  # without its role
    ]
    expected = {"learner": ["gpu1", "gpu2"], "sandbox": ["cpu1"]}
    assert missing_nodes(expected, ips, alive) == ["learner:gpu2", "sandbox:cpu1"]


def test_docker_steps_get_gpus_on_gpu_nodes_only() -> None:
    lines = [x for x in _render("hetjob-cuda-docker").splitlines() if "docker run" in x]
    gpu = {"launcher.ray_node --role learner", "rstar2.cli"}
    cpu = {"launcher.preflight", "launcher.sandbox_node", "launcher.ray_node --role sandbox",
           "launcher.wait_for"}  # fmt: skip
    seen = set()
    for line in lines:
        step = next(s for s in gpu | cpu if s in line)
        seen.add(step)
        assert ("--gpus=all" in line) == (step in gpu), line
        assert '--user="$(id -u):$(id -g)"' in line and "$(docker_env)" in line
    assert seen == gpu | cpu


def test_launch_locals_port_lock_never_follows_a_link_and_holds_its_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    from launcher import local
    from launcher.local import _free_port_block
    from launcher.plan import PORT_BLOCKS, port_block
    from launcher.slurm import LaunchError

    monkeypatch.setattr(local, "taken_ports", lambda host, base, count: [])  # locks only

    victim = tmp_path / "victim"
    victim.write_text("keep me")
    locks = tmp_path / "locks"
    locks.mkdir()
    for block in range(PORT_BLOCKS):
        (locks / f"rstar2-port-block-{block}.lock").symlink_to(victim)
    with pytest.raises(LaunchError, match=r"port blocks of launcher\.plan is taken"):
        _free_port_block(locks)  # every lock path is a link: none is this launch's
    assert victim.read_text() == "keep me"

    (locks / "rstar2-port-block-7.lock").unlink()
    ports, lock = _free_port_block(locks)
    try:
        assert ports == port_block(7)  # the one block whose lock is a plain file
        with open(locks / "rstar2-port-block-7.lock") as other, pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another launch skips it
    finally:
        lock.close()
