"""The embedded CPU job behind README command 1, until the RL trainer lands.

It exercises the foundation end to end on a config: writes the resolved config into a fresh run
folder, prepares the training and evaluation data as rStar2 parquet, and grades synthetic
responses (each eval answer respelled equivalently, and a wrong one) with the reward, writing
``reward_demo.json``. Never overwrites an existing run folder.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from rstar2.config import Config, ConfigError
from rstar2.config_io import write_resolved_config
from rstar2.data import benchmark_decontaminator, ground_truth, prepare_dataset, read_rows
from rstar2.reward import RewardScorer, samples

_CHUNK = 64


@dataclass
class GradeReport:
    dataset: str
    num_problems: int
    correct_respelled_scored_1: int
    wrong_scored_0: int
    seconds: float


def run_demo(config: Config, run_dir: Path | None = None) -> list[GradeReport]:
    """Run the demo job for ``config``; returns one grade report per eval dataset."""
    run_dir = run_dir or Path(config.runs_dir) / f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if (run_dir / "config.json").exists():
        raise ConfigError("--run-dir", f"{run_dir} already holds a run; choose another folder")
    print(f"run folder: {run_dir}")
    write_resolved_config(config, run_dir)

    decontaminator = benchmark_decontaminator() if config.data.decontaminate else None
    for spec in config.data.train_datasets:
        res = prepare_dataset(spec, run_dir / "data" / "train", decontaminator=decontaminator)
        print(f"train  {res.name}: {res.num_rows} rows ({res.num_contaminated} contaminated)")
    eval_paths = []
    for spec in config.data.eval_datasets:
        res = prepare_dataset(spec, run_dir / "data" / "eval")
        print(f"eval   {res.name}: {res.num_rows} rows")
        eval_paths.append(res.path)

    reports = []
    cfg = config.reward
    with RewardScorer(
        timeout_s=cfg.timeout_s, num_workers=cfg.num_workers, cache_size=cfg.cache_size
    ) as scorer:
        for path in eval_paths:
            reports.append(_grade(scorer, path))
    (run_dir / "reward_demo.json").write_text(
        json.dumps([asdict(r) for r in reports], indent=2) + "\n"
    )
    for r in reports:
        print(
            f"reward {r.dataset}: {r.correct_respelled_scored_1}/{r.num_problems} respelled "
            f"answers scored 1, {r.wrong_scored_0}/{r.num_problems} wrong answers scored 0 "
            f"({r.seconds:.1f} s)"
        )
    return reports


def _grade(scorer: RewardScorer, path: Path) -> GradeReport:
    truths = [ground_truth(row) for row in read_rows(path)]
    good = [samples.response(samples.respell(t)) for t in truths]
    bad = [samples.response(samples.wrong(t)) for t in truths]
    start = time.perf_counter()
    good_scores: list[float] = []
    bad_scores: list[float] = []
    for i in tqdm(range(0, len(truths), _CHUNK), desc=f"grade {path.stem}", unit="chunk"):
        chunk = truths[i : i + _CHUNK]
        good_scores += scorer.score_batch(good[i : i + _CHUNK], chunk)
        bad_scores += scorer.score_batch(bad[i : i + _CHUNK], chunk)
    return GradeReport(
        dataset=path.stem,
        num_problems=len(truths),
        correct_respelled_scored_1=int(sum(good_scores)),
        wrong_scored_0=len(bad_scores) - int(sum(bad_scores)),
        seconds=time.perf_counter() - start,
    )
