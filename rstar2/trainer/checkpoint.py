"""The one store a resumed run reads: checkpoints of learner state plus ``trainer.json``.

Guarantees:
- :meth:`Checkpointer.save` writes the learner, the trainer's extras and ``trainer.json`` (last)
  into ``step_N.tmp``, fsyncs them, seals the folder with a manifest of file sizes, and renames
  it into place; a crash at any point leaves the previous checkpoint as it was.
- A full disk (or quota) during a save removes the partial folder and raises
  :class:`CheckpointError` with a one-line reason; the previous checkpoint is intact.
- Only ``keep_last`` whole checkpoints stay, and the newest whole one is never deleted.
- :meth:`Checkpointer.restore` loads the newest whole checkpoint, skipping a torn one (a file
  missing or short) with a warning, and moves the metric lines written after it to
  ``metrics.discarded.jsonl``: ``metrics.jsonl`` is kept consistent with the checkpoint, never
  read to decide what to do. When every checkpoint is torn it raises rather than start over.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rstar2 import failpoints
from rstar2.learner.protocol import Learner
from rstar2.trainer import durable
from rstar2.trainer import state as st
from rstar2.trainer.durable import CheckpointError

METRICS = "metrics.jsonl"
DISCARDED = "metrics.discarded.jsonl"
__all__ = ["DISCARDED", "METRICS", "CheckpointError", "Checkpointer", "read_jsonl"]
log = logging.getLogger(__name__)


class Checkpointer:
    def __init__(self, run_dir: Path, keep_last: int) -> None:
        self.run_dir = run_dir
        self.keep_last = keep_last
        self._warned: set[Path] = set()  # torn checkpoints already logged

    def has(self, step: int) -> bool:
        """Whether a whole checkpoint of ``step`` is on disk (its swapped-out copy included)."""
        final = st.checkpoint_dir(self.run_dir, step)
        return any(p.name.split(".")[0] == final.name for p in self.whole())

    def whole(self) -> list[Path]:
        """Complete checkpoints that pass their manifest check, oldest first (torn ones are
        left out, and logged once each)."""
        out = []
        for folder in st.complete_checkpoints(self.run_dir):
            reason = durable.check(folder, sealed=st.read_sealed(folder))
            if reason is None:
                out.append(folder)
            elif folder not in self._warned:
                self._warned.add(folder)
                log.warning("checkpoint %s is torn (%s); skipping it", folder, reason)
        return out

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
        old = final.with_name(final.name + ".old")
        if old.exists() and not final.exists():  # a re-save crashed between its renames
            old.rename(final)
        try:
            if tmp.exists():
                shutil.rmtree(tmp)
            if old.exists():
                shutil.rmtree(old)
            learner.save(tmp / "learner")
            failpoints.hit("checkpoint_write", state.step)
            if extra is not None:
                extra(tmp)
            st.write_state(tmp, state, sealed=True)
            durable.seal(tmp)
        except BaseException as exc:  # torch.distributed.checkpoint raises a BaseException
            previous = self.whole()
            expected = durable.tree_bytes(previous[-1]) if previous else 0
            full = durable.is_disk_full(exc, tmp, expected)
            shutil.rmtree(tmp, ignore_errors=True)
            if not full:
                raise
            kept = f"{previous[-1].name} is intact" if previous else "there is no earlier one"
            raise CheckpointError(
                f"disk full while writing checkpoint {final.name} in {final.parent} "
                f"({type(exc).__name__}); {kept}. Free space or move the run folder, then "
                "resume."
            ) from exc
        if final.exists():  # a step saved again (e.g. a stop during its eval): swap, then drop
            final.rename(old)
        tmp.rename(final)
        durable.fsync_dir(final.parent)
        shutil.rmtree(old, ignore_errors=True)
        st.prune(self.run_dir, self.keep_last, self.whole())
        return final

    def restore(
        self, learner: Learner, extra: Callable[[Path], None] | None = None
    ) -> st.TrainerState | None:
        """The newest whole checkpoint's state (its weights loaded into ``learner``, its folder
        handed to ``extra``), or None when there is none yet; either way the metric lines
        after it are set aside."""
        found = self.whole()
        if not found:
            torn = st.complete_checkpoints(self.run_dir)
            if torn:
                raise CheckpointError(
                    f"every checkpoint in {torn[0].parent} is torn ({len(torn)}: see the "
                    "warnings above); move them aside to start this run over"
                )
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
