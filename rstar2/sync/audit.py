"""The weight-sync audit: did every sync leave the engines with exactly the learner's weights?

With ``learner.weight_sync_audit`` on, the trainer calls :func:`record` after every weight sync:
each engine's weight checksum (vLLM's own parameters, after it fused and padded them) goes into
``<run>/sync_audit/index.jsonl`` and the learner's HF export into ``sync_audit/step_N/``. Later,

    python -m rstar2.sync.audit RUN_DIR

starts one engine in this process (same dtype, weights from a file) from the first export and
compares its checksum with the synced engines'; for each later step it loads that step's export
into the same engine through vLLM's weight loader (every tensor of the model, so nothing of the
earlier step survives) and compares again; the last step is also compared against an engine
freshly started from its export. One line per step; exit status 1 on any difference. Engine
against engine because vLLM's parameters are not the HF tensors (fused q/k/v, padded vocab).
It costs a full export per step: a debugging switch, off by default.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rstar2.learner.protocol import Learner
    from rstar2.rollout.engine import Engine
    from rstar2.rollout.vllm_engine import VLLMEngine, VLLMEngineConfig

AUDIT_DIR = "sync_audit"
INDEX = "index.jsonl"
ENGINE = "engine.json"


async def record(
    run_dir: Path, engines: Sequence[Engine], learner: Learner, engine: object
) -> dict[str, Any]:
    """After a sync: every engine's checksum and the learner's export under ``run_dir``
    (``engine``: the run's engine config, kept once for the audit). Returns the index line.
    ConfigError when the run's engines are not vLLM engines this process can checksum."""
    from rstar2.config_base import ConfigError
    from rstar2.rollout.vllm_engine import VLLMEngineConfig

    if not isinstance(engine, VLLMEngineConfig) or not all(
        hasattr(e, "weight_checksum") for e in engines
    ):
        raise ConfigError("learner.weight_sync_audit", "needs the run's own vLLM engines")
    folder = run_dir / AUDIT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / ENGINE).exists():
        keep = {
            "dtype": engine.dtype,
            "max_model_len": engine.max_model_len,
            "seed": engine.seed,
            "rollout": engine.rollout.model_dump(),
            "num_gpu_blocks_override": engine.num_gpu_blocks_override,
        }
        (folder / ENGINE).write_text(json.dumps(keep, indent=1))
    checksums = [await e.weight_checksum() for e in engines]  # type: ignore[attr-defined]
    name = f"step_{learner.step:06d}"
    await asyncio.to_thread(learner.export_hf, folder / name)  # a Ray learner blocks on it
    line = {"step": learner.step, "export": name, "checksums": checksums}
    with (folder / INDEX).open("a") as out:
        out.write(json.dumps(line) + "\n")
    return line


@dataclass(frozen=True)
class AuditRow:
    step: int
    how: str  # "fresh engine" or "loaded into the audit engine"
    expected: str
    synced: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return all(c == self.expected for c in self.synced)


def _entries(run_dir: Path) -> list[dict[str, Any]]:
    index = run_dir / AUDIT_DIR / INDEX
    if not index.is_file():
        raise FileNotFoundError(
            f"{index} does not exist: run with learner.weight_sync_audit=true to record one"
        )
    return [json.loads(line) for line in index.read_text().splitlines() if line.strip()]


def _engine_config(run_dir: Path, model: Path) -> VLLMEngineConfig:
    from rstar2.config import RolloutConfig
    from rstar2.rollout.vllm_engine import VLLMEngineConfig

    kept = json.loads((run_dir / AUDIT_DIR / ENGINE).read_text())
    return VLLMEngineConfig(
        model_path=str(model),
        dtype=kept["dtype"],
        max_model_len=kept["max_model_len"],
        seed=kept["seed"],
        rollout=RolloutConfig.model_validate(kept["rollout"]),
        num_gpu_blocks_override=kept.get("num_gpu_blocks_override"),
        weight_transfer="file",
        sleep_mode=False,
    )


async def _load_export(engine: VLLMEngine, folder: Path) -> None:
    from safetensors.torch import load_file

    tensors: list[tuple[str, Any]] = []
    for shard in sorted(folder.glob("*.safetensors")):
        tensors += list(load_file(shard).items())
    await engine.begin_weight_update()
    await engine.update_weights(tensors)
    await engine.finish_weight_update()


async def audit(run_dir: Path) -> list[AuditRow]:
    """One row per recorded sync (see the module docstring)."""
    from rstar2.rollout.vllm_engine import VLLMEngine

    entries = _entries(run_dir)
    if not entries:
        return []
    root = run_dir / AUDIT_DIR
    rows: list[AuditRow] = []

    async def fresh(entry: dict[str, Any]) -> AuditRow:
        engine = await VLLMEngine.create(_engine_config(run_dir, root / entry["export"]))
        try:
            expected = await engine.weight_checksum()
        finally:
            await engine.aclose()
        return AuditRow(entry["step"], "fresh engine", expected, tuple(entry["checksums"]))

    first, rest = entries[0], entries[1:]
    engine = await VLLMEngine.create(_engine_config(run_dir, root / first["export"]))
    try:
        expected = await engine.weight_checksum()
        rows.append(AuditRow(first["step"], "fresh engine", expected, tuple(first["checksums"])))
        for entry in rest:
            await _load_export(engine, root / entry["export"])
            expected = await engine.weight_checksum()
            synced = tuple(entry["checksums"])
            rows.append(AuditRow(entry["step"], "loaded into the audit engine", expected, synced))
    finally:
        await engine.aclose()
    if rest:
        rows.append(await fresh(rest[-1]))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rstar2.sync.audit", description=__doc__)
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args(argv)
    try:
        _entries(args.run_dir)
    except FileNotFoundError as exc:
        print(f"rstar2.sync.audit: {exc}", file=sys.stderr)
        return 2
    rows = asyncio.run(audit(args.run_dir))
    for row in rows:
        verdict = "equal" if row.ok else "DIFFERENT"
        print(f"step {row.step}: {verdict} ({row.how}; {len(row.synced)} engine(s))")
    bad = [r for r in rows if not r.ok]
    print(f"{len(rows) - len(bad)}/{len(rows)} checks equal")
    return 1 if bad or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
