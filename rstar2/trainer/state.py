"""What a run must remember to continue after a crash, and the order prompts are drawn in.

Guarantees: :class:`PromptSampler` draws each stage's prompts in an order fixed by (seed,
stage, epoch), so a sampler rebuilt from a saved :class:`TrainerState` continues exactly where
the saved one stopped. Checkpoints are written to a temporary folder and renamed into place,
and ``trainer.json`` is written last: a folder without it is incomplete and never loaded
(:mod:`rstar2.trainer.checkpoint` adds the fsyncs and the manifest check).
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer.json"


@dataclass
class TrainerState:
    step: int = 0  # RL steps done, over all stages
    stage_index: int = 0
    stage_step: int = 0  # steps done in the current stage
    stage_started: bool = False  # the stage's filter and resets have run
    epoch: int = 0
    cursor: int = 0  # prompts of this epoch's order already drawn
    pool: list[int] | None = None  # the stage's problem indices; None: every problem
    rng_state: list[Any] = field(default_factory=list)  # RoC's random.Random, as JSON
    last_eval_step: int = -1  # the step whose weights were last evaluated

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainerState:
        return cls(**data)


def rng_to_json(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def rng_from_json(state: Sequence[Any], seed: int) -> random.Random:
    rng = random.Random(seed)
    if state:
        rng.setstate((state[0], tuple(state[1]), state[2]))
    return rng


class PromptSampler:
    """Batches of problem indices from ``pool``, epoch after epoch, in a seeded order."""

    def __init__(self, pool: Sequence[int], *, seed: int, stage: int, shuffle: bool) -> None:
        if not pool:
            raise ValueError("no problems to sample from")
        self.pool = list(pool)
        self.seed, self.stage, self.shuffle = seed, stage, shuffle

    def order(self, epoch: int) -> list[int]:
        order = list(self.pool)
        if self.shuffle:
            random.Random(f"{self.seed}:{self.stage}:{epoch}").shuffle(order)
        return order

    def next_batch(self, state: TrainerState, size: int) -> list[int]:
        """``size`` indices; advances ``state.epoch`` / ``state.cursor``."""
        out: list[int] = []
        while len(out) < size:
            order = self.order(state.epoch)
            take = order[state.cursor : state.cursor + size - len(out)]
            out += take
            state.cursor += len(take)
            if state.cursor >= len(order):
                state.epoch, state.cursor = state.epoch + 1, 0
        return out


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / CHECKPOINTS / f"step_{step:06d}"


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint folders whose state file exists, oldest first. A ``step_N.old`` (the copy a
    re-save of step N swaps out) stands in for ``step_N`` only while that one is missing."""
    root = run_dir / CHECKPOINTS
    if not root.is_dir():
        return []
    found = {}
    for p in root.glob("step_*"):
        step, _, suffix = p.name.partition(".")
        if suffix not in ("", "old") or not (p / STATE_FILE).is_file():
            continue
        if suffix == "" or step not in found:
            found[step] = p
    return [found[k] for k in sorted(found)]


_SEALED = "sealed"  # in the state file: the folder is sealed with a manifest (durable.seal)


def write_state(folder: Path, state: TrainerState, *, sealed: bool = False) -> None:
    data = state.to_json() | ({_SEALED: True} if sealed else {})
    (folder / STATE_FILE).write_text(json.dumps(data) + "\n")


def read_state(folder: Path) -> TrainerState:
    data = json.loads((folder / STATE_FILE).read_text())
    data.pop(_SEALED, None)
    return TrainerState.from_json(data)


def read_sealed(folder: Path) -> bool:
    """Whether the folder was written to be sealed; an unreadable state file counts as sealed
    (its check then names what is wrong)."""
    try:
        return bool(json.loads((folder / STATE_FILE).read_text()).get(_SEALED, False))
    except (OSError, ValueError, AttributeError):
        return True


def prune(run_dir: Path, keep_last: int, whole: Sequence[Path]) -> None:
    """Keep the newest ``keep_last`` of ``whole`` (the complete checkpoints that passed their
    check, oldest first); delete every other checkpoint folder older than the newest whole one,
    and any temporary one. Never deletes the newest whole checkpoint; a torn folder newer than
    it is left for a person to look at."""
    root = run_dir / CHECKPOINTS
    if not root.is_dir():
        return
    for partial in root.glob("*.tmp"):
        shutil.rmtree(partial, ignore_errors=True)
    for old in root.glob("*.old"):
        if old.with_suffix("").is_dir():
            shutil.rmtree(old, ignore_errors=True)
    if not whole:
        return
    keep = {p.name for p in whole[-max(1, keep_last) :]}
    newest = whole[-1].name
    for folder in root.glob("step_*"):  # a .old left standing in for its step counts as it
        if folder.suffix == ".tmp" or not folder.is_dir():
            continue
        if folder.name not in keep and folder.name < newest:
            shutil.rmtree(folder, ignore_errors=True)
