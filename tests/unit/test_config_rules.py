"""Every cross-field rule of a config (rstar2.config_rules) refuses the same configs with the
same one line from every command that loads one, before any folder is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from rstar2.cli import EXIT_USER_ERROR, main
from rstar2.config import Config, ConfigError
from rstar2.config_io import load_config
from rstar2.config_rules import check_launch

RAY = "cluster.ray=true"
COLOCATED = [RAY, "cluster.colocate=true"]

# the key each refusal names -> overrides of the defaults (CUDA, 1 node of 8 GPUs) that break it
REFUSALS: dict[str, tuple[str, list[str]]] = {
    "one node without Ray": ("cluster.num_nodes", ["cluster.num_nodes=2"]),
    "engines past the node's GPUs": (
        "cluster.gpus_per_node",
        ["cluster.gpus_per_node=2", "rollout.num_engines=3"],
    ),
    "Ray: ranks and engines past the cluster's GPUs": (
        "cluster.num_nodes",
        [RAY, "cluster.gpus_per_node=2", "learner.num_ranks=2"],
    ),
    "Ray: an engine wider than a node": (
        "rollout.tensor_parallel_size",
        [RAY, "cluster.gpus_per_node=2", "rollout.tensor_parallel_size=4"],
    ),
    "KL term": ("algorithm.kl_coef", ["algorithm.kl_coef=0.1"]),
    "audit of an offloaded learner": (
        "learner.weight_sync_audit",
        [*COLOCATED, "learner.offload_while_generating=true", "learner.weight_sync_audit=true"],
    ),
    "ahead with recomputed log-probs": (
        "rollout.max_staleness_steps",
        ["rollout.max_staleness_steps=1"],
    ),
    "offload without colocation": (
        "learner.offload_while_generating",
        ["learner.offload_while_generating=true"],
    ),
    "colocated on CPU": (
        "cluster.colocate",
        ["cluster.accelerator=cpu", "cluster.gpus_per_node=0", *COLOCATED],
    ),
    "colocated without Ray": ("cluster.colocate", ["cluster.colocate=true"]),
    "colocated engines not one to one": ("cluster.colocate", [*COLOCATED, "learner.num_ranks=2"]),
    "colocated and ahead": (
        "rollout.max_staleness_steps",
        [*COLOCATED, "rollout.max_staleness_steps=1", "algorithm.recompute_old_logprobs=false"],
    ),
    "megatron ranks not a multiple of TP x PP": (
        "learner.num_ranks",
        ["learner.backend=megatron", "learner.tensor_parallel_size=2"],
    ),
    "no learner node": ("launch.learner.nodes", ["launch.learner.nodes=0"]),
    "GPUs on a sandbox node": ("launch.sandbox.gpus_per_node", ["launch.sandbox.gpus_per_node=1"]),
    "sandbox nodes for the embedded sandbox": ("launch.sandbox.nodes", ["launch.sandbox.nodes=1"]),
    "sandbox nodes for a Redis sandbox": (
        "sandbox.mode",
        ["sandbox.mode=redis", "sandbox.redis_url=redis://db:6379", "launch.sandbox.nodes=1"],
    ),
    "a container without an image": ("launch.image", ["launch.container=pyxis"]),
    "more GPUs per learner node than a node has": (
        "launch.learner.gpus_per_node",
        ["launch.learner.gpus_per_node=16"],
    ),
    "a GPU role without GPUs": (
        "launch.rollout.gpus_per_node",
        ["launch.rollout.nodes=1", "launch.rollout.gpus_per_node=0"],
    ),
    "Ray job: engines past the rollout nodes": (
        "launch.rollout.nodes",
        [
            RAY,
            "cluster.num_nodes=3",
            "rollout.num_engines=4",
            "rollout.tensor_parallel_size=4",
            "launch.rollout.nodes=1",
        ],
    ),
    "Ray job: ranks and engines past the learner nodes": (
        "launch.learner.nodes",
        [RAY, "cluster.num_nodes=2", "learner.num_ranks=8", "launch.learner.gpus_per_node=4"],
    ),
    "Ray job: colocated with rollout nodes": (
        "launch.rollout.nodes",
        [*COLOCATED, "launch.rollout.nodes=1"],
    ),
    "Ray job: an engine wider than a rollout node": (
        "rollout.tensor_parallel_size",
        [
            RAY,
            "rollout.tensor_parallel_size=4",
            "launch.rollout.nodes=2",
            "launch.rollout.gpus_per_node=2",
        ],
    ),
    "Ray job: engines split across rollout nodes": (
        "launch.rollout.nodes",
        [
            RAY,
            "cluster.num_nodes=2",
            "rollout.num_engines=3",
            "rollout.tensor_parallel_size=3",
            "launch.rollout.nodes=2",
            "launch.rollout.gpus_per_node=5",
        ],
    ),
}


def _refusal(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one stderr line of ``rstar2 ARGV``, which must exit 2 and print nothing else."""
    assert main(argv) == EXIT_USER_ERROR, argv
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, (out, err)
    return err.strip()


@pytest.mark.parametrize("name", REFUSALS)
def test_every_command_refuses_a_broken_config_with_the_same_line(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key, overrides = REFUSALS[name]
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert err.value.key == key
    runs = f"runs_dir={tmp_path / 'runs'}"
    lines = {
        "config": _refusal(capsys, ["config", *overrides]),
        "train": _refusal(capsys, ["train", "--run-dir", str(tmp_path / "t"), *overrides]),
        "sft": _refusal(capsys, ["sft", "--run-dir", str(tmp_path / "s"), *overrides]),
        "launch slurm": _refusal(capsys, ["launch", "slurm", "--dry-run", runs, *overrides]),
    }
    assert set(lines.values()) == {f"rstar2: config error: {err.value}"}, lines
    assert list(tmp_path.iterdir()) == []  # nothing written by any of them


def test_the_default_launch_section_is_checked_only_by_a_launch() -> None:
    """A config without a launch section (the defaults: one node of 8 GPUs) runs locally on
    fewer GPUs; ``rstar2 launch`` still places it on the section's nodes."""
    overrides = ["cluster.gpus_per_node=1"]
    cfg = load_config(None, overrides)  # one process: the learner shares the engine's GPU
    with pytest.raises(ConfigError) as err:
        check_launch(cfg, ray_job=True)
    assert err.value.key == "launch.learner.gpus_per_node"


def test_the_recipe_as_written_passes_and_fills_its_64_gpus() -> None:
    cfg = load_config("configs/rstar2_14b_mi300x.yaml")
    check_launch(cfg, ray_job=True)
    one_more = cfg.model_copy(update={"learner": cfg.learner.model_copy(update={"num_ranks": 65})})
    with pytest.raises(ConfigError):
        check_launch(Config.model_validate(one_more.model_dump()), ray_job=True)


def test_the_gpu_count_message_counts_in_words() -> None:
    one_each = [RAY, "cluster.gpus_per_node=1", "learner.num_ranks=1", "rollout.num_engines=1"]
    with pytest.raises(ConfigError) as err:
        load_config(None, one_each)
    assert err.value.key == "cluster.num_nodes"
    assert "1 learner rank and 1 engine GPU need 2 GPUs;" in str(err.value)
