"""``rstar2 launch slurm`` and ``rstar2 launch local``: plan a job from the config (nothing is
written or started on a config error), then submit or start it, or print it with ``--dry-run``."""

from __future__ import annotations

import argparse

from rstar2.config import Config, ConfigError


def cmd_launch_slurm(args: argparse.Namespace) -> int:
    import shlex

    from launcher.plan import port_block
    from launcher.slurm import prepare, submit
    from rstar2.config_io import load_config

    cfg = load_config(args.config, args.overrides)
    _check_memory(cfg, learner_only=args.torchrun)
    attempt = prepare(cfg, torchrun=args.torchrun)  # ConfigError: nothing written
    print(f"job script: {attempt.script}")
    if attempt.resumes:
        print(
            f"note: {attempt.folder.parent} already holds a run: the job resumes it with that "
            "run's own config.json (this config only places the job)"
        )
    if args.dry_run:
        print(shlex.join(attempt.command))
        return 0
    attempt = submit(attempt)  # LaunchError: one line, exit 2 (rstar2.cli.main)
    print(f"submitted job {attempt.job_id}; logs in {attempt.folder / 'logs'}")
    if cfg.logging.metrics_port is not None and attempt.job_id is not None:
        port = port_block(int(attempt.job_id))["metrics"]
        print(f"live metrics: http://HEAD:{port}/metrics (HEAD: the job's first learner node)")
    return 0


def _check_memory(cfg: Config, *, learner_only: bool) -> None:
    """ConfigError when a phase does not fit a GPU (rstar2.memory_plan); a model whose shape
    is not known here is not checked, and the console says so."""
    from rstar2.memory_plan import check_fits, plan_memory, read_dims

    try:
        dims, source = read_dims(cfg.model.path)
    except ConfigError as exc:
        print(f"note: memory per GPU not checked: {exc.message}")
        return
    check_fits(plan_memory(cfg, dims, source), cfg, learner_only=learner_only)


def cmd_launch_local(args: argparse.Namespace) -> int:
    import shlex

    from launcher.local import plan_local, run_local
    from rstar2.config_io import load_config

    cfg = load_config(args.config, args.overrides)
    plan = plan_local(cfg, args.config, list(args.overrides))  # ConfigError: nothing started
    if plan.resumes:
        print(
            f"note: {plan.run_dir} already holds a run: the driver resumes it with that run's "
            "own config.json (this config and its overrides only place it)"
        )
    if args.dry_run:
        for service in plan.services:
            env = " ".join(f"{k}={v}" for k, v in service.env.items())
            print(f"{service.name}: {env + ' ' if env else ''}{shlex.join(service.command)}")
        print(f"driver: {shlex.join(plan.driver)}")
        return 0
    return run_local(plan, start_timeout_s=cfg.launch.start_timeout_s)
