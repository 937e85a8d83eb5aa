"""The rollout scheduler: a pure, synchronous state machine (no asyncio, no torch, no network).

Engines have a KV capacity in tokens. Trajectories have a prompt, a response token budget and a
session id, and generate in *dispatches*: one dispatch runs one request on one engine. Events
(method calls) move the state; :meth:`Scheduler.schedule` returns the dispatches to start now,
as :class:`Assignment` values. The caller (the asyncio dispatcher, or the simulator) starts them
and reports back.

Event sequence of one trajectory::

    submit -> schedule() assigns -> generation_finished(turn_complete=True)   # tool call runs
           -> turn_ready(context) -> schedule() assigns -> ... -> finish

Policies (:data:`Policy`):
- ``round_robin``: every dispatch goes to the next engine in turn; no admission control.
- ``least_requests``: to the engine with the fewest dispatches in flight; no admission control.
- ``sticky`` (verl-like): a trajectory's first dispatch goes to the engine with the fewest live
  trajectories, every later one to the same engine; no admission control.
- ``kv_capacity`` (the rStar2 paper): a trajectory is admitted to the engine with the most free
  KV once that covers its worst case (prompt + response budget); the reservation is held until
  the trajectory finishes, and all its turns run there.
- ``kv_affinity`` (ours): each dispatch reserves its context plus a *segment*: the observed
  per-turn growth (a quantile of recent turns' generated tokens), capped by the remaining
  budget. The dispatch's ``max_tokens`` is that segment, so it can never outgrow its reservation;
  a turn longer than one segment continues in a further dispatch. The reservation is kept
  through the tool call that follows (tool calls are short next to generation), so the engine
  keeps the prefix cached and the next turn usually starts at once. A dispatch goes to the
  engine holding the trajectory's prefix while that engine has room (a shorter segment is taken
  if only that fits), otherwise to the engine with the most free KV when that one is clearly
  underloaded or the dispatch has waited long: a move re-prefills the whole context, so a
  loaded system keeps trajectories home (and a home that has the KV but runs its most requests
  is waited for). Next turns of live trajectories go before new trajectories, which also leave
  ``new_headroom_fraction`` of an engine free for them and are admitted only while the engine's
  live trajectories at their expected final length (:mod:`scheduler.growth`) leave room. Once
  no new trajectory waits, a turn moves to an engine running ``balance_gap`` fewer dispatches.

The state and shared bookkeeping are :mod:`scheduler.base`; kv_affinity's placement is
:mod:`scheduler.affinity`; this module holds the events and the other policies.

Invariants (tested):
- Admission policies never over-commit: on every engine the reservations sum to at most its
  capacity (``kv_affinity``: and every dispatch's tokens fit its own reservation, because its
  ``max_tokens`` is bounded by it). An engine whose KV is counted in the same unit
  (``block_size_tokens``) therefore never has to preempt for the scheduler's dispatches.
- Every submitted trajectory is eventually assigned: :meth:`submit` rejects a trajectory whose
  smallest reservation exceeds every engine; waiting trajectories that hold KV give it up when
  that is what stands between the oldest waiting turn and an idle engine.
- No starvation: waiting dispatches are served oldest trajectory first; a later one may pass a
  waiting one that does not fit yet at most ``max_bypass`` times, then the queue (for
  ``kv_affinity``: new trajectories, or new ones on that engine) holds until it fits; running
  dispatches finish in bounded tokens, which frees their reservations.

Engine faults: :meth:`Scheduler.engine_down` takes an engine out (no dispatch goes to it; the
trajectories homed there lose their home and reservation and are placed afresh, re-prefilling
elsewhere); the caller reports each dispatch that was running there with
:meth:`Scheduler.dispatch_failed`, which queues its turn again from the trajectory's committed
context. :meth:`Scheduler.engine_up` brings it back. The invariants above hold throughout, over
the engines that are up; with none up nothing is scheduled (the caller decides to stop).

What the scheduler cannot control: an engine's prefix cache is LRU, so a prefix kept through a
long wait may still be evicted by newer cache entries (the simulator counts that recompute).
"""

from __future__ import annotations

import bisect
import heapq
import math

from scheduler.affinity import AffinityPlacement
from scheduler.state import (
    ADMISSION_POLICIES,
    POLICIES,
    Assignment,
    EngineState,
    Policy,
    SchedulerError,
    SchedulerSettings,
    SchedulerStats,
    TrajectoryState,
)

