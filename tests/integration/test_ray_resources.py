"""rstar2.trainer.ray_resources: a run whose Ray actors cannot be placed fails at once, naming
what it asks and what the cluster has (Ray alone would leave the actors pending forever)."""

from __future__ import annotations

import os

import pytest

from rstar2.config import ConfigError
from rstar2.config_io import load_config
from rstar2.trainer.ray_resources import ActorDemand, actor_demands, check_fits
from tests.conftest import REPO, run_cli

TOY = REPO / "configs" / "toy" / "cpu.yaml"
PAPER = REPO / "configs" / "rstar2_14b_mi300x.yaml"


def test_cpu_run_asks_a_cpu_per_engine_and_for_the_sandbox() -> None:
    cfg = load_config(TOY, ["cluster.ray=true", "rollout.num_engines=2", "sandbox.mode=embedded"])
    demands = {d.name: d for d in actor_demands(cfg)}
    assert demands["rollout engine"] == ActorDemand("rollout engine", 2, 1, 0)
    assert demands["sandbox pool"].count == 1 and demands["learner rank"].cpus == 0
    check_fits(list(demands.values()), [{"CPU": 3.0}])
    with pytest.raises(ConfigError, match=r"need 3 CPUs and 0 GPUs.*has 2 CPUs and 0 GPUs"):
        check_fits(list(demands.values()), [{"CPU": 2.0}])
    http = load_config(
        TOY,
        [
            "cluster.ray=true",
            "rollout.num_engines=2",
            "sandbox.mode=http",
            "sandbox.url=http://h:1",
        ],
    )
    check_fits(actor_demands(http), [{"CPU": 2.0}])  # the HTTP sandbox runs outside Ray


def test_gpu_run_counts_tensor_parallel_gpus_and_one_per_node() -> None:
    cfg = load_config(
        PAPER,
        ["cluster.colocate=false", "learner.backend=torch", "learner.num_ranks=1",
         "rollout.num_engines=3", "rollout.tensor_parallel_size=2"],
    )  # fmt: skip
    node = {"CPU": 64.0, "GPU": 4.0}
    check_fits(actor_demands(cfg), [node, node])  # 3 x 2 GPUs + the learner's 1 of 8
    with pytest.raises(ConfigError, match=r"7 GPUs.*has 32 CPUs and 4 GPUs"):
        check_fits(actor_demands(cfg), [{"CPU": 32.0, "GPU": 4.0}])
    wide = load_config(
        PAPER,
        ["cluster.colocate=false", "learner.backend=torch", "learner.num_ranks=1",
         "rollout.num_engines=1", "rollout.tensor_parallel_size=8"],
    )  # fmt: skip
    with pytest.raises(ConfigError, match="one rollout engine needs 1 CPU and 8 GPU on one node"):
        check_fits(actor_demands(wide), [node, node, node])  # 12 GPUs, but 4 a node


def test_the_colocated_recipe_asks_one_gpu_per_learner_rank_and_none_for_engines() -> None:
    # 16 engines x TP 4 on the 64 learner ranks' GPUs
    cfg = load_config(PAPER, ["cluster.ray=true", "cluster.colocate=true", "learner.num_ranks=64"])
    node = {"CPU": 128.0, "GPU": 8.0}
    check_fits(actor_demands(cfg), [node] * 8)
    with pytest.raises(ConfigError, match=r"64 GPUs.*has 896 CPUs and 56 GPUs"):
        check_fits(actor_demands(cfg), [node] * 7)


def test_train_exits_2_with_one_line_when_ray_cannot_place_the_engines(tmp_path) -> None:
    engines = (os.cpu_count() or 1) + 1  # one CPU each: more than this machine's Ray has
    proc = run_cli(
        "train",
        "--config",
        str(TOY),
        "--run-dir",
        str(tmp_path / "run"),
        "cluster.ray=true",
        f"rollout.num_engines={engines}",
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    ours = [line for line in proc.stderr.splitlines() if line.startswith("rstar2:")]
    assert len(ours) == 1, proc.stderr  # Ray logs its own start-up lines besides
    assert "cluster.ray" in ours[0] and f"{engines} rollout engines" in ours[0]
    assert "the Ray cluster has" in ours[0]
