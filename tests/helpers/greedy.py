"""Greedy rollouts compared across a re-dispatch, without asking for bit-equal floating point.

A trajectory moved to another engine mid-turn continues from its committed tokens, which that
engine prefills. A prefilled prefix's KV and logits need not equal the decoded ones bit for bit,
so where the model's two best next tokens are within that noise of each other the greedy choice
can flip, and the continuation then differs from the fault-free run's. That is not a lost or
duplicated token. What is checked instead:

- every sampled token of the re-dispatched run is the model's greedy choice given everything
  before it (within ``TIE_LOGPROB``), by the model itself (Hugging Face, fp32): a token lost or
  sent twice at a cut leaves a token the model would not have chosen there;
- a trajectory that differs from the fault-free one first differs at a near-tie: the two
  tokens' log-probs, in the same context, are within ``TIE_LOGPROB`` of each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rstar2.agent.loop import Trajectory

# far above fp32 noise between vLLM's and Hugging Face's kernels (~1e-5), far below the gap
# of a token the model would not choose (its memorised scripts' next tokens lead by > 1 nat)
TIE_LOGPROB = 1e-3


@dataclass(frozen=True)
class GreedyCheck:
    differing: int  # trajectories whose tokens differ from the fault-free run's
    worst_gap: float  # the largest (best log-prob - sampled token's) over every sampled token


class GreedyModel:
    """The engines' model in fp32, scoring trajectories' tokens."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.eval()
        self.tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)

    def around(self, traj: Trajectory, j: int, width: int = 24) -> str:
        """``traj``'s response near token ``j`` (its text, its loss mask), then how its turns
        went: what an assertion needs to tell a tool response apart from a turn cut short."""
        lo, hi = max(0, j - width), j + width
        text = self.tokenizer.decode(traj.response_ids[lo:hi], skip_special_tokens=False)
        mask = "".join(map(str, traj.loss_mask[lo:hi]))
        spans = [(kind, round(end - start, 3)) for kind, start, end in traj.spans]
        return (
            f"tokens {lo}-{hi} {text!r}, mask {mask}; {len(traj.response_ids)} tokens, "
            f"{traj.num_turns} turns, finish {traj.finish_reason}, spans (kind, s) {spans}"
        )

    @torch.no_grad()
    def logprobs(self, traj: Trajectory) -> torch.Tensor:
        """Row i: the log-probs of the token after ``prompt + response[:i]``."""
        ids = torch.tensor([traj.prompt_ids + traj.response_ids])
        logits = self.model(ids).logits[0].float()
        start = len(traj.prompt_ids) - 1
        return torch.log_softmax(logits[start : start + len(traj.response_ids)], dim=-1)

    def gaps(self, traj: Trajectory) -> list[float]:
        """For each sampled token: how far its log-prob is below its context's best."""
        lp = self.logprobs(traj)
        return [
            float(lp[i].max() - lp[i, tok])
            for i, (tok, sampled) in enumerate(zip(traj.response_ids, traj.loss_mask, strict=True))
            if sampled
        ]


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def assert_same_greedy_rollout(
    model: GreedyModel, reference: Sequence[Trajectory], got: Sequence[Trajectory]
) -> GreedyCheck:
    """``got`` is the fault-free ``reference`` up to near-tie flips (module docstring); returns
    how many trajectories differ and the worst greedy gap, for the test's report."""
    differing, worst = 0, 0.0
    for i, (want, mine) in enumerate(zip(reference, got, strict=True)):
        assert mine.prompt_ids == want.prompt_ids, f"trajectory {i}: another prompt"
        gaps = model.gaps(mine)
        worst = max([worst, *gaps])
        bad = [g for g in gaps if g > TIE_LOGPROB]
        assert not bad, (
            f"trajectory {i}: {len(bad)} sampled token(s) not the greedy choice {bad[:3]}"
        )
        if mine.response_ids == want.response_ids:
            assert mine.loss_mask == want.loss_mask, f"trajectory {i}: same tokens, other mask"
            continue
        differing += 1
        j = _first_difference(mine.response_ids, want.response_ids)
        assert mine.loss_mask[:j] == want.loss_mask[:j], f"trajectory {i}: mask differs before {j}"
        assert j < len(mine.response_ids) and j < len(want.response_ids), (
            f"trajectory {i}: one run's tokens are a prefix of the other's "
            f"({len(mine.response_ids)} vs {len(want.response_ids)}): a turn ended early or ran on"
        )
        assert mine.loss_mask[j] == want.loss_mask[j] == 1, (
            f"trajectory {i}: differs in a tool response at {j}\n"
            f"this run: {model.around(mine, j)}\nfault-free: {model.around(want, j)}"
        )
        lp = model.logprobs(mine)[j]
        tie = abs(float(lp[mine.response_ids[j]] - lp[want.response_ids[j]]))
        assert tie <= TIE_LOGPROB, (
            f"trajectory {i} first differs at token {j}, where the two choices are {tie:.2e} nats "
            "apart: not a near-tie a re-prefill can flip"
        )
    return GreedyCheck(differing, worst)
