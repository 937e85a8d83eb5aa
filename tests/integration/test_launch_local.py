"""`rstar2 launch local`: the Slurm job's role layout on this machine (Redis, the sandbox service
with a worker, a Ray head with role resources) runs the tiny CPU model for 2 steps, then stops
every process it started and removes its Ray session folder."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import REPO
from tests.helpers.launch_config import launch_config
from tests.helpers.processes import live_commands


def test_launch_local_runs_the_roles_on_this_machine_and_leaves_nothing(tmp_path: Path) -> None:
    config = launch_config(tmp_path)
    dry = subprocess.run(
        [sys.executable, "-m", "rstar2.cli", "launch", "local", "--config", str(config),
         "--dry-run"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert (
        dry.stdout.count("launcher.sandbox_node") == 2 and "ray.scripts.scripts start" in dry.stdout
    )
    assert not (tmp_path / "runs").exists()  # a dry run starts and writes nothing

    proc = subprocess.run(
        [sys.executable, "-m", "rstar2.cli", "launch", "local", "--config", str(config)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    run = tmp_path / "runs" / "launched"
    assert "train: 2 steps" in proc.stdout
    assert "learner: in a Ray actor" in proc.stdout and "engines: 1 in Ray actors" in proc.stdout
    rows = [json.loads(x) for x in (run / "metrics.jsonl").open()]
    assert [r["step"] for r in rows if "step" in r][-1] == 2
    config_json = json.loads((run / "config.json").read_text())
    assert config_json["cluster"]["ray"] is True and config_json["sandbox"]["mode"] == "http"
    logs = sorted(p.name for p in (run / "local").glob("*.log"))
    assert logs == ["local-sandbox-0.log", "local-sandbox-1.log", "ray.log"]
    # the Redis of the two-node sandbox layout served the calls (its append-only file)
    assert list((run / "local" / "sandbox" / "redis").glob("**/*.aof*"))
    end = time.monotonic() + 30
    while (left := live_commands(str(run), "rstar2-ray-local-")) and time.monotonic() < end:
        time.sleep(0.5)
    assert left == []
    assert not list(Path("/tmp").glob("rstar2-ray-local-*"))
