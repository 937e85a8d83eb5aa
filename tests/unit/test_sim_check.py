"""perf.sim_check's pure parts: the trace it replays and how it decides the policies' order."""

from __future__ import annotations

from perf.sim_check import _order, check_trace


def test_the_check_trace_is_small_multi_turn_and_seeded() -> None:
    rows = check_trace(48, 768, [0.05, 0.2], seed=3)
    assert len(rows) == 48 and check_trace(48, 768, [0.05, 0.2], seed=3) == rows
    assert all(1 <= len(r.turns) <= 4 and 64 <= r.prompt_tokens <= 256 for r in rows)
    assert all(r.response_tokens <= 768 for r in rows)
    assert any(len(r.turns) > 1 for r in rows)
    for row in rows:
        assert row.turns[-1].tool_latency_s is None
        assert all(t.tool_latency_s in (0.05, 0.2) for t in row.turns[:-1])


def test_only_gaps_beyond_the_spread_and_five_percent_order_two_policies() -> None:
    makespans = {"a": 10.0, "b": 10.4, "c": 12.0, "d": 13.0}
    spread = {"a": 0.1, "b": 0.1, "c": 0.1, "d": 1.0}
    pairs = _order(makespans, spread)
    assert ("a", "b") not in pairs and ("b", "a") not in pairs  # 4%: a tie
    assert ("a", "c") in pairs and ("b", "c") in pairs
    assert ("c", "d") not in pairs  # 8% apart, but within the rounds' spread (1.1 s)
    assert ("a", "d") in pairs and ("b", "a") not in pairs
