"""The run config the trainer's tests train the tool model with (tests/helpers/tool_model.py):
one builder, so the tests that compare runs train the same thing. ``tool_train_config`` gives
the common part as a dict; each test updates the sections it is about."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# problems the tool model solves (six times seven), solves in part, cannot solve (the tool
# breaks) and never solves (a wrong reference answer: it stays hard for a hard subset)
PROBLEMS = [
    {"problem": "What is six times seven?", "answer": "42"},
    {"problem": "Add two and three, and five and five.", "answer": "5, 10"},
    {"problem": "Break the tool.", "answer": "0"},
    {"problem": "What is six times seven?", "answer": "43"},
]


def write_problems(path: Path, problems: list[dict[str, str]] | None = None) -> Path:
    """``problems`` (default :data:`PROBLEMS`) as a JSONL dataset at ``path``."""
    rows = PROBLEMS if problems is None else problems
    path.write_text("".join(json.dumps(p) + "\n" for p in rows))
    return path


def tool_train_config(model_dir: Path, problems: Path, /, **sections: Any) -> dict[str, Any]:
    """A CPU run of the tool model on the ``problems`` file: 2 prompts x 4 samples at
    temperature 1.2, RoC down to 2 per prompt, one 2-step stage of 3-turn, 300-token answers,
    no evaluation or checkpoints. Each keyword replaces that section's keys it names
    (``stages`` whole)."""
    cfg: dict[str, Any] = {
        "seed": 3,
        "model": {"path": str(model_dir), "dtype": "float32"},
        "data": {
            "train_datasets": [str(problems)],
            "eval_datasets": [str(problems)],
            "rollout_batch_num_prompts": 2,
            "max_prompt_tokens": 1024,
            "decontaminate": False,
        },
        "rollout": {"num_samples_per_prompt": 4, "temperature": 1.2, "enforce_eager": True},
        "sandbox": {"num_workers": 2},
        # a loaded machine reads 0.01 s where an idle one read 0.00 s: the model must not see it
        "agent": {"tool_response_execution_time": False},
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
    for name, value in sections.items():
        if isinstance(value, dict) and isinstance(cfg.get(name), dict):
            cfg[name] = {**cfg[name], **value}
        else:
            cfg[name] = value
    return cfg
