"""perf.rl_step_report: the real-shape step's phases, peaks and rates from one benchmark run,
and their comparison with the plan's prediction (pure; the benchmark itself runs on a GPU)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from perf import rl_step_report
from rstar2.config_io import load_config
from tests.conftest import REPO

GIB = 2**30


def _step(t0: float) -> dict:
    spans = {
        "rollout": (t0, t0 + 20.0),
        "sleep": (t0 + 20.0, t0 + 21.0),
        "learn": (t0 + 21.0, t0 + 41.0),
        "wake_weights": (t0 + 41.0, t0 + 41.5),
        "transfer": (t0 + 41.5, t0 + 42.0),
        "release_learner": (t0 + 42.0, t0 + 42.25),
        "wake_kv": (t0 + 42.25, t0 + 43.0),
    }
    return {
        "spans": spans,
        "generated_tokens": 524288,
        "trained_tokens": 589824,
        "rollout_tokens_per_s": 26214.4,
        "learner_tokens_per_s": 29491.2,
        "sync_bytes": 3_441_149_952,
        "sync_buckets": 7,
        "transfer_gb_per_s": 6.88,
    }


class _Memory:
    """Device-wide use every 0.1 s between phase edges: 60 GiB while generating, 10 GiB asleep,
    70 GiB while learning."""

    def __init__(self) -> None:
        level = lambda t: 60 if t < 200 else 10 if t < 210 else 70  # noqa: E731
        self.samples = [(t / 10 + 0.05, level(t) * GIB) for t in range(410)]


def test_the_measured_step_is_the_last_and_each_phase_has_its_peak() -> None:
    cfg = load_config(REPO / "configs" / "perf" / "rl_step_qwen3_1p7b.yaml")
    args = argparse.Namespace(config="c.yaml", prompt_tokens=128)
    run = {"engine_start_s": 80.0, "steps": [_step(-100.0), _step(0.0)]}
    out = rl_step_report.report(cfg, args, run, _Memory(), copy_gb_per_s=1376.0)
    m = out["measured"]
    assert m["rollout_s"] == 20.0 and m["learner_s"] == 20.0
    assert m["sync_s"] == 3.0  # sleep + both wakes + transfer + the learner's release
    assert m["step_s"] == 43.0
    assert m["peak_gib"]["rollout"] == 60.0 and m["peak_gib"]["sleep"] == 10.0
    assert m["peak_gib"]["learn"] == 70.0
    assert out["warmup_step"]["peak_gib"]["rollout"] is None  # no sample that early
    assert out["batch"] == {
        "prompts": 64, "samples_per_prompt": 8, "prompt_tokens": 128, "response_tokens": 1024
    }  # fmt: skip
    assert out["transfer_over_device_copy"] == round(6.88 / 1376.0, 4)


def test_the_comparison_takes_the_plans_three_parts_and_flags_each_beyond_20_percent(
    tmp_path: Path, capsys
) -> None:
    # the plan's step adds a reward tail (here 1.22 s) that nothing measures
    plan = {"step_s": 50.0, "rollout_s": 23.62, "learner_s": 20.16, "sync_s": 5.0}
    measured = {"measured": {"rollout_s": 20.0, "learner_s": 20.0, "sync_s": 3.0, "step_s": 43.0}}
    rows = rl_step_report.compare(plan, measured)
    assert rows["step_s"]["predicted"] == 48.78  # reward tail left out: 23.62 + 20.16 + 5.0
    assert rows["rollout_s"]["within_20pct"] and rows["learner_s"]["within_20pct"]
    assert not rows["sync_s"]["within_20pct"]  # 3.0 / 5.0
    assert rows["step_s"]["measured_over_predicted"] == round(43.0 / 48.78, 3)
    (tmp_path / "plan.json").write_text(json.dumps({"prediction": plan}))
    (tmp_path / "m.json").write_text(json.dumps(measured))
    code = rl_step_report.main(
        ["--plan", str(tmp_path / "plan.json"), "--measured", str(tmp_path / "m.json")]
    )
    assert code == 0  # the step is within 20%
    assert "sync_s" in capsys.readouterr().out
