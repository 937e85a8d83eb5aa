"""scheduler.trace, .sim, .sim_engine and .bound: trace files, the engine model, the bound, and
the simulator's CLI."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from perf import clairvoyant
from scheduler.bound import makespan_lower_bound
from scheduler.core import ADMISSION_POLICIES, POLICIES, SchedulerSettings
from scheduler.sim import simulate
from scheduler.sim_model import SimSettings, StepCostModel
from scheduler.trace import (
    TraceError,
    TraceRow,
    TraceTurn,
    load_trace,
    paper_like,
    skewed,
    write_trace,
)

REPO = Path(__file__).resolve().parents[2]


def test_paper_like_trace_follows_its_spec_and_round_trips(tmp_path: Path) -> None:
    rows = paper_like(num_prompts=40, samples_per_prompt=4, seed=3)
    assert len(rows) == 160 and len({r.id for r in rows}) == 160
    for row in rows:
        assert 1 <= len(row.turns) <= 10
        assert all(t.tool_latency_s is not None for t in row.turns[:-1])
        assert row.turns[-1].tool_latency_s is None
        assert 1000 <= row.response_tokens <= 12_288
    lengths = sorted(r.response_tokens for r in rows)
    assert lengths[-1] > 2 * lengths[len(lengths) // 2]  # a long tail
    path = tmp_path / "trace.jsonl"
    write_trace(rows, path)
    assert load_trace(path) == rows
    assert paper_like(num_prompts=40, samples_per_prompt=4, seed=3) == rows  # seeded


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{", "trace.jsonl:2"),
        ('{"id": "b", "prompt_tokens": 5, "turns": []}', "non-empty"),
        ('{"id": "b", "prompt_tokens": 5, "turns": [{"gen_tokens": 0}]}', "gen_tokens"),
        (
            '{"id": "b", "prompt_tokens": 5, "turns": [{"gen_tokens": 3}, {"gen_tokens": 3}]}',
            "only the last turn",
        ),
        ('{"id": "a", "prompt_tokens": 5, "turns": [{"gen_tokens": 3}]}', "duplicate id"),
    ],
)
def test_bad_trace_lines_are_named(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "trace.jsonl"
    good = '{"id": "a", "prompt_tokens": 5, "turns": [{"gen_tokens": 3, "tool_latency_s": null}]}'
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(TraceError, match=message):
        load_trace(path)


def _tight() -> tuple[list[TraceRow], SimSettings]:
    rows = paper_like(num_prompts=24, samples_per_prompt=8, seed=1, max_response_tokens=6144)
    return rows, SimSettings(num_engines=2, kv_tokens=65_536, max_response_tokens=6144)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_trajectory_finishes_and_every_token_is_generated(policy) -> None:
    rows, settings = _tight()
    res = simulate(rows, settings, SchedulerSettings(policy=policy, block_size_tokens=16))
    assert res.generated_tokens == sum(r.response_tokens for r in rows)
    assert res.makespan_s > 0 and 0 < res.busy_fraction <= 1.0
    assert res.p50_latency_s <= res.p99_latency_s <= res.makespan_s
    assert res.engine_max_used_fraction <= 1.0
    if policy in ADMISSION_POLICIES:
        assert res.preemptions == 0


@pytest.mark.parametrize("kv_tokens", [65_536, 200_000])
def test_no_policy_beats_the_lower_bound(kv_tokens: int) -> None:
    rows, settings = _tight()
    settings = replace(settings, kv_tokens=kv_tokens)
    bound = makespan_lower_bound(rows, settings)
    assert bound.work_s > 0 and bound.critical_path_s > 0
    for policy in POLICIES:
        res = simulate(rows, settings, SchedulerSettings(policy=policy, block_size_tokens=16))
        assert bound.makespan_s <= res.makespan_s, policy
    # the best policy lands within 2x of it here: the bound is not vacuous
    best = min(simulate(rows, settings, SchedulerSettings(policy=p)).makespan_s for p in POLICIES)
    assert best < 2 * bound.makespan_s


def test_overcommitted_engines_preempt_and_recompute() -> None:
    rows, settings = _tight()
    res = simulate(rows, settings, SchedulerSettings(policy="round_robin"))
    assert res.preemptions > 0
    assert res.recomputed_after_preemption > 0 and res.recomputed_after_move > 0
    assert res.recomputed_tokens == (
        res.recomputed_after_preemption + res.recomputed_after_move + res.recomputed_after_eviction
    )


@pytest.mark.parametrize("per_decode_token_s", [None, 1.5e-5])
def test_one_trajectory_alone_costs_what_the_step_model_says(per_decode_token_s) -> None:
    """Prefill of the prompt, then one step per token; tool latency in between. Decode tokens
    cost per_decode_token_s when it is set, prefill tokens per_token_s."""
    row = TraceRow("a", 100, (TraceTurn(10, 0.5, 20), TraceTurn(5, None)))
    c = StepCostModel(per_decode_token_s=per_decode_token_s)
    s = SimSettings(num_engines=1, kv_tokens=10_000, cost=c)
    res = simulate([row], s, SchedulerSettings(policy="sticky"))
    decode = c.per_token_s if per_decode_token_s is None else per_decode_token_s
    turn1 = c.per_token_s * 100 + sum(
        c.step_base_s + decode + c.per_kv_token_s * (100 + i) for i in range(10)
    )
    turn2 = c.per_token_s * 20 + sum(
        c.step_base_s + decode + c.per_kv_token_s * (130 + i) for i in range(5)
    )
    assert res.makespan_s == pytest.approx(turn1 + 0.5 + turn2, rel=1e-9)
    assert res.recomputed_tokens == 0  # the second turn hits its cached prefix
    # alone on its engine it runs its critical path: the lower bound is exact
    assert makespan_lower_bound([row], s).makespan_s == pytest.approx(res.makespan_s, rel=1e-9)


@pytest.mark.parametrize(
    ("host_s", "overlap"), [(0.0, 0.0), (0.004, 0.0), (0.004, 0.6), (0.004, 1.0)]
)
def test_each_step_pays_the_host_time_its_gpu_work_does_not_hide(host_s, overlap) -> None:
    """A step of GPU time g takes g + host_s - overlap x min(g, host_s): here the KV read makes
    the first turn's steps cross host_s after six steps. The bound stays below the run (exact
    when nothing is hidden)."""
    row = TraceRow("a", 100, (TraceTurn(10, 0.5, 20), TraceTurn(5, None)))
    c = StepCostModel(step_base_s=0.001, per_kv_token_s=2.8e-5, host_s=host_s, host_overlap=overlap)
    s = SimSettings(num_engines=1, kv_tokens=10_000, cost=c)
    res = simulate([row], s, SchedulerSettings(policy="sticky"))
    gpu = [c.step_base_s + c.decode_token_s + c.per_kv_token_s * ctx for ctx in range(100, 110)]
    assert gpu[5] < 0.004 < gpu[6]
    turn1 = c.per_token_s * 100 + sum(c.step_s(g) for g in gpu)
    turn2 = c.per_token_s * 20 + sum(
        c.step_s(c.step_base_s + c.decode_token_s + c.per_kv_token_s * ctx)
        for ctx in range(130, 135)
    )
    assert res.makespan_s == pytest.approx(turn1 + 0.5 + turn2, rel=1e-9)
    bound = makespan_lower_bound([row], s).makespan_s
    assert bound <= res.makespan_s * (1 + 1e-12)
    if overlap == 0.0:
        assert bound == pytest.approx(res.makespan_s, rel=1e-9)


def test_a_run_of_steps_costs_the_sum_of_its_steps() -> None:
    """StepCostModel.steps_s (the simulator's closed form for a run) against its steps one by
    one, on both sides of the host time and across it."""
    rng = random.Random(0)
    for _ in range(300):
        host = rng.choice([0.0, rng.uniform(0.0, 0.01)])
        c = StepCostModel(host_s=host, host_overlap=rng.choice([0.0, 1.0, rng.random()]))
        first, k = rng.uniform(0.0, 0.01), rng.randint(0, 3000)
        growth = rng.choice([0.0, rng.uniform(0.0, 1e-5)])
        want = math.fsum(c.step_s(first + growth * i) for i in range(k))
        assert c.steps_s(first, growth, k) == pytest.approx(want, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("policy", POLICIES)
def test_hidden_host_time_keeps_every_token_and_the_bound(policy) -> None:
    """With host time partly hidden (runs cut by arrivals mid-run included): every token is
    generated and no policy beats the bound."""
    rows, settings = _tight()
    sched = SchedulerSettings(policy=policy, block_size_tokens=16)
    for overlap in (0.0, 0.5, 1.0):
        cost = replace(settings.cost, host_s=0.006, host_overlap=overlap)
        s = replace(settings, cost=cost)
        res = simulate(rows, s, sched)
        assert res.generated_tokens == sum(r.response_tokens for r in rows)
        assert makespan_lower_bound(rows, s).makespan_s <= res.makespan_s


def test_recorded_runs_repriced_are_the_rollout_when_the_engine_never_idles() -> None:
    """Fixed-length trajectories all sent at once (perf.rl_step_gpu's step): the engine's
    recorded runs, re-priced at another host time and overlap, give that simulation's rollout
    (what perf.rl_step_fit searches over instead of simulating again)."""
    rows = [TraceRow(f"t{i}", 128, (TraceTurn(300, None),)) for i in range(40)]
    base = SimSettings(num_engines=1, kv_tokens=8_000, max_num_seqs=16, record_runs=True)
    res = simulate(rows, base, SchedulerSettings(policy="round_robin"))
    (runs,) = res.engine_runs
    assert sum(r.steps for r in runs) == res.steps
    for host, overlap in [(0.0, 0.0), (0.004, 0.3), (0.02, 0.9)]:
        cost = replace(base.cost, host_s=host, host_overlap=overlap)
        again = simulate(rows, replace(base, cost=cost), SchedulerSettings(policy="round_robin"))
        assert sum(r.time_s(cost) for r in runs) == pytest.approx(again.makespan_s, rel=1e-9)
    assert "engine_runs" not in res.as_dict()


def test_cli_prints_a_table_then_one_json_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write_trace(paper_like(num_prompts=6, samples_per_prompt=4), path)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "perf.rollout_sim",
            "--trace",
            str(path),
            "--engines",
            "2",
            "--kv-tokens",
            "60000",
            "--policy",
            "all",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    out = json.loads(lines[-1])
    assert set(out["policies"]) == set(POLICIES)
    for row in out["policies"].values():
        for key in (
            "makespan_s",
            "busy_fraction",
            "preemptions",
            "recomputed_tokens",
            "generated_tokens",
            "p50_latency_s",
            "p99_latency_s",
        ):
            assert key in row
    assert any(line.startswith("kv_affinity") for line in lines[:-1])
    assert any(line.startswith("lower bound") for line in lines[:-1])
    assert all(out["makespan_vs_lower_bound"][p] >= 1.0 for p in POLICIES)


def test_cli_compute_rate_scales_the_step_cost(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write_trace(paper_like(num_prompts=4, samples_per_prompt=4), path)
    base = ["--trace", str(path), "--engines", "2", "--policy", "round_robin"]
    makespans = {}
    for rate in ("21000", "7000"):
        proc = subprocess.run(
            [sys.executable, "-m", "perf.rollout_sim", *base, "--prefill-tokens-per-s", rate],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out["prefill_tokens_per_s"] == float(rate)
        makespans[rate] = out["policies"]["round_robin"]["makespan_s"]
    # a third of the compute rate: every step's per-token part takes three times as long (the
    # fixed per-step cost and the tool latency do not change, so the makespan grows less)
    assert makespans["7000"] > makespans["21000"]


def test_cli_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("not json\n")
    proc = subprocess.run(
        [sys.executable, "-m", "perf.rollout_sim", "--trace", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "bad.jsonl:1" in proc.stderr


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=180
    )


def test_measured_step_cost_drives_the_simulator(tmp_path: Path) -> None:
    """perf.step_cost times the tiny decoder's kernels on this CPU; perf.rollout_sim --cost
    replays a trace with exactly those constants."""
    cost_file = tmp_path / "cost.json"
    proc = _run(
        "perf.step_cost",
        "--device",
        "cpu",
        "--shape",
        "tiny",
        "--prefill-tokens",
        "64",
        "--repeats",
        "1",
        "--out",
        str(cost_file),
    )
    assert proc.returncode == 0, proc.stderr
    measured = json.loads(cost_file.read_text())
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == measured
    keys = {"step_base_s", "per_token_s", "per_decode_token_s", "per_kv_token_s"}
    assert set(measured["cost"]) == keys and all(v > 0 for v in measured["cost"].values())
    trace = tmp_path / "t.jsonl"
    write_trace(paper_like(num_prompts=3, samples_per_prompt=2), trace)
    proc = _run(
        "perf.rollout_sim",
        "--trace",
        str(trace),
        "--policy",
        "kv_affinity",
        "--cost",
        str(cost_file),
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {k: out["cost"][k] for k in keys} == measured["cost"]
    assert out["prefill_tokens_per_s"] == pytest.approx(1 / measured["cost"]["per_token_s"], 1e-3)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1, 2]", "expected a JSON object"),
        ('{"cost": {"step_base_s": 0.01, "per_token_s": 1e-5}}', "per_kv_token_s"),
        ('{"step_base_s": 0.01, "per_token_s": 0, "per_kv_token_s": 1e-8}', "per_token_s must"),
        # Python's json reads these; a NaN price would make every comparison in the model false
        ('{"step_base_s": NaN, "per_token_s": 1e-5, "per_kv_token_s": 1e-8}', "step_base_s must"),
        ('{"step_base_s": 0.01, "per_token_s": Infinity, "per_kv_token_s": 1e-8}', "per_token_s"),
        ("{", "cost.json"),
    ],
)
def test_bad_cost_file_is_one_line_exit_2(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "cost.json"
    path.write_text(content)
    proc = _run("perf.rollout_sim", "--prompts", "2", "--samples", "2", "--cost", str(path))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and message in proc.stderr


def test_eviction_takes_the_tail_of_the_least_recent_prefix_first() -> None:
    """As vLLM v1 frees a request's blocks tail first: while A waits on its tool, B's growth
    evicts only the 150 tokens of A's prefix it needs; A's next turn recomputes just those."""
    a = TraceRow("a", 300, (TraceTurn(50, 5.0, 10), TraceTurn(10, None)))
    b = TraceRow("b", 200, (TraceTurn(600, None),))
    s = SimSettings(num_engines=1, kv_tokens=1000)
    res = simulate([a, b], s, SchedulerSettings(policy="sticky"))
    assert res.preemptions == 0
    assert res.recomputed_tokens == res.recomputed_after_eviction == 150


def test_skewed_trace_puts_its_share_of_the_work_in_few_short_trajectories() -> None:
    rows = skewed(num_prompts=64, samples_per_prompt=16, seed=5)
    assert len(rows) == 1024 and len({r.id for r in rows}) == 1024
    assert all(1 <= len(r.turns) <= 2 for r in rows)
    assert all(r.response_tokens <= 12_288 for r in rows)
    lengths = sorted((r.response_tokens for r in rows), reverse=True)
    top = sum(lengths[: len(lengths) // 20]) / sum(lengths)
    assert 0.27 <= top <= 0.33  # 5% of the trajectories carry ~30% of the tokens
    assert skewed(num_prompts=64, samples_per_prompt=16, seed=5) == rows  # seeded
    with pytest.raises(ValueError, match="long_fraction"):
        skewed(long_fraction=1.5)


def test_a_paged_engine_hits_whole_blocks_and_never_the_last_token() -> None:
    """vLLM caches whole blocks and always computes a prompt's last token: after a 150-token
    first turn, the second (context 160) hits 144 tokens with 16-token blocks and recomputes 6
    it had computed; token-exact KV recomputes none."""
    row = TraceRow("a", 100, (TraceTurn(50, 0.1, 10), TraceTurn(10, None)))
    exact = SimSettings(num_engines=1, kv_tokens=4096)
    paged = replace(exact, block_size_tokens=16)
    sticky = SchedulerSettings(policy="sticky")
    assert simulate([row], exact, sticky).recomputed_tokens == 0
    assert simulate([row], paged, sticky).recomputed_tokens == 150 - 144


def test_a_paged_engine_counts_each_request_in_whole_blocks() -> None:
    """Two 120-token prompts that generate 20 tokens each: 280 tokens fit 320 of token-exact KV;
    in 64-token blocks each needs 3 blocks by its end, 6 of the 5 there are, so one request is
    preempted (and still finishes)."""
    rows = [TraceRow(f"r{i}", 120, (TraceTurn(20, None),)) for i in range(2)]
    base = SimSettings(num_engines=1, kv_tokens=320, max_response_tokens=100)
    rr = SchedulerSettings(policy="round_robin")
    exact = simulate(rows, base, rr)
    paged = simulate(rows, replace(base, block_size_tokens=64), rr)
    assert exact.preemptions == 0 and exact.engine_max_used_fraction > 0.85
    assert paged.preemptions >= 1 and paged.generated_tokens == 40


def test_front_load_moves_the_longest_forward_and_keeps_every_row() -> None:
    rows = paper_like(num_prompts=10, samples_per_prompt=10)
    order = clairvoyant.front_load(rows, longest=0.1, within=0.3)
    assert sorted(r.id for r in order) == sorted(r.id for r in rows)
    chosen = {r.id for r in sorted(rows, key=lambda r: -r.response_tokens)[:10]}
    others = [r.id for r in rows if r.id not in chosen]
    assert {r.id for r in order[:30]} == chosen | set(others[:20])  # the head: moved + first
    assert [r.id for r in order[30:]] == others[20:]  # the rest keep their order
    assert not chosen <= {r.id for r in order[:10]}  # spread over the head, not first
    tiny = rows[:5]  # 0.1 of 5 rounds to none: the longest one is moved all the same
    longest = max(tiny, key=lambda r: r.response_tokens).id
    assert longest in {r.id for r in clairvoyant.front_load(tiny, longest=0.1, within=0.2)[:1]}
    with pytest.raises(ValueError, match="longest < within"):
        clairvoyant.front_load(rows, longest=0.3, within=0.3)


def test_clairvoyant_reference_never_beats_the_bound(tmp_path: Path, capsys) -> None:
    trace = tmp_path / "t.jsonl"
    write_trace(paper_like(num_prompts=6, samples_per_prompt=8), trace)
    assert clairvoyant.main(["--trace", str(trace), "--quick"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    cases = out["traces"][str(trace)]["cases"]
    assert set(cases) == {"640K", "256K", "h200"}
    for points in cases.values():
        assert [p["order"] for p in points[:2]] == ["own", "longest_first"]
        assert len(points) == 2 + len(clairvoyant.QUICK_GRID)
        assert all(p["makespan_vs_bound"] >= 1.0 for p in points)
    huge = tmp_path / "huge.jsonl"  # a prompt no engine's KV holds: the scheduler refuses it
    write_trace([TraceRow("a", 700_000, (TraceTurn(8, None),))], huge)
    for bad in (tmp_path / "missing.jsonl", huge):
        assert clairvoyant.main(["--trace", str(bad), "--quick"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("perf.clairvoyant: ")


def test_clairvoyant_refuses_a_row_one_case_cannot_hold_before_simulating_any(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    # 640K engines hold a 300K prompt, 256K ones do not: the run stops before the 640K replays
    trace = tmp_path / "t.jsonl"
    write_trace(
        [
            *paper_like(num_prompts=2, samples_per_prompt=2),
            TraceRow("big", 300_000, (TraceTurn(8, None),)),
        ],
        trace,
    )
    replays: list[int] = []
    monkeypatch.setattr(clairvoyant, "simulate", lambda *a: replays.append(1))
    assert clairvoyant.main(["--trace", str(trace), "--quick"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'big' needs" in err[0] and "262144" in err[0]
    assert replays == []


def _ends(c: StepCostModel, prompt: int, tokens: int) -> list[float]:
    """When each step of a request decoding alone after ``prompt`` tokens ends."""
    out, t = [], c.per_token_s * prompt
    for i in range(tokens):
        t += c.step_base_s + c.decode_token_s + c.per_kv_token_s * (prompt + i)
        out.append(t)
    return out


@pytest.mark.parametrize("policy", ["kv_affinity", "sticky"])
def test_the_tail_starts_when_an_engine_admits_the_last_trajectory(policy: str) -> None:
    """One engine running one request at a time: b starts when a ends (kv_affinity holds it,
    sticky hands it to the engine, whose queue holds it), so from then on one trajectory is live
    and only b's 5 steps remain."""
    a, b = TraceRow("a", 100, (TraceTurn(10, None),)), TraceRow("b", 50, (TraceTurn(5, None),))
    c = StepCostModel()
    s = SimSettings(num_engines=1, kv_tokens=20_000, max_num_seqs=1, cost=c)
    res = simulate([a, b], s, SchedulerSettings(policy=policy))
    assert res.queue_empty_s == pytest.approx(_ends(c, 100, 10)[-1], rel=1e-9)
    assert (res.live_at_queue_empty, res.steps, res.steps_after_queue_empty) == (1, 15, 5)


def test_the_tail_counts_the_steps_another_engine_has_left_in_its_run() -> None:
    """Two engines, one request each at a time: c starts on b's engine when b ends, while a is
    mid-run on the other; the steps after are c's 5 and what a had left then."""
    a = TraceRow("a", 100, (TraceTurn(200, None),))
    b = TraceRow("b", 50, (TraceTurn(10, None),))
    c_row = TraceRow("c", 50, (TraceTurn(5, None),))
    c = StepCostModel()
    s = SimSettings(num_engines=2, kv_tokens=20_000, max_num_seqs=1, cost=c)
    res = simulate([a, b, c_row], s, SchedulerSettings(policy="kv_affinity", split_turns=False))
    b_end = _ends(c, 50, 10)[-1]
    a_done = sum(end <= b_end for end in _ends(c, 100, 200))
    assert 0 < a_done < 200  # the tail starts inside a's run
    assert res.queue_empty_s == pytest.approx(b_end, rel=1e-9)
    assert res.live_at_queue_empty == 2 and res.steps == 215
    assert res.steps_after_queue_empty == 5 + 200 - a_done


@pytest.mark.parametrize("tokens", [1, 3, 8, 16, 120])
def test_the_tail_counts_a_run_that_ends_at_the_same_moment_as_whole(tokens: int) -> None:
    """Two engines run a and b alike, so their runs end at the same instant; c starts on the
    engine whose end is handled first, while the other's end event is still queued. That run
    is over by then: only c's 5 steps come after."""
    a = TraceRow("a", 100, (TraceTurn(tokens, None),))
    b = TraceRow("b", 100, (TraceTurn(tokens, None),))
    c_row = TraceRow("c", 50, (TraceTurn(5, None),))
    s = SimSettings(num_engines=2, kv_tokens=20_000, max_num_seqs=1)
    res = simulate([a, b, c_row], s, SchedulerSettings(policy="kv_affinity", split_turns=False))
    assert res.steps == 2 * tokens + 5
    assert res.steps_after_queue_empty == 5
