"""rstar2 eval: the pass@k estimator, the report, and the command on the tiny tool model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from rstar2.eval import ProblemResult, k_values, pass_at_k, render_markdown, summarize
from tests.conftest import run_cli
from tests.helpers.tool_model import check_script_report, write_eval_dataset


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(16, 3, 16) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)
    assert k_values(16) == [1, 2, 4, 8, 16] and k_values(6) == [1, 2, 4, 6]


def test_summary_and_markdown() -> None:
    results = [
        ProblemResult(0, "What is 1+1?", "2", 3, 4, 100.0, 1.0, {"stop": 4}),
        ProblemResult(1, "A | B?", "x|y", 0, 4, 300.0, 2.0, {"length": 4}),
    ]
    report = summarize("toy", results, {"tool_error_ratio": 0.25})
    s = report["summary"]
    assert s["avg@4"] == pytest.approx(0.375) and s["pass@k"]["1"] == pytest.approx(0.375)
    assert s["pass@k"]["4"] == pytest.approx(0.5)
    assert s["mean_response_tokens"] == 200.0 and s["mean_tool_calls"] == 1.5
    md = render_markdown(report)
    assert "| avg@4 (pass@1) | 37.5% |" in md and "| pass@4 | 50.0% |" in md
    assert "| 1 | x\\|y | 0/4 | 0% |" in md  # table cells escaped


def test_user_errors_are_one_line_exit_2(tool_model_dir: Path, tmp_path: Path) -> None:
    bad = run_cli("eval", "--model", str(tmp_path), "--dataset", "aime24")
    assert bad.returncode == 2 and "not a model folder" in bad.stderr
    unknown = run_cli("eval", "--model", str(tool_model_dir), "--dataset", "no-such-set")
    assert unknown.returncode == 2 and "unknown dataset 'no-such-set'" in unknown.stderr
    assert unknown.stderr.strip().count("\n") == 0


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")
def test_eval_of_the_tool_model_writes_reports(tool_model_dir: Path, tmp_path: Path) -> None:
    data = write_eval_dataset(tmp_path / "scripts.jsonl")
    out = tmp_path / "report"
    proc = run_cli(
        "eval", "--model", str(tool_model_dir), "--dataset", str(data), "--n", "2",
        "--temperature", "0", "--max-tokens", "300", "--max-turns", "3", "--dtype", "float32",
        "--max-model-len", "1024", "--out", str(out), "--quiet",
        timeout=300,
    )  # fmt: skip
    check_script_report(proc, out)


def test_engine_context_is_capped_at_the_models(tmp_path: Path) -> None:
    from rstar2.chat import model_context_tokens

    assert model_context_tokens(str(tmp_path)) is None  # no config.json
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 2048}')
    assert model_context_tokens(str(tmp_path)) == 2048
