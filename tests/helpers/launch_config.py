"""The run config the launcher tests launch: the toy recipe on the tiny CPU model (built by the
job: model.tiny), one problem, 2 RL steps of 2 prompts, the HTTP sandbox, and a ``launch:``
section of one learner node, one rollout node and one sandbox node (``launch`` updates it)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.conftest import REPO


def launch_config(root: Path, **launch: object) -> Path:
    problems = root / "problems.jsonl"
    problems.write_text(json.dumps({"problem": "What is six times seven?", "answer": "42"}) + "\n")
    cfg = yaml.safe_load((REPO / "configs" / "toy" / "cpu.yaml").read_text())
    cfg.update(name="launched", runs_dir=str(root / "runs"))
    cfg["model"]["path"] = str(root / "tiny")  # built by the job (model.tiny)
    cfg["sft"] = {"data": []}
    cfg["data"].update(train_datasets=[str(problems)], eval_datasets=[str(problems)])
    cfg["data"]["rollout_batch_num_prompts"] = 2
    cfg["stages"] = [{"name": "s1", "num_steps": 2, "max_response_tokens": 64, "max_turns": 2}]
    cfg["eval"].update(num_samples=2, max_response_tokens=64)
    cfg["sandbox"] = {"mode": "http", "url": "http://set-by-the-job:1"}
    cfg["launch"] = {
        "learner": {"nodes": 1, "gpus_per_node": 1, "partition": "gpu"},
        "rollout": {"nodes": 1, "gpus_per_node": 1, "partition": "gpu"},
        "sandbox": {"nodes": 1, "partition": "cpu"},
        "start_timeout_s": 120,
        **launch,
    }
    path = root / "launch.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def sft_launch_config(root: Path, **launch: object) -> Path:
    """An SFT config (a tiny base model built here, the tool-call conversations of
    tests/helpers/tool_model.py, 3 epochs) whose ``launch:`` asks 2 learner nodes of one rank
    each (``launch`` updates it): what ``rstar2 launch torchrun`` runs."""
    from rstar2.tiny import build_tiny_model
    from tests.helpers.tool_model import SCRIPTS, _template_corpus, corpus

    build_tiny_model(root / "base", corpus() + _template_corpus(), hidden_size=64, num_layers=2)
    data = root / "conversations.jsonl"
    lines = []
    for s in SCRIPTS:
        tool = [{"role": "tool", "content": o.format(t="0.00")} for o in s.outputs]
        messages = [
            {"role": "user", "content": s.problem},
            {"role": "assistant", "content": s.turn1},
            *tool,
            {"role": "assistant", "content": s.turn2},
        ]
        lines.append(json.dumps({"messages": messages}))
    data.write_text("\n".join(lines) + "\n")
    config = {
        "name": "sft-torchrun",
        "runs_dir": str(root / "runs"),
        "model": {"path": str(root / "base"), "dtype": "float32"},
        "sft": {"data": [str(data)], "num_epochs": 3, "batch_num_sequences": 6, "lr": 5e-3,
                "warmup_steps": 0},
        "learner": {"micro_batch_tokens_per_gpu": 512},
        "cluster": {"accelerator": "cpu", "gpus_per_node": 0},
        "launch": {"learner": {"nodes": 2, "gpus_per_node": 1, "partition": "gpu"}, **launch},
    }  # fmt: skip
    path = root / "sft.yaml"
    path.write_text(yaml.safe_dump(config))
    return path