__all__ = [
    "ADMISSION_POLICIES",
    "POLICIES",
    "Assignment",
    "EngineState",
    "Policy",
    "Scheduler",
    "SchedulerError",
    "SchedulerSettings",
    "SchedulerStats",
]


class Scheduler(AffinityPlacement):
    """See the module docstring. Not thread-safe; one owner drives it."""

    # ---- events ----

    def submit(
        self,
        traj_id: str,
        *,
        prompt_tokens: int,
        max_response_tokens: int,
        session_id: str | None = None,
    ) -> None:
        """A new trajectory; its first turn is ready now."""
        if traj_id in self._trajs:
            raise SchedulerError(f"trajectory {traj_id!r} was already submitted")
        if prompt_tokens < 1 or max_response_tokens < 1:
            raise SchedulerError("prompt_tokens and max_response_tokens must be positive")
        traj = TrajectoryState(
            traj_id=traj_id,
            seq=self._seq,
            session_id=session_id or traj_id,
            prompt_tokens=prompt_tokens,
            max_response_tokens=max_response_tokens,
            context_tokens=prompt_tokens,
        )
        # a trajectory's KV lives on one engine, so one that can outgrow every engine could
        # never finish there (vLLM refuses a max_model_len its KV cannot hold, for the same
        # reason); kv_affinity reserves less up front but must refuse it all the same
        need = self._blocks(prompt_tokens + max_response_tokens)
        largest = max(e.capacity_tokens for e in self.engines)
        if self.settings.policy in ADMISSION_POLICIES and need > largest:
            raise SchedulerError(
                f"trajectory {traj_id!r} needs {need} KV tokens; the largest engine has {largest}"
            )
        self._seq += 1
        self._trajs[traj_id] = traj
        self._enqueue(traj)

    def turn_ready(self, traj_id: str, context_tokens: int) -> None:
        """A trajectory's next turn can generate; ``context_tokens`` = prompt + response so far
        (tool results included)."""
        traj = self._get(traj_id, expect="tool")
        if context_tokens < traj.context_tokens:
            raise SchedulerError(f"{traj_id!r}: context cannot shrink")
        traj.context_tokens = context_tokens
        traj.turn_generated = 0
        self._reproject(traj)
        if traj.remaining_tokens <= 0:
            raise SchedulerError(f"{traj_id!r}: the response budget is spent; finish it")
        self._enqueue(traj)

    def generation_finished(
        self, traj_id: str, generated_tokens: int, *, turn_complete: bool = True
    ) -> None:
        """A dispatch ended after ``generated_tokens``. ``turn_complete=False``: it stopped at its
        ``max_tokens`` cap mid-turn, and the turn continues in a further dispatch."""
        traj = self._get(traj_id, expect="running")
        engine = self.engines[traj.home] if traj.home is not None else None
        if engine is not None:
            engine.in_flight -= 1
            self._dirty.add(engine.engine_id)
        traj.context_tokens += generated_tokens
        traj.turn_generated += generated_tokens
        self._reproject(traj)
        # kv_affinity keeps the dispatch's reservation through the tool call (or until the
        # turn's next segment): the engine keeps the prefix cached, and the next turn usually
        # starts at once (the unused part of this segment covers the tool response)
        if turn_complete or traj.remaining_tokens <= 0:
            self._observe_turn(traj.turn_generated)
            traj.state = "tool"
            return
        self.stats.continuations += 1
        self._enqueue(traj)

    def finish(self, traj_id: str) -> None:
        """The trajectory is done (no more turns); everything it held is released."""
        traj = self._trajs.get(traj_id)
        if traj is None:
            raise SchedulerError(f"unknown trajectory {traj_id!r}")
        if traj.state == "running":
            raise SchedulerError(f"{traj_id!r} still has a dispatch running")
        del self._trajs[traj_id]
        if self.settings.policy == "kv_affinity":
            self._growth.observe(traj.context_tokens - traj.prompt_tokens)
        if traj.home is not None:
            engine = self.engines[traj.home]
            engine.reserved_tokens -= traj.reserved
            engine.projected_tokens -= traj.projected
            engine.waiting_holds.pop(traj_id, None)
            self._dirty.add(engine.engine_id)
            if self.settings.policy == "sticky":
                engine.live_trajectories -= 1
        traj.state = "done"
        self._waiting.discard(traj_id)

    def dispatch_failed(self, traj_id: str) -> None:
        """A dispatch ended without output (its engine failed): the turn waits to run again
        from the trajectory's committed context; nothing it generated counts."""
        traj = self._get(traj_id, expect="running")
        if traj.home is not None:
            engine = self.engines[traj.home]
            engine.in_flight -= 1
            self._dirty.add(engine.engine_id)
        self.stats.redispatches += 1
        self._enqueue(traj)

    def engine_down(self, engine_id: int) -> None:
        """The engine failed: nothing is placed on it until :meth:`engine_up`. Trajectories
        homed there lose their home and reservation (their next dispatch re-prefills
        elsewhere); the caller reports the dispatches that were running there with
        :meth:`dispatch_failed`."""
        engine = self._engine(engine_id)
        if engine.down:
            return
        engine.down = True
        self.stats.engines_down += 1
        engine.reserved_tokens = engine.in_flight = engine.live_trajectories = 0
        engine.projected_tokens = 0.0
        engine.waiting_holds.clear()
        self._heads.pop(engine_id, None)
        for traj in self._trajs.values():
            if traj.home != engine_id:
                continue
            traj.home, traj.reserved, traj.projected = None, 0, 0.0
            if traj.state == "waiting":
                self._enqueue(traj)  # out of its home queue (a stale entry there now)
        self._rescan_waiting()

    def engine_up(self, engine_id: int, capacity_tokens: int | None = None) -> None:
        """The engine (restarted, empty) takes dispatches again."""
        engine = self._engine(engine_id)
        engine.down = False
        engine.reported_used_tokens = engine.reported_running = engine.reported_waiting = 0
        if capacity_tokens is not None and capacity_tokens > 0:
            engine.capacity_tokens = capacity_tokens
        self._dirty.add(engine_id)
        self._rescan_waiting()  # a waiting turn may move to the engine that came back

    @property
    def engines_up(self) -> int:
        return sum(not e.down for e in self.engines)

    def update_engine(
        self,
        engine_id: int,
        *,
        used_tokens: int,
        running: int,
        waiting: int,
        preemptions: int,
        capacity_tokens: int | None = None,
    ) -> None:
        """The engine's own live stats. Admission treats the larger of the engine's reported
        use and the scheduler's reservations as taken (other clients may share the engine)."""
        engine = self._engine(engine_id)
        if engine.down:
            return  # a dead engine's last stats mean nothing
        self._dirty.add(engine_id)
        engine.reported_used_tokens = used_tokens
        engine.reported_running = running
        engine.reported_waiting = waiting
        engine.reported_preemptions = preemptions
        if capacity_tokens is not None and capacity_tokens > 0:
            engine.capacity_tokens = capacity_tokens

    # ---- decisions ----

    def schedule(self, limit: int | None = None) -> list[Assignment]:
        """Dispatches to start now (oldest trajectory first), at most ``limit``."""
        if self.settings.policy == "kv_affinity":
            return self._schedule_affinity(limit)
        out: list[Assignment] = []
        while self._admitted and (limit is None or len(out) < limit):
            traj = self._trajs.get(self._admitted.popleft())
            if traj is not None and traj.state == "waiting" and traj.home is not None:
                out.append(
                    self._start(traj, self.engines[traj.home or 0], traj.remaining_tokens, 0)
                )
        skipped: list[tuple[int, str]] = []
        held: TrajectoryState | None = None  # oldest waiting dispatch that did not fit
        misfits = 0
        max_free = self._max_free()
        while self._queue and (limit is None or len(out) < limit):
            item = heapq.heappop(self._queue)
            traj = self._trajs.get(item[1])
            if traj is None or traj.state != "waiting":
                continue  # finished while queued (stale entry)
            if held is not None and held.bypassed >= self.settings.max_bypass:
                skipped.append(item)
                break  # the queue holds until the oldest fits
            # cheap rejection first: no engine has the room (its own held prefix counted)
            fits = self._may_fit(traj, max_free)
            assignment = self._place(traj) if fits else None
            if assignment is None:
                skipped.append(item)
                if held is None:
                    held = traj
                misfits += 1
                if misfits >= self.settings.max_misfits_per_pass or not self._any_room():
                    break
                continue
            if held is not None:
                held.bypassed += 1
            out.append(assignment)
            max_free = self._max_free()
        for item in skipped:
            heapq.heappush(self._queue, item)
        return out

    @property
    def num_waiting(self) -> int:
        """Trajectories waiting for a dispatch (new ones and next turns), in O(1)."""
        return len(self._waiting)

    @property
    def num_live(self) -> int:
        return len(self._trajs)

    @property
    def segment_tokens(self) -> int:
        """kv_affinity's current projected per-turn growth."""
        return self._segment

    # ---- internals ----

    def _enqueue(self, traj: TrajectoryState) -> None:
        traj.state = "waiting"
        traj.bypassed = 0
        self._waiting.add(traj.traj_id)
        self.stats.peak_waiting = max(self.stats.peak_waiting, len(self._waiting))
        if self.settings.policy == "kv_capacity" and traj.home is not None:
            self._admitted.append(traj.traj_id)  # needs no new capacity: never held back
            return
        if self.settings.policy == "kv_affinity" and traj.home is not None:
            heapq.heappush(self._home_queues[traj.home], (traj.seq, traj.traj_id))
            self._dirty.add(traj.home)
        else:
            heapq.heappush(self._queue, (traj.seq, traj.traj_id))
            if self.settings.policy == "kv_affinity":
                self._new_floor.add(traj)
        if self.settings.policy == "kv_affinity" and traj.reserved and traj.home is not None:
            self.engines[traj.home].waiting_holds[traj.traj_id] = traj.reserved

    def _smallest_reservation(self, traj: TrajectoryState) -> int:
        if self.settings.policy == "kv_capacity":
            return self._blocks(traj.prompt_tokens + traj.max_response_tokens)
        if self.settings.policy == "kv_affinity":
            segment = min(self.settings.min_segment_tokens, traj.max_response_tokens)
            return self._blocks(traj.context_tokens + segment)
        return 0

    def _observe_turn(self, generated: int) -> None:
        if len(self._turns) == self._turns.maxlen:
            oldest = self._turns[0]
            del self._sorted_turns[bisect.bisect_left(self._sorted_turns, oldest)]
        self._turns.append(generated)
        bisect.insort(self._sorted_turns, generated)
        n = len(self._sorted_turns)
        rank = min(n - 1, max(0, math.ceil(self.settings.segment_quantile * n) - 1))
        segment = max(self.settings.min_segment_tokens, self._sorted_turns[rank])
        if segment < self._segment:  # every waiting turn needs less now: rescan the blocked
            self._dirty.update(i for i, queue in enumerate(self._home_queues) if queue)
        self._segment = segment

    def _any_room(self) -> bool:
        """False once no engine could take even the smallest reservation (stop scanning)."""
        if self.settings.policy not in ADMISSION_POLICIES:
            return True
        return any(e.free_tokens >= self.settings.min_segment_tokens for e in self.engines)

    def _place(self, traj: TrajectoryState) -> Assignment | None:
        policy = self.settings.policy
        if policy == "kv_capacity":
            return self._place_kv_capacity(traj)
        if policy == "kv_affinity":
            return self._place_kv_affinity(traj)
        up = (e for e in self.engines if not e.down)
        found: EngineState | None
        if policy == "round_robin":
            n = len(self.engines)
            turn = (self.engines[(self._rr_next + i) % n] for i in range(n))
            found = next((e for e in turn if not e.down), None)
            if found is not None:
                self._rr_next = (found.engine_id + 1) % n
        elif policy == "least_requests":
            found = min(up, key=lambda e: (e.in_flight, e.engine_id), default=None)
        elif traj.home is None:  # sticky
            found = min(up, key=lambda e: (e.live_trajectories, e.engine_id), default=None)
            if found is not None:
                found.live_trajectories += 1
        else:
            found = self.engines[traj.home]
        if found is None:
            return None  # every engine is down
        return self._start(traj, found, traj.remaining_tokens, 0)

    def _place_kv_capacity(self, traj: TrajectoryState) -> Assignment | None:
        need = self._blocks(traj.prompt_tokens + traj.max_response_tokens)
        engine = max(self.engines, key=lambda e: (e.free_tokens, -e.engine_id))
        if engine.free_tokens < need:
            return None
        engine.reserved_tokens += need
        traj.reserved = need
        return self._start(traj, engine, traj.remaining_tokens, need)
