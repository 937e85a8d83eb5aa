"""The `rstar2` command line. User errors exit 2 with one line on stderr, never a traceback."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from rstar2 import cli_launch, cli_run
from rstar2.config import ConfigError
from rstar2.errors import UserError

EXIT_USER_ERROR = 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help()
        return EXIT_USER_ERROR
    try:
        code: int = args.handler(args)
        return code
    except UserError as exc:
        print(f"rstar2: {exc.kind}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("rstar2: interrupted", file=sys.stderr)
        return 130


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rstar2", description="Agentic RL with a Python tool: the rStar2-Agent recipe."
    )
    sub = parser.add_subparsers(metavar="COMMAND")

    data = sub.add_parser("data", help="prepare prompt data in the rStar2 parquet schema")
    data_sub = data.add_subparsers(metavar="ACTION")
    lst = data_sub.add_parser("list", help="list the built-in datasets")
    lst.set_defaults(handler=_cmd_data_list)
    prep = data_sub.add_parser("prepare", help="write NAME.parquet for each dataset")
    prep.add_argument(
        "--dataset",
        action="append",
        required=True,
        help="built-in name, .jsonl/.json/.parquet path, or hf:ORG/NAME[:CFG][@SPLIT]; repeatable",
    )
    prep.add_argument("--out", required=True, type=Path, help="output folder")
    prep.add_argument(
        "--decontaminate",
        action="store_true",
        help="drop problems that near-duplicate a built-in benchmark problem (8-gram overlap)",
    )
    prep.add_argument("--limit", type=_positive_int, help="keep only the first N rows")
    prep.add_argument("--quiet", action="store_true", help="no progress bars")
    prep.set_defaults(handler=_cmd_data_prepare)

    toy = data_sub.add_parser(
        "toy", help="generate the toy recipe's arithmetic tool-use data (sft/train/heldout)"
    )
    toy.add_argument("--out", required=True, type=Path, help="output folder")
    toy.add_argument("--num-sft", type=_positive_int, default=7000, help="SFT conversations")
    toy.add_argument("--num-train", type=_positive_int, default=2000, help="RL problems")
    toy.add_argument("--num-heldout", type=_positive_int, default=100, help="held-out problems")
    toy.add_argument("--seed", type=int, default=0)
    toy.set_defaults(handler=_cmd_data_toy)

    cfg = sub.add_parser("config", help="print the resolved config as JSON")
    _add_config_args(cfg)
    cfg.set_defaults(handler=_cmd_config)

    layout = sub.add_parser(
        "layout",
        help="check the megatron learner's TP/PP layout against the model and show what each "
        "rank holds (CPU, no weights needed: the model's config.json)",
    )
    _add_config_args(layout)
    layout.add_argument(
        "--learner-ranks",
        type=int,
        metavar="N",
        help="learner GPUs in all (default: learner.num_ranks)",
    )
    layout.set_defaults(handler=_cmd_layout)

    reward = sub.add_parser("reward", help="score one response against a ground truth")
    reward.add_argument("response", help="response text, or @FILE to read it from a file")
    reward.add_argument("ground_truth", help="the reference answer")
    reward.add_argument("--timeout-s", type=float, default=3.0, help="verification time bound")
    reward.set_defaults(handler=_cmd_reward)

    chat = sub.add_parser("chat", help="chat with a model that can run Python (tool loop)")
    from rstar2.chat import add_arguments as add_chat_arguments

    add_chat_arguments(chat)
    chat.set_defaults(handler=_cmd_chat)

    sft = sub.add_parser("sft", help="supervised cold start on tool-call conversations")
    _add_config_args(sft)
    sft.add_argument("--run-dir", type=Path, help="run folder (default: RUNS_DIR/NAME-sft-TIME)")
    sft.add_argument("--quiet", action="store_true", help="no progress bar")
    sft.set_defaults(handler=cli_run.cmd_sft)

    train = sub.add_parser(
        "train", help="the recipe: [tiny model] [SFT] then GRPO-RoC RL stages, with eval"
    )
    _add_config_args(train)
    train.add_argument("--run-dir", type=Path, help="run folder (default: RUNS_DIR/NAME-TIME)")
    train.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its newest checkpoint (uses its config.json)",
    )
    train.add_argument(
        "--save-rollouts", type=Path, metavar="DIR", help="also write each step's rollouts here"
    )
    train.add_argument(
        "--replay-rollouts",
        type=Path,
        metavar="DIR",
        help="train on rollouts saved by --save-rollouts instead of generating (no engines)",
    )
    train.add_argument("--quiet", action="store_true", help="no progress bars")
    train.set_defaults(handler=cli_run.cmd_train)

    launch = sub.add_parser("launch", help="start a run on a cluster")
    launch_sub = launch.add_subparsers(metavar="WHERE")
    jobs = {
        "slurm": "render the run's Slurm job (RUNS_DIR/NAME/attempt_K) and submit it",
        "torchrun": "render a learner-only Slurm job (rstar2 sft under torchrun, one rank per "
        "GPU of the launch.learner nodes) and submit it",
    }
    for name, help_text in jobs.items():
        job = launch_sub.add_parser(name, help=help_text)
        _add_config_args(job)
        job.add_argument(
            "--dry-run", action="store_true", help="render and print the sbatch command only"
        )
        job.set_defaults(handler=cli_launch.cmd_launch_slurm, torchrun=name == "torchrun")
    local = launch_sub.add_parser(
        "local",
        help="the Slurm job's role layout on this machine (Redis, sandbox service, Ray head "
        "with role resources), then rstar2 train in it",
    )
    _add_config_args(local)
    local.add_argument("--dry-run", action="store_true", help="print what it would start only")
    local.set_defaults(handler=cli_launch.cmd_launch_local)

    ev = sub.add_parser("eval", help="avg@n / pass@k of a model on a benchmark, with the tool")
    from rstar2.eval import add_arguments as add_eval_arguments

    add_eval_arguments(ev)
    ev.set_defaults(handler=_cmd_eval)

    doctor = sub.add_parser(
        "doctor",
        help="check this machine or image: versions, GPUs, imports, services (exit 1 on a "
        "failed required check)",
    )
    from rstar2.doctor.command import add_arguments as add_doctor_arguments

    add_doctor_arguments(doctor)
    doctor.set_defaults(handler=_cmd_doctor)

    demo = sub.add_parser(
        "demo",
        help="the embedded CPU job: resolve the config into a run folder, prepare its data, "
        "and grade synthetic responses to the eval sets with the reward",
    )
    _add_config_args(demo, default_config="configs/toy/demo.yaml")
    demo.add_argument("--run-dir", type=Path, help="run folder (default: RUNS_DIR/NAME-TIME)")
    demo.set_defaults(handler=_cmd_demo)
    return parser


def _add_config_args(p: argparse.ArgumentParser, default_config: str | None = None) -> None:
    p.add_argument("--config", default=default_config, help="YAML config file")
    p.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="dotted overrides, e.g. seed=1"
    )


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return value


def _cmd_data_list(args: argparse.Namespace) -> int:
    from rstar2.data import BUILTIN_DATASETS

    for ds in BUILTIN_DATASETS.values():
        print(f"{ds.name:<10} {ds.num_rows:>6} rows  {ds.split:<5}  {ds.description}")
    return 0


def _cmd_data_prepare(args: argparse.Namespace) -> int:
    from rstar2.data import benchmark_decontaminator, prepare_dataset

    decontaminator = benchmark_decontaminator() if args.decontaminate else None
    for spec in args.dataset:
        result = prepare_dataset(
            spec, args.out, decontaminator=decontaminator, limit=args.limit, progress=not args.quiet
        )
        dropped = f" ({result.num_contaminated} contaminated dropped)" if decontaminator else ""
        print(f"{result.name}: {result.num_rows} rows -> {result.path}{dropped}")
    return 0


def _cmd_data_toy(args: argparse.Namespace) -> int:
    from rstar2.toy import write_toy_data

    paths = write_toy_data(
        args.out,
        num_sft=args.num_sft,
        num_train=args.num_train,
        num_heldout=args.num_heldout,
        seed=args.seed,
    )
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    from rstar2.config_io import load_config

    config = load_config(args.config, args.overrides)
    print(json.dumps(config.model_dump(mode="json"), indent=2))
    return 0


def _cmd_reward(args: argparse.Namespace) -> int:
    from rstar2.reward import RewardScorer, extract_answer

    text = args.response
    if text.startswith("@"):
        path = Path(text[1:])
        if not path.is_file():
            print(f"rstar2: no such file: {path}", file=sys.stderr)
            return EXIT_USER_ERROR
        text = path.read_text(encoding="utf-8", errors="replace")
    with RewardScorer(timeout_s=args.timeout_s, num_workers=1) as scorer:
        value = scorer.score(text, args.ground_truth)
    print(json.dumps({"extracted": extract_answer(text), "score": value}))
    return 0


def _cmd_chat(args: argparse.Namespace) -> int:
    import asyncio

    from rstar2.chat import run_chat

    return asyncio.run(run_chat(args))


def _cmd_layout(args: argparse.Namespace) -> int:
    from rstar2.config import MegatronLearnerConfig
    from rstar2.config_io import load_config
    from rstar2.memory_plan import plan_memory, read_dims
    from rstar2.model_shapes import KNOWN_SHAPES

    cfg = load_config(args.config, args.overrides)
    dims, source = read_dims(cfg.model.path)  # ConfigError: neither config.json nor known
    section = cfg.learner
    if isinstance(section, MegatronLearnerConfig):
        from transformers import AutoConfig

        from rstar2.learner.megatron.plan import plan_learner

        folder = Path(cfg.model.path)
        if (folder / "config.json").is_file():
            hf_config = AutoConfig.from_pretrained(folder)
        else:
            shape = dict(KNOWN_SHAPES[cfg.model.path])
            hf_config = AutoConfig.for_model(shape.pop("model_type", "qwen3"), **shape)
        ranks = section.num_ranks if args.learner_ranks is None else args.learner_ranks
        if ranks < 1:
            raise ConfigError("--learner-ranks", "must be at least 1")
        plan = plan_learner(section, hf_config, ranks)
        print(f"learner: {ranks} ranks, {plan.describe()}")
        if ranks != section.num_ranks:
            cfg = cfg.model_copy(
                update={"learner": section.model_copy(update={"num_ranks": ranks})}
            )
    else:
        print("learner: torch backend; FSDP2 shards over any number of ranks")
    for line in plan_memory(cfg, dims, source).lines():
        print(line)
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    import asyncio
    import time

    from rstar2.console import run_console
    from rstar2.data.sources import load_rows
    from rstar2.eval import run_eval_command

    if args.out is None:  # the report's folder holds the logs too: name it before they start
        name = load_rows(args.dataset).name  # DataError: exit 2 here, as in run_eval_command
        args.out = Path("runs") / f"eval-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    with run_console(args.out / "logs"):  # the closing line names the folder
        return asyncio.run(run_eval_command(args))


def _cmd_doctor(args: argparse.Namespace) -> int:
    from rstar2.doctor.command import main as doctor

    return doctor(args)


def _cmd_demo(args: argparse.Namespace) -> int:
    from rstar2.config_io import load_config
    from rstar2.demo import run_demo

    config = load_config(args.config, args.overrides)  # fails fast, before anything heavy
    run_demo(config, run_dir=args.run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
