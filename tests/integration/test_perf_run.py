"""`python -m perf run` end to end on two quick benchmarks: files, report, plots, --compare."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perf", "run", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_run_writes_results_report_and_plots_and_compare_flags_a_slowdown(tmp_path):
    only = ("--only", "scheduler_decision", "rollout_sim")
    first = _run("--quick", *only, "--out", str(tmp_path / "a"), "--commit", "c1")
    assert first.returncode == 0, first.stdout + first.stderr
    (results,) = (tmp_path / "a").glob("*-c1.json")
    run = json.loads(results.read_text())
    assert run["commit"] == "c1" and run["hardware"]["cores"] >= 1 and run["versions"]["python"]
    assert set(run["benchmarks"]) == {"scheduler_decision", "rollout_sim"}
    folder = results.with_suffix("")
    report = (folder / "report.md").read_text()
    assert "rollout_sim.kv_affinity.makespan_vs_lower_bound" in report
    assert (folder / "rollout-makespan-per-policy.png").stat().st_size > 10_000
    assert (folder / "logs" / "rollout_sim.log").read_text().startswith(sys.executable)

    # a baseline 10% better on every figure: each one of this run is flagged
    doctored = dict(run)
    doctored["figures"] = [
        {**f, "value": f["value"] * (1.1 if f["better"] == "higher" else 1 / 1.1)}
        for f in run["figures"]
    ]
    planted = tmp_path / "doctored.json"
    planted.write_text(json.dumps(doctored))
    second = _run("--quick", *only, "--out", str(tmp_path / "b"), "--compare", str(planted))
    assert second.returncode == 0, second.stdout + second.stderr
    (rerun,) = (tmp_path / "b").glob("*.json")
    flagged = set(json.loads(rerun.read_text())["flagged"])
    sim_ratios = {f["name"] for f in run["figures"] if f["name"].startswith("rollout_sim.")}
    assert sim_ratios <= flagged
    assert f"more than 5% worse than {planted}" in second.stdout

    # the same commit again against the first run: the simulator's ratios do not move
    third = _run("--quick", *only, "--out", str(tmp_path / "c"), "--compare", str(results))
    assert third.returncode == 0, third.stdout + third.stderr
    (again,) = (tmp_path / "c").glob("*.json")
    rerun_figures = {f["name"] for f in json.loads(again.read_text())["figures"]}
    assert sim_ratios <= rerun_figures  # compared, each of them
    assert not sim_ratios & set(json.loads(again.read_text())["flagged"]), third.stdout
    assert "was " in third.stdout


def test_a_bad_benchmark_name_is_one_line():
    done = _run("--only", "nope")
    assert done.returncode == 2 and "unknown benchmark(s) ['nope']" in done.stderr
    assert "Traceback" not in done.stderr
