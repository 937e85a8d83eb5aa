"""Answer verification: the normalising check, then math-verify (sympy). Runs in worker processes.

Nothing here bounds its own time: sympy can hang on adversarial input, so callers run
:func:`verify_answer` in a killable worker (:class:`rstar2.reward.scorer.RewardScorer`). Inner
math-verify timeouts are set too, so a slow case usually ends without a worker being killed.
math-verify is imported at module level so that the pool's forkserver preloads it once and a
replacement worker starts in milliseconds.
"""

from __future__ import annotations

import logging
import math
import signal

from math_verify import parse, verify

from rstar2.reward.normalize import equivalent


def verify_answer(pred: str, truth: str, inner_timeout_s: float = 2.0) -> bool:
    """True if ``pred`` is the same answer as ``truth``; False on any failure to decide."""
    if equivalent(pred, truth):
        return True
    return _math_verify(pred, truth, max(1, math.floor(inner_timeout_s)))


def warm_up() -> None:
    """Pool initializer: make the worker killable at once, and exercise math-verify once.

    The pool's own SIGTERM handler is Python-level, so it cannot run while sympy is stuck in one C
    call, and the pool would wait seconds before SIGKILL; these workers keep no state worth a
    graceful exit.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    logging.getLogger("latex2sympy2_extended").setLevel(logging.ERROR)
    _math_verify("\\frac{1}{2}", "0.5", 1)


def _math_verify(pred: str, truth: str, timeout_s: int) -> bool:
    try:
        gold = parse(_as_latex(truth), parsing_timeout=timeout_s)
        answer = parse(_as_latex(pred), parsing_timeout=timeout_s)
        if not gold or not answer:
            return False
        return bool(verify(gold, answer, timeout_seconds=timeout_s))
    except Exception:
        return False


def _as_latex(answer: str) -> str:
    return "$" + answer.strip().strip("$") + "$"
