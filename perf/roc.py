"""GRPO-RoC step benchmark: down-sampling + advantages, and the loss, at rStar2's scale.

512 prompts x 32 rollouts (random rewards and tool statistics) down-sampled to 16, GRPO
advantages over the kept groups, then the clipped token-level loss and its backward over
512 x 16 responses of 8K tokens (``--tokens`` to change). Prints a table, then one JSON line.
Target: selection + advantages <= 20 ms.

    python -m perf.roc [--prompts 512] [--rollouts 32] [--tokens 8192] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

import torch

from rstar2.algo.advantage import grpo_advantages
from rstar2.algo.loss import policy_loss
from rstar2.algo.roc import TraceStats, downsample_batch
from rstar2.config import DownSamplingConfig


def _groups(prompts: int, rollouts: int, rng: random.Random) -> list[list[TraceStats]]:
    groups = []
    for _ in range(prompts):
        p_correct = rng.random()
        groups.append(
            [
                TraceStats(
                    reward=float(rng.random() < p_correct),
                    num_tool_calls=(calls := rng.randint(0, 10)),
                    num_tool_errors=rng.randint(0, calls),
                    num_answer_pairs=rng.choice((0, 1, 1, 1, 2)),
                    num_turns=rng.randint(1, 10),
                )
                for _ in range(rollouts)
            ]
        )
    return groups


def _select_and_advantage(groups: list[list[TraceStats]], cfg: DownSamplingConfig) -> int:
    report = downsample_batch(groups, cfg)
    rewards, ids = [], []
    for gid, (group, kept) in enumerate(zip(groups, report.kept, strict=True)):
        for i in kept:
            rewards.append(group[i].reward)
            ids.append(gid)
    adv = grpo_advantages(torch.tensor(rewards), torch.tensor(ids, dtype=torch.long))
    return int(adv.numel())


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--keep", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    rng = random.Random(0)
    groups = _groups(args.prompts, args.rollouts, rng)
    cfg = DownSamplingConfig(down_sample_to_n=args.keep)

    select_ms = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        kept = _select_and_advantage(groups, cfg)
        select_ms.append((time.perf_counter() - t0) * 1e3)

    rows, t = args.prompts * args.keep, args.tokens
    torch.manual_seed(0)
    old = torch.randn(rows, t) * 0.1 - 1.0
    logp = (old + torch.randn(rows, t) * 0.05).requires_grad_(True)
    adv = torch.randn(rows, 1).expand(rows, t)
    mask = torch.ones(rows, t)
    loss_ms = []
    for _ in range(max(1, args.repeats // 2)):
        t0 = time.perf_counter()
        loss, _ = policy_loss(logp, old, adv, mask)
        loss.backward()
        loss_ms.append((time.perf_counter() - t0) * 1e3)
        logp.grad = None

    sel, lss = statistics.median(select_ms), statistics.median(loss_ms)
    print(f"{'part':<34}{'ms (median)':>12}")
    print(f"{'down-sampling + advantages':<34}{sel:>12.2f}")
    print(f"{'loss + backward (' + str(rows) + ' x ' + str(t) + ')':<34}{lss:>12.1f}")
    print(f"kept {kept} of {args.prompts * args.rollouts} rollouts")
    result: dict[str, object] = {
        "benchmark": "roc",
        "cores": os.cpu_count(),
        "prompts": args.prompts,
        "rollouts": args.rollouts,
        "tokens": t,
        "select_and_advantages_ms": round(sel, 2),
        "loss_and_backward_ms": round(lss, 1),
        "kept_rollouts": kept,
        "target_select_ms": 20,
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
