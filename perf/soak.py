"""Soak: the toy loop under random faults for N minutes, and what it lost (issue #21).

    python -m perf.soak --minutes 30 [--fault-every-s 60] [--seed 0] [--out runs/soak]

Runs ``rstar2 train`` on the toy recipe (configs/toy/cpu.yaml with two engines, a checkpoint every
2 steps, every step's rollouts saved, no evaluation) and, once a step has been logged, injects one
fault at random every ~``--fault-every-s`` seconds with real signals (tests/faults.py's kinds):

- ``engine``: SIGKILL one engine-core process (its turns move, the engine restarts at the sync);
- ``sandbox``: SIGKILL the sandbox's zygote or one of its children (the pool replaces it);
- ``trainer_kill``: SIGKILL the trainer's process group, then ``rstar2 train --resume``;
- ``trainer_term``: SIGTERM the trainer, or its whole process group (as Slurm and systemd
  stop it), at random (checkpoint, exit 143), then ``--resume``.

A fault is survived when the run logs a new step within ``--survive-s`` of it; the next fault
waits for that. At the end the run is stopped with SIGTERM and the saved rollouts are read: every
logged step must hold all its trajectories once each (lost: must be 0) and no tool call may have
been answered ``internal_error`` (a call lost to a fault; must be 0). Memory: the proportional
set size of the trainer's process tree (trainer, engines, sandbox, reward host), sampled every
5 s; growth is the longest-lived trainer's last minute against its second (the first is
warm-up), in all and per kind of process (``pss_growth_by_kind_mib``: the trainer, vLLM's
model-executor workers and engine cores, the sandbox, the reward host, other). The clock starts
at the first logged step (after SFT and start-up). Prints a table, then one JSON line; writes
``soak.json`` to the output folder. Third-party output goes to ``train-N.log`` files there; a
trainer that hangs is asked for its stacks first (SIGUSR2, see rstar2.trainer.dump:
``run/logs/stacks-*.txt``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from perf.process_tree import KIND_ORDER, cmdline, name, pss_by_kind, tree

REPO = Path(__file__).resolve().parents[1]
KINDS = ("engine", "sandbox", "trainer_kill", "trainer_term")
WEIGHTS = (3, 3, 2, 2)  # trainer faults a little rarer: a trainer must live long enough to
# show its memory growth
TOY = REPO / "configs" / "toy" / "cpu.yaml"


@dataclass
class Incarnation:
    """One ``rstar2 train`` process and what was sampled of it."""

    proc: subprocess.Popen[bytes]
    started_s: float
    pss: list[tuple[float, float]] = field(default_factory=list)  # (time, MiB) after a step
    by_kind: list[dict[str, float]] = field(default_factory=list)  # each sample's split (MiB)

    def sample(self) -> None:
        kinds = pss_by_kind(self.proc.pid)
        self.pss.append((time.monotonic(), sum(kinds.values())))
        self.by_kind.append(kinds)


def _config(out: Path, data: Path) -> Path:
    cfg = yaml.safe_load(TOY.read_text())
    cfg["name"] = "soak"
    cfg["model"]["path"] = str(REPO / cfg["model"]["path"])
    cfg["data"]["train_datasets"] = [str(data / "train.jsonl")]
    cfg["data"]["eval_datasets"] = []
    cfg["sft"]["data"] = [str(data / "sft.jsonl")]
    cfg["rollout"]["num_engines"] = 2
    cfg["stages"] = [{**cfg["stages"][0], "num_steps": 100_000}]
    cfg["checkpoint"] = {"every_steps": 2, "keep_last": 2}
    path = out / "soak.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _step_lines(run_dir: Path) -> set[str]:
    try:
        text = (run_dir / "metrics.jsonl").read_text()
    except OSError:
        return set()
    return {x for x in text.splitlines() if '"reward_mean"' in x}


def _victims(pid: int, kind: str) -> list[Any]:
    if kind == "engine":
        return [p for p in tree(pid) if "EngineCore" in name(p)]
    return [p for p in tree(pid) if "sandbox_pool.zygote" in cmdline(p)]


def count_losses(rollouts: Path, steps: list[int], per_step: int) -> dict[str, int]:
    """What the saved rollouts of the logged ``steps`` say was lost: trajectories missing
    from a step (of ``per_step``) or there twice, and tool calls answered ``internal_error``
    (the sandbox gave up on them) out of all tool calls."""
    found = lost = duplicated = calls = lost_calls = 0
    for step in steps:
        path = rollouts / f"step_{step:06d}.jsonl"
        rows = [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []
        keys = [(r["group"], r["sample"]) for r in rows]
        found += len(set(keys))
        duplicated += len(keys) - len(set(keys))
        lost += per_step - len(set(keys))
        for r in rows:
            for _, response in r["trajectory"]["tool_calls"]:
                calls += 1
                lost_calls += "reason: internal_error" in response
    return {
        "trajectories": found,
        "trajectories_lost": lost,
        "trajectories_duplicated": duplicated,
        "tool_calls": calls,
        "tool_calls_lost": lost_calls,
    }


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.out: Path = args.out.resolve()
        self.run_dir = self.out / "run"
        self.rollouts = self.out / "rollouts"
        self.injected: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.survived: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.events: list[dict[str, Any]] = []
        self.stops: list[dict[str, Any]] = []  # every SIGTERM: see stop()
        self.lives: list[Incarnation] = []

    def start(self, resume: bool) -> Incarnation:
        n = len(self.lives)
        where = ["--resume", str(self.run_dir)] if resume else ["--config", str(self.config)]
        cmd = [sys.executable, "-m", "rstar2.cli", "train", *where, "--quiet"]
        cmd += ["--save-rollouts", str(self.rollouts)]
        if not resume:
            cmd += ["--run-dir", str(self.run_dir)]
        with (self.out / f"train-{n}.log").open("wb") as log:
            proc = subprocess.Popen(
                cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        life = Incarnation(proc, time.monotonic())
        self.lives.append(life)
        return life

    def wait_for_step(self, life: Incarnation, before: set[str], timeout_s: float) -> bool:
        """Until a step line not in ``before`` is logged (True), the trainer exits or
        ``timeout_s`` passes (False); samples memory meanwhile."""
        deadline = time.monotonic() + timeout_s
        next_sample = 0.0
        while time.monotonic() < deadline and life.proc.poll() is None:
            if _step_lines(self.run_dir) - before:
                return True
            if time.monotonic() >= next_sample and _step_lines(self.run_dir):
                life.sample()
                next_sample = time.monotonic() + 5
            time.sleep(0.5)
        return bool(_step_lines(self.run_dir) - before)

    def idle(self, life: Incarnation, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and life.proc.poll() is None:
            life.sample()
            time.sleep(min(5.0, max(0.0, end - time.monotonic())))

    def inject(self, life: Incarnation, kind: str) -> Incarnation | None:
        """The fault; returns the incarnation that goes on (a new one after a trainer fault),
        or None when it could not be injected (no victim of that kind right now)."""
        pid = life.proc.pid
        if kind in ("engine", "sandbox"):
            victims = _victims(pid, kind)
            if not victims:
                return None
            self.rng.choice(victims).kill()
            return life
        if kind == "trainer_kill":
            os.killpg(pid, signal.SIGKILL)
            life.proc.wait()
        else:
            self.stops.append(self.stop(life))
        _kill_group(pid)  # what a killed trainer left behind, as an operator's cleanup would
        return self.start(resume=True)

    def stop(self, life: Incarnation) -> dict[str, Any]:
        """SIGTERM the trainer, alone (``kill``, the launcher) or with its process group
        (Slurm's scancel, systemd: engine cores, zygotes and the reward host too), at random;
        how it ended: a clean stop exits 143 (checkpoint written)."""
        group = self.rng.random() < 0.5
        start = time.monotonic()
        if group:
            os.killpg(life.proc.pid, signal.SIGTERM)
        else:
            life.proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = life.proc.wait(timeout=self.args.survive_s)
        except subprocess.TimeoutExpired:
            code = None
            _dump_stacks(life.proc.pid)
        finally:
            _kill_group(life.proc.pid)
        seconds = round(time.monotonic() - start, 1)
        return {"group": group, "exit_code": code, "seconds": seconds}

    def run(self) -> dict[str, Any]:
        self.out.mkdir(parents=True, exist_ok=True)
        data = REPO / "runs" / "toy-data"
        if not (data / "sft.jsonl").is_file():
            subprocess.run(
                [sys.executable, "-m", "rstar2.cli", "data", "toy", "--out", str(data)],
                cwd=REPO,
                check=True,
                stdout=subprocess.DEVNULL,
            )
        self.config = _config(self.out, data)
        life = self.start(resume=False)
        print(f"soak: {self.args.minutes} min of faults, logs in {self.out}", flush=True)
        if not self.wait_for_step(life, set(), 1800):  # SFT and start-up first
            raise SystemExit(f"soak: the run logged no step; see {self.out}/train-0.log")
        began = time.monotonic()  # the clock starts at the first step (after SFT and start-up)
        end = began + 60 * self.args.minutes
        failed = None
        while time.monotonic() < end:
            self.idle(
                life,
                min(end - time.monotonic(), self.rng.uniform(0.5, 1.5) * self.args.fault_every_s),
            )
            if time.monotonic() >= end:
                break
            if life.proc.poll() is not None:
                failed = f"the trainer exited {life.proc.returncode} without a fault"
                break
            (kind,) = self.rng.choices(KINDS, WEIGHTS)
            before = _step_lines(self.run_dir)
            at = time.monotonic()
            going_on = self.inject(life, kind)
            if going_on is None:
                continue
            if going_on is not life:  # survived means the resumed trainer logs a step: not
                before = _step_lines(self.run_dir)  # one the stopped trainer finished first
            life = going_on
            self.injected[kind] += 1
            ok = self.wait_for_step(life, before, self.args.survive_s)
            if kind == "trainer_term":  # and the stop itself was clean
                ok = ok and self.stops[-1]["exit_code"] == 143
            self.survived[kind] += ok
            event = {
                "at_s": round(at - began, 1),
                "kind": kind,
                "survived": ok,
                "next_step_after_s": round(time.monotonic() - at, 1),
            }
            self.events.append(event)
            print(
                f"  {event['at_s']:>7.1f} s  {kind:<13} "
                f"{'survived' if ok else 'NOT SURVIVED'} ({event['next_step_after_s']} s)",
                flush=True,
            )
            if not ok:
                _dump_stacks(life.proc.pid)
                failed = f"{kind} at {event['at_s']} s: no step logged after it"
                break
        wall_s = time.monotonic() - began
        last = self.stop(life)
        self.stops.append(last)
        if last["exit_code"] != 143:
            failed = failed or f"the last SIGTERM did not stop the trainer cleanly: {last}"
        return self.report(wall_s, failed)

    def report(self, wall_s: float, failed: str | None) -> dict[str, Any]:
        cfg = yaml.safe_load(self.config.read_text())
        per_step = (
            cfg["data"]["rollout_batch_num_prompts"] * cfg["rollout"]["num_samples_per_prompt"]
        )
        steps = sorted(json.loads(x)["step"] for x in _step_lines(self.run_dir))
        losses = count_losses(self.rollouts, steps, per_step)
        longest = max(self.lives, key=lambda life: len(life.pss))
        samples = [mib for _, mib in longest.pss]
        # a minute each at one sample per 5 s; the first minute (warm-up) is left out
        growth, growth_by_kind = None, None
        if len(samples) >= 36:
            growth = _growth(samples)
            growth_by_kind = {k: _growth([s[k] for s in longest.by_kind]) for k in KIND_ORDER}
        result = {
            "benchmark": "soak",
            "minutes": round(wall_s / 60, 1),
            "faults_injected": dict(self.injected),
            "faults_survived": dict(self.survived),
            "trainer_starts": len(self.lives),
            "steps_logged": len(steps),
            **losses,
            "pss_peak_mib": round(max(mib for life in self.lives for _, mib in life.pss), 1),
            "pss_growth_mib": growth,  # None: no trainer lived 3 minutes
            # the same windows per kind of process (medians: they need not sum to the total)
            "pss_growth_by_kind_mib": growth_by_kind,
            "pss_growth_over_min": round((longest.pss[-1][0] - longest.pss[0][0]) / 60 - 1, 1),
            # every SIGTERM: to the trainer alone or its group, exit code, seconds to exit
            "sigterm_stops": self.stops,
            "failed": failed,
            "events": self.events,
        }
        (self.out / "soak.json").write_text(json.dumps(result, indent=1) + "\n")
        width = 26
        print(f"{'faults injected':<{width}}{sum(self.injected.values()):>8}  {self.injected}")
        print(f"{'faults survived':<{width}}{sum(self.survived.values()):>8}  {self.survived}")
        for key in (
            "trainer_starts",
            "steps_logged",
            "trajectories",
            "trajectories_lost",
            "trajectories_duplicated",
            "tool_calls",
            "tool_calls_lost",
            "pss_peak_mib",
            "pss_growth_mib",
            "pss_growth_over_min",
        ):
            print(f"{key:<{width}}{result[key]!s:>8}")
        if growth_by_kind is not None:
            split = ", ".join(f"{k} {round(v):+d}" for k, v in growth_by_kind.items())
            print(f"{'pss_growth by process':<{width}}  {split}")
        for stop in self.stops:
            who = "process group" if stop["group"] else "trainer"
            ended = f"exit {stop['exit_code']} in {stop['seconds']} s"
            print(f"{'SIGTERM to the ' + who:<{width}}  {ended}")
        if failed:
            print(f"FAILED: {failed}")
        print(json.dumps({k: v for k, v in result.items() if k != "events"}))
        return result


def _growth(samples: list[float]) -> float:
    """The last minute's median against the second's (one sample per 5 s), in MiB."""
    return round(statistics.median(samples[-12:]) - statistics.median(samples[12:24]), 1)


def _dump_stacks(pid: int) -> None:
    """Ask a stuck trainer what it waits on (SIGUSR2: logs/stacks-*.txt in its run folder)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGUSR2)
        time.sleep(2)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m perf.soak", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--minutes", type=float, required=True, help="how long to inject faults")
    parser.add_argument("--fault-every-s", type=float, default=60.0, help="mean fault interval")
    parser.add_argument(
        "--survive-s",
        type=float,
        default=300.0,
        help="a fault not followed by a logged step within this is not survived",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "soak")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.fault_every_s <= 0:
        parser.error("--minutes and --fault-every-s must be positive")
    if args.out.exists() and any(args.out.iterdir()):
        parser.error(f"--out {args.out} is not empty: give a new folder")
    result = Soak(args).run()
    clean = not result["failed"] and result["trajectories_lost"] == 0
    clean = clean and result["tool_calls_lost"] == 0 and result["trajectories_duplicated"] == 0
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
