"""The rStar2 0/1 math reward: extraction, normalising check + math-verify, bounded in time.

``score(response_text, ground_truth) -> 0.0 | 1.0`` never raises; ``ascore_batch`` is the async
batch form; :class:`RewardScorer` owns a worker pool and cache for callers that manage lifetimes.
"""

from rstar2.reward.extract import extract_answer
from rstar2.reward.host import RewardHostBroken
from rstar2.reward.normalize import equivalent, normalize
from rstar2.reward.scorer import (
    RewardScorer,
    ScorerStats,
    ascore_batch,
    default_scorer,
    reset_default_scorer,
    score,
)

__all__ = [
    "RewardHostBroken",
    "RewardScorer",
    "ScorerStats",
    "ascore_batch",
    "default_scorer",
    "equivalent",
    "extract_answer",
    "normalize",
    "reset_default_scorer",
    "score",
]
