"""``rstar2 sft`` and ``rstar2 train``: the commands that make (or resume) a run folder and send
third-party output to its ``logs`` folder. User errors raise ConfigError (exit 2 in
:func:`rstar2.cli.main`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rstar2.config import ConfigError


def cmd_sft(args: argparse.Namespace) -> int:
    import time

    import torch.distributed as dist

    from rstar2.config_io import load_config, write_resolved_config
    from rstar2.console import run_console
    from rstar2.learner.torchrun import broadcast_from_rank0, init_torchrun_group, torchrun_world
    from rstar2.sft import check_sft_inputs, run_sft
    from rstar2.trainer.wiring import check_learner_supported

    cfg = load_config(args.config, args.overrides)
    world = torchrun_world()  # a learner-only job under torchrun: every rank runs this
    check_learner_supported(cfg, torchrun_ranks=world)  # before a run folder exists
    if cfg.sft.data and world is None:  # as `rstar2 train` does
        from rstar2.recipe import build_tiny_if_missing

        build_tiny_if_missing(cfg, lambda line: print(line, flush=True))
    check_sft_inputs(cfg)
    if world is not None:
        init_torchrun_group(cfg.cluster.accelerator)
    try:
        rank = dist.get_rank() if world is not None else 0
        stamp = time.strftime("%Y%m%d-%H%M%S")
        default = Path(cfg.runs_dir) / f"{cfg.name}-sft-{stamp}"
        run_dir = Path(broadcast_from_rank0(str(args.run_dir or default)))
        if rank == 0:
            write_resolved_config(cfg, run_dir)
            with run_console(run_dir / "logs") as log:
                print(f"logs of transformers, torch and other libraries: {log}", flush=True)
                summary = run_sft(cfg, run_dir, quiet=args.quiet, rank=rank)
        else:  # its output goes where torchrun sends it
            summary = run_sft(cfg, run_dir, quiet=True, rank=rank)
    finally:
        if world is not None and dist.is_initialized():
            dist.destroy_process_group()
    if rank != 0:
        return 0
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"sft: {summary['steps']} steps on {summary['conversations']} conversations "
        f"({summary['skipped_too_long']} too long), nll {summary['first_nll']:.3f} -> "
        f"{summary['last_nll']:.3f}"
        + (f" on {world} ranks" if world else "")
        + f"; model in {summary['model_dir']}"
    )
    return 0


# addresses of services a resumed run may find elsewhere (a relaunched job's sandbox node, its
# port block): where things run, never what the run computes
RESUME_OVERRIDES = ("sandbox.url", "sandbox.redis_url", "logging.metrics_port")


def cmd_train(args: argparse.Namespace) -> int:
    import asyncio
    import signal
    import time

    from rstar2.config_io import load_config, write_resolved_config
    from rstar2.console import run_console
    from rstar2.trainer.command import run_train
    from rstar2.trainer.wiring import check_supported

    if args.replay_rollouts is not None and not args.replay_rollouts.is_dir():
        raise ConfigError("--replay-rollouts", f"{args.replay_rollouts} is not a folder")
    if args.resume is not None:
        moved = [o for o in args.overrides if o.split("=", 1)[0] not in RESUME_OVERRIDES]
        if args.config or moved or args.run_dir:
            raise ConfigError(
                "--resume",
                "takes the run's own config.json; drop other options (only where services "
                f"moved may change: {', '.join(RESUME_OVERRIDES)})",
            )
        run_dir = args.resume
        if not (run_dir / "config.json").is_file():
            raise ConfigError("--resume", f"{run_dir} has no config.json: not a run folder")
        cfg = load_config(run_dir / "config.json", args.overrides)
    else:
        cfg = load_config(args.config, args.overrides)
        check_supported(cfg)  # before a run folder exists
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = args.run_dir or Path(cfg.runs_dir) / f"{cfg.name}-{stamp}"
        if (run_dir / "config.json").exists():
            raise ConfigError("--run-dir", f"{run_dir} already holds a run; use --resume")
        write_resolved_config(cfg, run_dir)
    print(f"run folder: {run_dir}", flush=True)
    with run_console(run_dir / "logs") as log:
        print(f"logs of vLLM, Ray and other libraries: {log}", flush=True)
        summary = asyncio.run(
            run_train(
                cfg,
                run_dir,
                resume=args.resume is not None,
                save_rollouts_dir=args.save_rollouts,
                replay_rollouts_dir=args.replay_rollouts,
                quiet=args.quiet,
            )
        )
    if summary.get("stopped"):
        print(f"train: stopped at step {summary['steps']}; rstar2 train --resume {run_dir}")
        return 128 + signal.SIGTERM
    gains = summary.get("eval_gain_points") or {}
    gain_text = ", ".join(f"{k} {v:+.1f} points" for k, v in gains.items())
    print(
        f"train: {summary['steps']} steps; model in {summary['model_dir']}"
        + (f"; held-out change {gain_text}" if gain_text else "")
    )
    return 0
