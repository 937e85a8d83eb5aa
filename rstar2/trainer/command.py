"""The ``rstar2 train`` command's body: a runtime for the config, a trainer in it, SIGTERM wired
to the trainer's stop request for the whole run (also during SFT, which runs synchronously),
and SIGUSR2 to a dump of what it is waiting on (:mod:`rstar2.trainer.dump`)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

from rstar2.config import Config
from rstar2.runtime import Runtime, placement_for
from rstar2.trainer.dump import dump_stacks
from rstar2.trainer.loop import Trainer


async def run_train(
    cfg: Config,
    run_dir: Path,
    *,
    resume: bool = False,
    save_rollouts_dir: Path | None = None,
    replay_rollouts_dir: Path | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Prepare and run one training run (the ``rstar2 train`` command's body)."""
    from rstar2.sft import SftStopped

    loop = asyncio.get_running_loop()
    async with Runtime(placement_for(cfg)) as runtime:
        trainer = Trainer(cfg, run_dir, runtime, quiet=quiet)
        trainer.save_rollouts_dir = save_rollouts_dir
        trainer.replay_rollouts_dir = replay_rollouts_dir
        # signal.signal, not loop.add_signal_handler: SFT runs synchronously in prepare()
        previous = signal.signal(signal.SIGTERM, lambda *_: trainer.stop_from_signal(loop))
        stacks = run_dir / "logs"
        previous_usr2 = signal.signal(signal.SIGUSR2, lambda *_: dump_stacks(stacks))
        try:
            try:
                trainer.prepare(resume=resume)
            except SftStopped as stopped:
                print(f"{stopped}; no SFT model is kept, a resume starts SFT again", flush=True)
                return {"stopped": True, "steps": 0}
            return await trainer.run()
        finally:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGUSR2, previous_usr2)
            trainer.close()
