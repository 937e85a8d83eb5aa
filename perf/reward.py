"""Reward benchmark: verifications per second per core on MATH500-style pairs, cold and cached.

Pairs are the 500 MATH-500 ground truths, each answered once respelled (equivalent, different
string, so it needs verification) and once wrong. Rows:
- ``single``: one call at a time through a warm scorer with an empty cache (latency: p50/p99);
- ``cold``: ``score_batch`` over all pairs, empty cache, one worker per core;
- ``cached``: the same batch again (every pair an LRU hit);
- ``baseline``: plain math-verify parse+verify in this process, one core, no time bound.
``cold`` and ``baseline`` run in alternating rounds over interleaved thirds of the pairs, and
the JSON keeps each round's rates (for ratios paired by round).
Prints a table, then one JSON line.

    python -m perf.reward [--pairs N] [--workers N] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import time

from rstar2.data import ground_truth, load_rows
from rstar2.reward import RewardScorer, extract_answer, samples


def _pairs(limit: int | None) -> tuple[list[str], list[str]]:
    truths = [ground_truth(r) for r in load_rows("math500").rows][:limit]
    responses = [samples.response(samples.respell(t)) for t in truths]
    responses += [samples.response(samples.wrong(t)) for t in truths]
    return responses, truths + truths


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _baseline(responses: list[str], truths: list[str]) -> float:
    from math_verify import parse, verify

    start = time.perf_counter()
    for response, truth in zip(responses, truths, strict=True):
        answer = extract_answer(response) or ""
        verify(parse(f"${truth}$"), parse(f"${answer}$"))
    return time.perf_counter() - start


def _rounds(n: int, rounds: int) -> list[slice]:
    """``rounds`` interleaved slices of ``range(n)`` (every pair in exactly one): each round
    holds respelled and wrong answers alike, so rounds cost the same."""
    return [slice(i, n, rounds) for i in range(max(1, min(rounds, n)))]


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=None, help="use the first N ground truths")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=3, help="alternating cold/baseline rounds")
    args = parser.parse_args(argv)
    responses, truths = _pairs(args.pairs)
    n = len(responses)
    rows: dict[str, dict[str, float]] = {}

    with RewardScorer(num_workers=args.workers) as scorer:
        scorer.score_batch(responses[:4], ["-1"] * 4)  # start and warm every worker
        latencies = []
        for response, truth in zip(responses[::5], truths[::5], strict=True):
            t0 = time.perf_counter()
            scorer.score(response, truth)
            latencies.append(time.perf_counter() - t0)
        rows["single"] = {"n": len(latencies), "seconds": sum(latencies)}
        scorer.clear_cache()
        _baseline(responses[:4], truths[:4])  # its imports and parsers, outside every round
        cold_scores: list[float] = [0.0] * n
        rounds: dict[str, list[float]] = {"cold": [], "baseline": []}  # seconds per round
        for part in _rounds(n, args.rounds):  # cold and baseline alternate: drift hits both
            t0 = time.perf_counter()
            cold_scores[part] = scorer.score_batch(responses[part], truths[part])
            rounds["cold"].append(time.perf_counter() - t0)
            rounds["baseline"].append(_baseline(responses[part], truths[part]))
        rows["cold"] = {"n": n, "seconds": sum(rounds["cold"])}
        t0 = time.perf_counter()
        cached_scores = scorer.score_batch(responses, truths)
        rows["cached"] = {"n": n, "seconds": time.perf_counter() - t0}
        assert cached_scores == cold_scores
    rows["baseline"] = {"n": n, "seconds": sum(rounds["baseline"])}
    per_core = [
        (len(range(n)[part]) / cold / args.workers, len(range(n)[part]) / base)
        for part, cold, base in zip(
            _rounds(n, args.rounds), rounds["cold"], rounds["baseline"], strict=True
        )
    ]

    cores = {"single": 1, "cold": args.workers, "cached": 1, "baseline": 1}
    for name, row in rows.items():
        row["per_s"] = row["n"] / row["seconds"]
        row["per_s_per_core"] = row["per_s"] / cores[name]
    accuracy = sum(cold_scores[: n // 2]) / (n // 2), 1 - sum(cold_scores[n // 2 :]) / (n // 2)

    print(f"{'mode':<10}{'pairs':>7}{'seconds':>10}{'verif/s':>11}{'verif/s/core':>14}")
    for name, row in rows.items():
        print(
            f"{name:<10}{row['n']:>7.0f}{row['seconds']:>10.3f}"
            f"{row['per_s']:>11.1f}{row['per_s_per_core']:>14.1f}"
        )
    p50, p99 = _percentile(latencies, 0.5) * 1e3, _percentile(latencies, 0.99) * 1e3
    print(f"single-call latency: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    print(f"graded right: respelled {accuracy[0]:.1%}, wrong {accuracy[1]:.1%}")
    result: dict[str, object] = {
        "benchmark": "reward",
        "cores": os.cpu_count(),
        "workers": args.workers,
        "pairs": n,
        "median_score_ms": round(p50, 3),
        "p99_score_ms": round(p99, 3),
        "cold_verif_per_s_per_core": round(rows["cold"]["per_s_per_core"], 1),
        "cached_verif_per_s": round(rows["cached"]["per_s"], 1),
        "baseline_verif_per_s": round(rows["baseline"]["per_s"], 1),
        "cold_vs_baseline_per_core": round(
            rows["cold"]["per_s_per_core"] / rows["baseline"]["per_s"], 2
        ),
        "round_cold_verif_per_s_per_core": [round(c, 1) for c, _ in per_core],
        "round_baseline_verif_per_s": [round(b, 1) for _, b in per_core],
        "respelled_scored_1": accuracy[0],
        "wrong_scored_0": accuracy[1],
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
