"""What a run trains on: `data.decontaminate` applies in `rstar2 train` (counted in the run
folder), evaluation sets are never filtered, over-long prompts are dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rstar2.config import Config
from rstar2.data.schema import DataError
from rstar2.data.sources import builtin_records
from rstar2.trainer.problems import DECONTAMINATION, load_eval_problems, load_train_problems
from tests.helpers.tool_model import build_tool_tokenizer
from tests.helpers.vllm_setup import tool_template


@pytest.fixture(scope="module")
def tool_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Only the tool model's tokenizer and template are read here: its untrained folder (the
    trained one takes the unit tier's longest setup)."""
    return build_tool_tokenizer(tmp_path_factory.mktemp("tool-tokenizer"))


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


def test_train_drops_benchmark_problems_and_says_how_many(tool_tokenizer_dir, train_file, tmp_path):
    template = tool_template(tool_tokenizer_dir)
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


def test_without_decontamination_every_problem_stays(tool_tokenizer_dir, train_file, tmp_path):
    template = tool_template(tool_tokenizer_dir)
    problems = load_train_problems(_config(train_file, decontaminate=False), template, tmp_path)
    assert len(problems.rows) == 3
    assert json.loads((tmp_path / DECONTAMINATION).read_text())["enabled"] is False


@pytest.fixture
def messy_file(tmp_path: Path) -> Path:
    lines = [
        json.dumps({"id": "a", "problem": "What is six times seven?", "answer": "42"}),
        "{not json",
        json.dumps({"id": "b", "problem": ["a", "list"], "answer": "1"}),
        json.dumps({"id": "c", "problem": "No answer here."}),
        json.dumps({"id": "a", "problem": "A repeated id.", "answer": "3"}),
        json.dumps({"id": "d", "problem": "word " * 3000, "answer": "7"}),  # over the limit
        json.dumps({"id": "e", "problem": "Add two and three.", "answer": 5}),
    ]
    path = tmp_path / "messy.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _messy_config(path: Path, strict: bool) -> Config:
    return Config.model_validate(
        {
            "data": {
                "train_datasets": [str(path)],
                "eval_datasets": [str(path)],
                "max_prompt_tokens": 1024,
                "decontaminate": False,
                "strict": strict,
            }
        }
    )


def test_bad_rows_are_skipped_counted_and_named_in_one_line(
    tool_tokenizer_dir, messy_file, tmp_path
):
    template = tool_template(tool_tokenizer_dir)
    problems = load_train_problems(_messy_config(messy_file, False), template, tmp_path)
    assert problems.truths == ["42", "5"]
    assert problems.skip_counts() == {"malformed": 3, "duplicate_id": 1, "too_long": 1}
    line = problems.skip_warning("data.train_datasets")
    assert line is not None and "\n" not in line
    assert line.startswith("data.train_datasets: skipped 5 row(s)")
    assert f"{messy_file}: line 2: not valid JSON" in line and line.count("line 2") == 1
    assert "'problem' is list, not a string" in line and "and 2 more" in line
    evals = load_eval_problems(_messy_config(messy_file, False), template)
    assert evals[str(messy_file)].skip_counts() == problems.skip_counts()


def test_strict_data_stops_on_the_first_bad_row_in_one_line(
    tool_tokenizer_dir, messy_file, tmp_path
):
    template = tool_template(tool_tokenizer_dir)
    with pytest.raises(DataError, match="line 2: not valid JSON") as err:
        load_train_problems(_messy_config(messy_file, True), template, tmp_path)
    assert "data.strict is on" in str(err.value) and "\n" not in str(err.value)
    long_only = tmp_path / "long.jsonl"
    long_only.write_text(
        json.dumps({"problem": "Add two and three.", "answer": "5"})
        + "\n"
        + json.dumps({"problem": "word " * 3000, "answer": "7"})
        + "\n"
    )
    with pytest.raises(DataError, match=r"problem 2: prompt of \d+ tokens is over"):
        load_train_problems(_messy_config(long_only, True), template, tmp_path)
