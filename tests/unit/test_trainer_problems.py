"""What a run trains on: `data.decontaminate` applies in `rstar2 train` (counted in the run
folder), evaluation sets are never filtered, over-long prompts are dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rstar2.config import Config
from rstar2.data.sources import builtin_records
from rstar2.trainer.problems import DECONTAMINATION, load_eval_problems, load_train_problems
from tests.helpers.vllm_setup import tool_template


def _config(train: Path, *, decontaminate: bool) -> Config:
    return Config.model_validate(
        {
            "data": {
                "train_datasets": [str(train)],
                "eval_datasets": [str(train)],
                "max_prompt_tokens": 1024,
                "decontaminate": decontaminate,
            }
        }
    )


@pytest.fixture
def train_file(tmp_path: Path) -> Path:
    aime = next(builtin_records("aime24"))
    rows = [
        {"problem": "What is six times seven?", "answer": "42"},
        {"problem": aime["problem"], "answer": aime["answer"]},  # a benchmark problem verbatim
        {"problem": "Add two and three.", "answer": "5"},
    ]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_train_drops_benchmark_problems_and_says_how_many(tool_model_dir, train_file, tmp_path):
    template = tool_template(tool_model_dir)
    problems = load_train_problems(_config(train_file, decontaminate=True), template, tmp_path)
    assert problems.truths == ["42", "5"]
    report = json.loads((tmp_path / DECONTAMINATION).read_text())
    assert report["dropped"] == 1 and report["sources"][str(train_file)] == {
        "rows": 3,
        "dropped": 1,
    }
    # evaluation sets are what they are
    evals = load_eval_problems(_config(train_file, decontaminate=True), template)
    assert len(evals[str(train_file)].rows) == 3


def test_without_decontamination_every_problem_stays(tool_model_dir, train_file, tmp_path):
    template = tool_template(tool_model_dir)
    problems = load_train_problems(_config(train_file, decontaminate=False), template, tmp_path)
    assert len(problems.rows) == 3
    assert json.loads((tmp_path / DECONTAMINATION).read_text())["enabled"] is False
