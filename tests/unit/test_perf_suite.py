"""perf's suite: figures, comparisons, the benchmark table and the README section (pure parts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perf import readme
from perf.figures import Figure, compare, paired_ratio, ratio, table, worse_by
from perf.suite import ALL, CPU_SUITE, GPU_SUITE, select

RESULTS = Path(__file__).resolve().parents[2] / "perf" / "results"


def test_worse_by_reads_the_direction():
    assert worse_by(90.0, 100.0, "higher") == pytest.approx(100 / 90 - 1)
    assert worse_by(110.0, 100.0, "lower") == pytest.approx(0.10)
    assert worse_by(110.0, 100.0, "higher") < 0 and worse_by(90.0, 100.0, "lower") < 0
    assert worse_by(0.0, 2.0, "lower") < 0 and worse_by(0.0, 2.0, "higher") == float("inf")


def test_a_planted_ten_percent_slowdown_is_flagged_and_a_rerun_is_not():
    run = [
        Figure("a.throughput", 100.0, "1/s", "higher"),
        Figure("a.p50", 2.0, "ms", "lower"),
        ratio("a.vs_python3", 6.0, 1.0, "higher"),
    ]
    slower = [
        Figure("a.throughput", 90.0, "1/s", "higher"),
        Figure("a.p50", 2.2, "ms", "lower"),
        ratio("a.vs_python3", 5.4, 1.0, "higher"),
    ]
    assert [c.figure.name for c in compare(slower, run) if c.flagged] == [f.name for f in run]
    assert not any(c.flagged for c in compare(run, run))
    slightly = [Figure("a.throughput", 97.0, "1/s", "higher")]
    assert not any(c.flagged for c in compare(slightly, run))
    lines = table(slower, compare(slower, run))
    assert all(" ! was " in line and "worse" in line for line in lines)


def test_a_paired_ratio_is_the_median_round_and_its_scatter_bounds_what_is_flagged():
    steady = paired_ratio("a.vs_python3", [6.0, 6.3, 5.7], [1.0, 1.05, 0.95], "higher")
    assert steady.value == 6.0 and steady.spread == 0.0 and steady.kind == "ratio"
    noisy = paired_ratio("a.vs_python3", [6.0, 7.2, 5.1], [1.0, 1.0, 1.0], "higher")
    assert noisy.value == 6.0 and noisy.spread == pytest.approx(0.2)
    planted = paired_ratio("a.vs_python3", [5.4, 5.67, 5.13], [1.0, 1.05, 0.95], "higher")
    (change,) = compare([planted], [steady])
    assert change.flagged and change.noise == 0.0  # 10% worse, both runs steady
    (change,) = compare([planted], [noisy])
    assert not change.flagged and change.within_noise  # 11% worse, rounds scattered 20%
    assert (
        "~ was 6," in table([planted], [change])[0]
        and "within the rounds'" in table([planted], [change])[0]
    )
    (change,) = compare([paired_ratio("a.vs_python3", [4.0], [1.0], "higher")], [noisy])
    assert change.flagged  # 50% worse: past the noise
    with pytest.raises(ValueError, match="2 values against 1"):
        paired_ratio("a.x", [1.0, 2.0], [1.0], "higher")
    assert Figure.from_json({k: v for k, v in steady.to_json().items() if k != "spread"})


def test_suites_are_explicit_and_selectable():
    names = [b.name for b in ALL]
    assert len(names) == len(set(names))
    assert all(b.gpu for b in GPU_SUITE) and not any(b.gpu for b in CPU_SUITE)
    quick = select(gpu=False, quick=True, only=None)
    assert "rollout" not in [b.name for b in quick] and len(quick) >= 5
    assert [b.name for b in select(False, False, ["roc"])] == ["roc"]
    with pytest.raises(ValueError, match="unknown benchmark"):
        select(False, False, ["nope"])
    with pytest.raises(ValueError, match="need --gpu"):
        select(False, False, ["step_cost"])
    assert [b.name for b in select(True, False, ["step_cost"])] == ["step_cost"]


@pytest.mark.parametrize(
    ("bench", "file"),
    [
        ("reward", "reward-cpu.json"),
        ("sandbox", "sandbox-cpu.json"),
        ("roc", "roc-cpu.json"),
        ("scheduler_decision", "scheduler-decision-cpu.json"),
        ("rollout_sim", "rollout-sim-655k.json"),
        ("learner", "learner-cpu.json"),
        ("rollout", "rollout-cpu.json"),
        ("learner_backends", "learner-backends-h200.json"),
        ("step_cost", "step-cost-h200.json"),
        ("weight_transfer_ipc", "weight-transfer-ipc-h200.json"),
    ],
)
def test_each_benchmark_output_gives_its_figures(bench, file):
    """The adapters read the JSON the benchmark scripts really print (committed runs)."""
    (spec,) = [b for b in ALL if b.name == bench]
    figures = spec.figures(json.loads((RESULTS / file).read_text()))
    assert figures and len({f.name for f in figures}) == len(figures)
    assert all(isinstance(f.value, float | int) and f.value == f.value for f in figures)


def test_readme_section_names_commit_and_hardware():
    run = {
        "_file": "x86_64-2c-24g-abc1234.json",
        "commit": "abc1234",
        "date": "2026-12-02",
        "gpu": False,
        "hardware": {"cpu": "x86_64", "cpu_model": "Some CPU", "cores": 2, "memory_gib": 24},
        "figures": [
            ratio("reward.cold_per_core_vs_math_verify", 2.2, 1.0, "higher").to_json(),
            Figure("reward.median_score", 0.4, "ms", "lower").to_json(),
            Figure("sandbox.http.cpu_0.2s.c64.p50", 900.0, "ms", "lower").to_json(),
        ],
    }
    text = readme.section([run])
    assert "`abc1234`" in text and "Some CPU, 2 cores" in text and "python -m perf run" in text
    assert "reward.cold_per_core_vs_math_verify" in text and "reward.median_score" in text
    assert "cpu_0.2s.c64" not in text  # not a README row
    doc = f"a\n{readme.BEGIN}\nold\n{readme.END}\nb"
    assert readme.render(doc, [run]) == f"a\n{text}\nb"


def test_readme_is_current_with_the_committed_results():
    text = readme.README.read_text()
    assert readme.render(text, readme.latest_runs()) == text, "run: python -m perf readme"


def test_rocm_smi_product_names_read_in_either_key_spelling():
    from perf.run import host_tag, rocm_smi_names

    new = {
        f"card{i}": {"Card Series": "AMD Instinct MI300X OAM", "GPU ID": "0x74a1"} for i in range(8)
    }
    old = {"card0": {"Card series": "N/A", "Card model": "0x74a1"}, "system": {"Driver": "6.8"}}
    assert rocm_smi_names(json.dumps(new)) == ["AMD Instinct MI300X OAM"] * 8
    assert rocm_smi_names(json.dumps(old)) == ["0x74a1"]
    assert rocm_smi_names("WARNING: no AMD GPUs") == []
    hw = {"gpu": "8 x AMD Instinct MI300X OAM", "cpu": "x86_64", "cores": 2, "memory_gib": 24}
    assert host_tag(hw) == "8x-amd-instinct-mi300x-oam"


def test_torch_names_the_gpus_from_a_child_process():
    """The suite's parent must not open a CUDA context (its benchmarks use the GPUs)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from perf.run import _torch_gpu_names\n"
        "names = _torch_gpu_names()\n"
        "assert isinstance(names, list)\n"
        "assert 'torch' not in sys.modules, 'torch was imported in the parent'\n"
    )
    from tests.conftest import REPO

    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_scheduler_cycle_ratios_pair_the_repeats_of_each_policy():
    """Repeat j of a policy is divided by repeat j of round robin (they replayed the same events
    back to back); a results file from before the repeats falls back to the whole replays."""
    (spec,) = [b for b in ALL if b.name == "scheduler_decision"]
    policies = {
        name: {"decision_mean_us": us, "cycle_mean_us": 10 * us, "repeat_cycles_s": cycles}
        for name, us, cycles in [
            ("round_robin", 1.0, [1.0, 2.0, 1.0]),
            ("kv_capacity", 3.0, [3.0, 6.0, 3.3]),
            ("kv_affinity", 5.0, [5.0, 10.0, 5.0]),
        ]
    }
    figures = {f.name: f for f in spec.figures({"policies": policies})}
    capacity = figures["scheduler.cycle.kv_capacity_vs_round_robin"]
    assert capacity.value == 3.0 and capacity.spread == pytest.approx(0.1)
    assert figures["scheduler.cycle.kv_affinity_vs_round_robin"].spread == 0.0
    for p in policies.values():
        del p["repeat_cycles_s"]
    old = {f.name: f for f in spec.figures({"policies": policies})}
    assert old["scheduler.cycle.kv_affinity_vs_round_robin"].value == 5.0


def test_a_failed_row_is_recorded_and_the_report_is_still_written(tmp_path):
    """`perf run --gpu` on an 80 GB H100 (perf/results/gpu-tier): the 16K-token megatron row
    ran out of memory and the report crashed on it. A row with an "error" gives no figures,
    the other rows do, and the plots and report are written."""
    from perf import report

    run = json.loads((RESULTS / "gpu-tier" / "perf-run-gpu-h100-crashed-eb0fb17.json").read_text())
    result = run["benchmarks"]["learner_backends"]["result"]
    assert "error" in result["results"]["megatron_16k"]  # the injected failure, as it came
    (spec,) = [b for b in ALL if b.name == "learner_backends"]
    names = {f.name for f in spec.figures(result)}
    assert "learner_gpu.megatron.tokens_per_s" in names
    assert not any("megatron_16k" in n for n in names)
    images = report.plots(run, tmp_path)
    assert any(p.name == "learner-tokens-per-s.png" and p.is_file() for p in images)
