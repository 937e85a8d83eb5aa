"""The 0/1 math reward with a hard time bound, a batch/async API and an LRU cache.

Guarantees:
- :meth:`RewardScorer.score` returns exactly 0.0 or 1.0 and never raises for any input. It
  raises :class:`RewardHostBroken` only when the verification host died ``max_restarts`` times
  in a row (every score would be 0: the run must stop, not learn from zeros).
- Verification (sympy via math-verify) runs in worker processes; one that runs past ``timeout_s``
  is killed and replaced, and scores 0.0. Extraction runs in the caller, in linear time.
- The workers start from an entry point of ours (:mod:`rstar2.reward.host`), never from the
  caller's ``__main__``: a plain script without a main guard runs once.
- The async forms never run verification on the event loop.
- Results are cached on (extracted answer, ground truth), timeouts included, so a pathological
  pair costs its timeout once per scorer. A host that stops answering is replaced after
  ``host_deadline_s``; that call scores 0 and is not cached.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from rstar2.reward.extract import extract_answer
from rstar2.reward.host import FunctionRef, HostedPool, function_ref
from rstar2.reward.verify import verify_answer


@dataclass
class ScorerStats:
    """Counters since the scorer started."""

    calls: int = 0
    no_answer: int = 0
    exact_match: int = 0
    cache_hits: int = 0
    verified: int = 0
    timeouts: int = 0
    worker_errors: int = 0


class RewardScorer:
    """Scores responses against ground truths; a context manager owning its worker pool."""

    def __init__(
        self,
        *,
        timeout_s: float = 3.0,
        num_workers: int = 0,
        cache_size: int = 65536,
        verify_fn: Callable[[str, str, float], bool] = verify_answer,
        host_deadline_s: float | None = None,
    ) -> None:
        """``verify_fn(pred, truth, inner_timeout_s)`` must be a top-level function of an
        importable module, or of the module run by ``python -m`` (the workers import it by
        name; a plain script's ``__main__`` cannot be imported): ValueError otherwise.
        ``host_deadline_s`` (default ``2 * timeout_s + 30``) bounds a wait on a hung host."""
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self._verify: FunctionRef = function_ref(verify_fn)
        self.timeout_s = timeout_s
        self.host_deadline_s = host_deadline_s or 2 * timeout_s + 30
        self.num_workers = num_workers or min(4, os.cpu_count() or 1)
        self.cache_size = cache_size
        self.stats = ScorerStats()
        self._cache: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._lock = threading.Lock()
        self._pool: HostedPool | None = None
        self._closed = False

    def __enter__(self) -> RewardScorer:
        self._ensure_pool()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers; later calls raise RuntimeError (a programming error, not a score)."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()

    def score(self, response: str, ground_truth: str) -> float:
        """1.0 if the response's final answer equals ``ground_truth``, else 0.0."""
        known, key = self._lookup(response, ground_truth)
        if known is not None:
            return known
        return self._finish(key, self._submit(key))

    def score_batch(self, responses: Sequence[str], ground_truths: Sequence[str]) -> list[float]:
        """Scores of ``zip(responses, ground_truths)``, verified in parallel across workers."""
        if len(responses) != len(ground_truths):
            raise ValueError("responses and ground_truths differ in length")
        lookups = [self._lookup(r, g) for r, g in zip(responses, ground_truths, strict=True)]
        futures = [None if known is not None else self._submit(key) for known, key in lookups]
        return [
            known if known is not None else self._finish(key, fut)
            for (known, key), fut in zip(lookups, futures, strict=True)
        ]

    async def ascore(self, response: str, ground_truth: str) -> float:
        """Async :meth:`score`; the event loop only awaits the worker."""
        known, key = self._lookup(response, ground_truth)
        if known is not None:
            return known
        future = await asyncio.to_thread(self._submit, key)  # a full pipe blocks the send
        waiting = asyncio.wrap_future(future)
        wait = self.host_deadline_s
        while True:  # asyncio.wait never cancels the future; _finish reads its outcome
            done, _ = await asyncio.wait([waiting], timeout=wait)
            wait = self._patience_s()
            if done or wait <= 0:
                break
        return self._finish(key, future, wait_s=0.0)

    async def ascore_batch(
        self, responses: Sequence[str], ground_truths: Sequence[str]
    ) -> list[float]:
        if len(responses) != len(ground_truths):
            raise ValueError("responses and ground_truths differ in length")
        pairs = zip(responses, ground_truths, strict=True)
        return list(await asyncio.gather(*(self.ascore(r, g) for r, g in pairs)))

    def _lookup(self, response: Any, ground_truth: Any) -> tuple[float | None, tuple[str, str]]:
        """A score known without verification (no answer, exact match, cached), and the key."""
        with self._lock:
            self.stats.calls += 1
        answer = extract_answer(response) if isinstance(response, str) else None
        truth = str(ground_truth).strip() if ground_truth is not None else ""
        key = (answer or "", truth)
        if not answer or not truth:
            with self._lock:
                self.stats.no_answer += 1
            return 0.0, key
        if answer == truth:
            with self._lock:
                self.stats.exact_match += 1
            return 1.0, key
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                self.stats.cache_hits += 1
        return cached, key

    def _submit(self, key: tuple[str, str]) -> Future[bool]:
        pool = self._ensure_pool()
        inner_timeout_s = max(1.0, self.timeout_s / 2)
        return pool.submit(key[0], key[1], inner_timeout_s, self.timeout_s)

    def _finish(
        self, key: tuple[str, str], future: Future[bool] | None, wait_s: float | None = None
    ) -> float:
        assert future is not None
        try:
            if wait_s is None:
                wait = self.host_deadline_s
                while not future.done() and wait > 0:
                    with contextlib.suppress(FutureTimeout):
                        future.result(timeout=wait)
                    wait = self._patience_s()
            value = 1.0 if future.result(timeout=0) else 0.0
            counter = "verified"
        except FutureTimeout:
            if not future.done():  # the host answered nothing for host_deadline_s: replace it
                with self._lock:
                    self.stats.worker_errors += 1
                    pool = self._pool
                if pool is not None:
                    pool.replace()
                return 0.0
            value, counter = 0.0, "timeouts"
        except Exception:
            with self._lock:
                self.stats.worker_errors += 1
            return 0.0  # a crashed worker is not a property of the pair: not cached
        with self._lock:
            setattr(self.stats, counter, getattr(self.stats, counter) + 1)
            if self.cache_size:
                self._cache[key] = value
                if len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return value

    def _patience_s(self) -> float:
        """How much longer to wait for an answer: the host is hung only once it has answered
        nothing at all for ``host_deadline_s`` (a busy host answering others is waited for)."""
        pool = self._pool
        return 0.0 if pool is None else self.host_deadline_s - pool.idle_s()

    def _ensure_pool(self) -> HostedPool:
        with self._lock:
            if self._closed:
                raise RuntimeError("RewardScorer is closed")
            if self._pool is None:
                self._pool = HostedPool(self.num_workers, self._verify)
                self._pool.start()
            return self._pool


_default: RewardScorer | None = None
_default_lock = threading.Lock()


def default_scorer() -> RewardScorer:
    """The process-wide scorer behind :func:`score`; :func:`reset_default_scorer` replaces it."""
    global _default
    with _default_lock:
        if _default is None:
            _default = RewardScorer()
            atexit.register(_default.close)
        return _default


def reset_default_scorer() -> None:
    """Close the process-wide scorer; the next :func:`score` starts a fresh one (tests use this)."""
    global _default
    with _default_lock:
        old, _default = _default, None
    if old is not None:
        old.close()


def score(response_text: str, ground_truth: str) -> float:
    """The rStar2 0/1 reward: 1.0 iff the final answer equals ``ground_truth``. Never raises."""
    try:
        return default_scorer().score(response_text, ground_truth)
    except Exception:
        return 0.0


async def ascore_batch(responses: Sequence[str], ground_truths: Sequence[str]) -> list[float]:
    """Async batch form of :func:`score` on the process-wide scorer."""
    return await default_scorer().ascore_batch(responses, ground_truths)
