"""`rstar2 sft` as a learner-only job under torchrun (what `rstar2 launch torchrun` runs on each
node): 2 gloo ranks on the CPU train as one process does on the whole batch, rank 0 alone
writes the run folder, and a rank count other than learner.num_ranks is a config error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli
from tests.helpers.launch_config import sft_launch_config


@pytest.fixture(scope="module")
def sft_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sft_launch_config(tmp_path_factory.mktemp("sft-torchrun"))


def _torchrun(config: Path, run_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "-m", "rstar2.cli", "sft", "--config", str(config), "--run-dir", str(run_dir), "--quiet",
         *overrides],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def _metrics(run_dir: Path) -> list[dict[str, float]]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_two_torchrun_ranks_train_as_one_process_on_the_whole_batch(
    sft_config: Path, tmp_path: Path
) -> None:
    one = run_cli("sft", "--config", str(sft_config), "--run-dir", str(tmp_path / "one"), "--quiet")
    assert one.returncode == 0, one.stderr[-2000:]
    two = _torchrun(sft_config, tmp_path / "two", "learner.num_ranks=2")
    assert two.returncode == 0, two.stderr[-3000:]
    assert two.stdout.count("sft: ") == 1 and "on 2 ranks" in two.stdout  # rank 0 reports
    a, b = _metrics(tmp_path / "one"), _metrics(tmp_path / "two")
    assert len(a) == len(b) >= 3
    for x, y in zip(a, b, strict=True):
        for key in ("nll", "grad_norm", "loss_tokens"):
            assert y[key] == pytest.approx(x[key], rel=1e-5), (key, x, y)
    import torch
    from safetensors.torch import load_file

    wa = load_file(tmp_path / "one" / "model" / "model.safetensors")
    wb = load_file(tmp_path / "two" / "model" / "model.safetensors")
    assert wa.keys() == wb.keys()
    for name, tensor in wa.items():
        scale = float(tensor.abs().max()) or 1.0
        assert float((wb[name] - tensor).abs().max()) <= 1e-4 * scale, name
    assert (tmp_path / "two" / "model" / "tokenizer_config.json").is_file()
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted(
        p.name for p in (tmp_path / "one").iterdir()
    )
    del torch


def test_a_rank_count_other_than_the_configs_is_a_config_error(
    sft_config: Path, tmp_path: Path
) -> None:
    proc = _torchrun(sft_config, tmp_path / "run")  # learner.num_ranks stays 1
    assert proc.returncode != 0
    assert "config error: learner.num_ranks: torchrun started 2 ranks" in proc.stderr
    # each rank says it in one line; the only traceback is torchrun's own report of the exit
    assert proc.stderr.count("Traceback") == 1 and "ChildFailedError" in proc.stderr
    assert not (tmp_path / "run").exists()
