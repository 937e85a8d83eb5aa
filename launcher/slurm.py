"""``rstar2 launch slurm``: render a run's Slurm job into ``<runs_dir>/<name>/attempt_<k>/``
(``job.sbatch``, ``config.json``, ``env.sh``) and submit it with ``sbatch --parsable``.

The attempt folder is a new one each time (``attempt_1``, ``attempt_2``, ...); the training run
itself lives in ``<runs_dir>/<name>/`` and a later attempt (or Slurm's requeue of this one)
resumes it. ``--dry-run`` renders, prints the ``sbatch`` command and submits nothing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from launcher.plan import JobPlan, plan_job, plan_torchrun_job
from launcher.render import JobPaths, render_env, render_sbatch
from rstar2.config import Config
from rstar2.errors import UserError


class LaunchError(UserError, RuntimeError):
    """Submission failed (no Slurm here, sbatch refused the job): the message says why."""

    kind: ClassVar[str] = "launch error"


@dataclass(frozen=True)
class Attempt:
    folder: Path
    script: Path
    command: list[str]
    job_id: str | None
    resumes: bool = False  # the run folder already holds a run: the job resumes it


def job_config(cfg: Config, plan: JobPlan) -> Config:
    """The config the job's driver runs: in a Ray cluster of every node of the job."""
    nodes = sum(c.nodes for c in plan.components)
    cluster = cfg.cluster.model_copy(update={"ray": True, "num_nodes": nodes})
    return cfg.model_copy(update={"cluster": cluster})


def next_attempt(run_dir: Path) -> Path:
    taken = [
        int(p.name.split("_", 1)[1]) for p in run_dir.glob("attempt_*") if p.name[8:].isdigit()
    ]
    return run_dir / f"attempt_{max(taken, default=0) + 1}"


def prepare(
    cfg: Config,
    *,
    workdir: Path | None = None,
    python: str | None = None,
    torchrun: bool = False,
) -> Attempt:
    """Check ``cfg`` (ConfigError before anything is written), then write the attempt folder
    (everything is rendered first: a failure leaves no partial folder). ``torchrun``: the
    learner-only job (``rstar2 sft`` under torchrun) instead of the Ray job of a run."""
    plan = plan_torchrun_job(cfg) if torchrun else plan_job(cfg)
    # an SFT job's folder is not the RL run's (a later `launch slurm` would resume it)
    run_dir = (Path(cfg.runs_dir) / (f"{cfg.name}-sft" if torchrun else cfg.name)).resolve()
    folder = next_attempt(run_dir)
    log_dir = Path(cfg.launch.log_dir).resolve() if cfg.launch.log_dir else folder / "logs"
    paths = JobPaths(
        run_dir=str(run_dir),
        attempt_dir=str(folder),
        log_dir=str(log_dir),
        workdir=str((workdir or Path.cwd()).resolve()),
        python=python or sys.executable,
    )
    job = cfg if torchrun else job_config(cfg, plan)
    template = "torchrun.sbatch.j2" if torchrun else "slurm.sbatch.j2"
    files = {
        "config.json": json.dumps(job.model_dump(mode="json"), indent=2) + "\n",
        "env.sh": render_env(plan),
        "job.sbatch": render_sbatch(plan, paths, template),
        "canary": f"{folder}\n",  # every node must read it (the shared file system)
    }
    folder.mkdir(parents=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    script = folder / "job.sbatch"
    resumes = not torchrun and (run_dir / "config.json").is_file()
    return Attempt(folder, script, ["sbatch", "--parsable", str(script)], None, resumes)


def submit(attempt: Attempt) -> Attempt:
    """``sbatch --parsable``; the job id is recorded in the attempt folder (``job_id``)."""
    if shutil.which("sbatch") is None:
        raise LaunchError("sbatch not found: run this on a Slurm login node (or use --dry-run)")
    proc = subprocess.run(attempt.command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LaunchError(f"sbatch refused the job: {proc.stderr.strip() or proc.stdout.strip()}")
    job_id = proc.stdout.strip().split(";")[0]
    (attempt.folder / "job_id").write_text(job_id + "\n")
    latest = attempt.folder.parent / "latest"
    latest.unlink(missing_ok=True)
    latest.symlink_to(attempt.folder.name)
    return Attempt(attempt.folder, attempt.script, attempt.command, job_id, attempt.resumes)
