"""The one store a resumed run reads: checkpoints of learner state plus ``trainer.json``.

Guarantees: :meth:`Checkpointer.save` writes the learner and the trainer state into a
temporary folder and renames it into place, ``trainer.json`` last, so a folder is complete or
ignored; only ``keep_last`` complete ones stay. :meth:`Checkpointer.restore` loads the newest
complete one and moves the metric lines written after it to ``metrics.discarded.jsonl``:
``metrics.jsonl`` is kept consistent with the checkpoint, never read to decide what to do.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rstar2.learner.protocol import Learner
from rstar2.trainer import state as st

METRICS = "metrics.jsonl"
DISCARDED = "metrics.discarded.jsonl"


class Checkpointer:
    def __init__(self, run_dir: Path, keep_last: int) -> None:
        self.run_dir = run_dir
        self.keep_last = keep_last

    def has(self, step: int) -> bool:
        return (st.checkpoint_dir(self.run_dir, step) / st.STATE_FILE).is_file()

    def save(
        self,
        learner: Learner,
        state: st.TrainerState,
        rng: random.Random,
        extra: Callable[[Path], None] | None = None,
    ) -> Path:
        """Learner, ``extra(folder)`` (what else the trainer keeps) and the state, in place."""
        state.rng_state = st.rng_to_json(rng)
        final = st.checkpoint_dir(self.run_dir, state.step)
        tmp = final.with_name(final.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        learner.save(tmp / "learner")
        if extra is not None:
            extra(tmp)
        st.write_state(tmp, state)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        st.prune(self.run_dir, self.keep_last)
        return final

    def restore(
        self, learner: Learner, extra: Callable[[Path], None] | None = None
    ) -> st.TrainerState | None:
        """The newest checkpoint's state (its weights loaded into ``learner``, its folder
        handed to ``extra``), or None when there is none yet; either way the metric lines
        after it are set aside."""
        found = st.complete_checkpoints(self.run_dir)
        if not found:
            self.truncate_metrics(-1)
            return None
        learner.load(found[-1] / "learner")
        if extra is not None:
            extra(found[-1])
        state = st.read_state(found[-1])
        self.truncate_metrics(state.step)
        return state

    def truncate_metrics(self, step: int) -> None:
        """Keep the metric lines of steps up to ``step``; later ones move to a side file."""
        path = self.run_dir / METRICS
        rows = read_jsonl(path)
        # a stage that starts right after the checkpoint starts again after the resume
        keep = [
            r for r in rows if r["step"] < step or (r["step"] == step and "stage_start" not in r)
        ]
        dropped = [r for r in rows if r not in keep]
        if dropped:
            with open(self.run_dir / DISCARDED, "a") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in dropped)
        path.write_text("".join(json.dumps(r) + "\n" for r in keep))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
