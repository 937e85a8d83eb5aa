"""kv_affinity's placement (pure; see :mod:`scheduler.core` for the policy and its invariants):
next turns first, each in the queue of the engine holding its prefix, then new trajectories
onto the engine with the most free KV while its live trajectories' expected growth leaves room;
moves, tail balancing and the release of held prefixes that block the oldest waiting turn."""

from __future__ import annotations

import heapq

from scheduler.base import SchedulerBase
from scheduler.state import (
    Assignment,
    EngineState,
    TrajectoryState,
    batch_full,
    free_besides,
    kv_free_besides,
)


class AffinityPlacement(SchedulerBase):
    """The kv_affinity half of :class:`scheduler.core.Scheduler`."""

    def _schedule_affinity(self, limit: int | None, idle_rescan: bool = True) -> list[Assignment]:
        """kv_affinity: next turns of live trajectories first, each in the queue of the engine
        holding its prefix (oldest first); then new trajectories, onto the engine with the
        most free KV. An engine whose oldest waiting turn was passed ``max_bypass`` times by
        new trajectories takes no new ones until that turn runs (which may also move)."""
        out: list[Assignment] = []
        room = limit if limit is not None else 1 << 62
        blocked = self._heads
        max_free = self._max_free()
        for engine_id in sorted(self._dirty):
            engine = self.engines[engine_id]
            queue = self._home_queues[engine_id]
            blocked.pop(engine_id, None)
            skipped: list[tuple[int, str]] = []
            while queue and len(out) < room:
                item = heapq.heappop(queue)
                traj = self._trajs.get(item[1])
                if traj is None or traj.state != "waiting" or traj.home != engine.engine_id:
                    continue  # stale entry
                fits = self._may_fit(traj, max_free)  # cheap rejection first
                assignment = self._place_kv_affinity(traj) if fits else None
                if assignment is not None:
                    out.append(assignment)
                    max_free = self._max_free()
                    continue
                skipped.append(item)
                blocked.setdefault(engine.engine_id, traj)
                if len(skipped) >= self.settings.max_misfits_per_engine:
                    break
            if len(out) < room or not queue:  # scanned until it blocked or emptied
                self._dirty.discard(engine_id)
            for item in skipped:
                heapq.heappush(queue, item)
        for engine_id, head in list(blocked.items()):
            if head.state != "waiting" or head.home != engine_id:
                del blocked[engine_id]  # placed or finished since
        out.extend(self._place_new(room - len(out), blocked))
        for engine_id, head in list(blocked.items()):
            if self._release_waiting_holds_for(head, self.engines[engine_id]) and len(out) < room:
                out.extend(self._schedule_affinity(room - len(out), idle_rescan))
                break
        idle = not any(e.in_flight for e in self.engines)
        if idle_rescan and idle and not out and blocked and not self._dirty:
            # nothing runs anywhere, so no event will rescan a turn that could run or move now
            self._rescan_waiting()
            if self._dirty:
                out.extend(self._schedule_affinity(room, idle_rescan=False))
        return out

    def _place_new(self, room: int, blocked: dict[int, TrajectoryState]) -> list[Assignment]:
        """First dispatches of new trajectories (kv_affinity), oldest first."""
        out: list[Assignment] = []
        skipped: list[tuple[int, str]] = []
        closed = {e for e, head in blocked.items() if head.bypassed >= self.settings.max_bypass}
        held: TrajectoryState | None = None  # the oldest new trajectory that did not fit
        best_free = self._best_free(closed)
        least = self._least_new_need()
        if least is None:  # no live new trajectory: what _queue holds, the scan would drop
            self._queue.clear()
            return out
        if self._blocks(least) > best_free:
            return out  # the scan below would reject each one it looks at
        while self._queue and len(out) < room:
            item = heapq.heappop(self._queue)
            traj = self._trajs.get(item[1])
            if traj is None or traj.state != "waiting":
                continue
            if held is not None and held.bypassed >= self.settings.max_bypass:
                skipped.append(item)
                break  # new trajectories wait until the oldest fits
            fits = self._need_kv_affinity(traj)[1] <= best_free  # cheap rejection first
            assignment = self._place_kv_affinity(traj, exclude=closed) if fits else None
            if assignment is None:
                skipped.append(item)
                held = held or traj
                if len(skipped) >= self.settings.max_misfits_per_pass:
                    break
                continue
            if held is not None:
                held.bypassed += 1
            out.append(assignment)
            best_free = self._best_free(closed)
            head = blocked.get(assignment.engine_id)
            if head is not None:
                head.bypassed += 1
                if head.bypassed >= self.settings.max_bypass:
                    closed.add(assignment.engine_id)
        for item in skipped:
            heapq.heappush(self._queue, item)
        return out

    def _least_new_need(self) -> int | None:
        """A lower bound on what any trajectory in ``_queue`` needs to pass
        :meth:`_place_new`'s cheap rejection (``_need_kv_affinity(traj)[1] <= best_free``),
        before rounding to blocks; None: no live trajectory is left in ``_queue``."""
        split = self.settings.split_turns
        segment = max(self._segment, self.settings.min_segment_tokens) if split else None
        return self._new_floor.least_need(segment)

    def _release_waiting_holds_for(self, head: TrajectoryState, engine: EngineState) -> bool:
        """Break a hold-and-wait cycle: when ``head``, the oldest waiting turn on ``engine``,
        does not fit there, nothing runs there, and it would fit once the prefixes held there
        by other *waiting* trajectories are let go, let them go (those re-prefill later)."""
        if engine.in_flight or not engine.waiting_holds:
            return False
        others = {t: n for t, n in engine.waiting_holds.items() if t != head.traj_id}
        need = self._need_kv_affinity(head)[1]
        if not others or free_besides(engine, head.reserved) + sum(others.values()) < need:
            return False
        for traj_id, tokens in others.items():
            del engine.waiting_holds[traj_id]
            engine.reserved_tokens -= tokens
            self._trajs[traj_id].reserved = 0
        self._dirty.add(engine.engine_id)
        return True

    def _best_free(self, exclude: set[int]) -> float:
        """The most KV any engine outside ``exclude`` offers a new trajectory (its headroom for
        live trajectories taken off)."""
        h = self.settings.new_headroom_fraction
        return max(
            (
                e.free_tokens - (h * e.capacity_tokens if e.reserved_tokens else 0)
                for e in self.engines
                if e.engine_id not in exclude
            ),
            default=-1,
        )

    def _may_fit(self, traj: TrajectoryState, max_free: int) -> bool:
        """A cheap necessary condition for :meth:`_place` to succeed (``max_free``: the most
        free KV on any engine)."""
        policy = self.settings.policy
        if policy == "kv_capacity":
            need = self._blocks(traj.prompt_tokens + traj.max_response_tokens)
            return need <= max_free  # admitted trajectories never wait in this queue
        if policy != "kv_affinity":
            return True
        need = self._need_kv_affinity(traj)[1]
        if traj.home is None or traj.bypassed >= self.settings.max_bypass:
            return need <= max_free
        home = self.engines[traj.home]
        home_free = free_besides(home, traj.reserved)
        if need <= home_free or need > home.capacity_tokens:
            return True
        if self._floor_blocks(home_free) - traj.context_tokens >= self.settings.min_segment_tokens:
            return True
        return need + self.settings.move_free_fraction * home.capacity_tokens <= max_free

    def _need_kv_affinity(self, traj: TrajectoryState) -> tuple[int, int]:
        """(segment, reservation) of the trajectory's next dispatch."""
        if not self.settings.split_turns:
            return traj.remaining_tokens, self._blocks(traj.context_tokens + traj.remaining_tokens)
        segment = min(traj.remaining_tokens, max(self._segment, self.settings.min_segment_tokens))
        return segment, self._blocks(traj.context_tokens + segment)

    def _place_kv_affinity(
        self, traj: TrajectoryState, exclude: set[int] | frozenset[int] = frozenset()
    ) -> Assignment | None:
        segment, need = self._need_kv_affinity(traj)
        home = self.engines[traj.home] if traj.home is not None else None
        held = traj.reserved  # its prefix, held on home since its last dispatch
        home_free = free_besides(home, held) if home is not None else 0
        shrunk = self._floor_blocks(home_free) - traj.context_tokens
        if home is not None and home_free >= need:
            engine = self._balanced(home, need)
        elif (
            home is not None
            and self.settings.split_turns
            and shrunk >= self.settings.min_segment_tokens
        ):
            # a shorter segment fits where its prefix is: run now rather than wait (a waiting
            # prefix ages in the engine's LRU cache); the turn continues in further segments
            engine, segment, need = home, shrunk, self._blocks(traj.context_tokens + shrunk)
        else:
            candidates = [e for e in self.engines if e.engine_id not in exclude]
            if not candidates:
                return None
            engine = max(candidates, key=lambda e: (e.free_tokens, -e.engine_id))
            if engine is home or engine.free_tokens < need:
                return None
            slack = engine.free_tokens - need
            headroom = self.settings.new_headroom_fraction * engine.capacity_tokens
            if home is None and engine.reserved_tokens and slack < headroom:
                return None  # the room left is for live trajectories' next turns
            if home is None and self._over_projected(engine, traj):
                return None  # its live trajectories are expected to grow into the rest
            if not (
                home is None
                or need > home.capacity_tokens
                or (
                    slack >= self.settings.move_free_fraction * engine.capacity_tokens
                    and not _only_batch_full(home, held, need)
                )
                or traj.bypassed >= self.settings.max_bypass
            ):
                return None  # wait for the prefix's engine
        if home is not None:
            home.reserved_tokens -= held
            home.waiting_holds.pop(traj.traj_id, None)
            self._dirty.add(home.engine_id)
        engine.reserved_tokens += need
        traj.reserved = need
        return self._start(traj, engine, segment, need)

    def _over_projected(self, engine: EngineState, traj: TrajectoryState) -> bool:
        """Admitting ``traj`` would take the engine's expected final KV past its share."""
        fraction = self.settings.admit_projected_fraction
        if fraction is None or not self._growth.ready or not engine.in_flight:
            return False
        expected = min(self._growth.expected_total(0), traj.max_response_tokens)
        new = traj.prompt_tokens + expected
        return engine.projected_tokens + new > fraction * engine.capacity_tokens

    def _balanced(self, home: EngineState, need: int) -> EngineState:
        """``home``, or in the rollout's tail (no new trajectory waiting) the least busy
        engine when it runs ``balance_gap`` fewer dispatches and has the room: the engines
        that emptied first take turns off the busiest, whose steps then run faster."""
        gap = self.settings.balance_gap
        if gap is None or self._queue:
            return home
        least = min(self.engines, key=lambda e: (e.down, e.in_flight, e.engine_id))
        if least.in_flight + gap <= home.in_flight and least.free_tokens >= need:
            return least
        return home


def _only_batch_full(engine: EngineState, own_tokens: int, need: int) -> bool:
    """The engine has the KV for ``need`` but runs its most requests: a slot frees as soon as
    any of them ends, so waiting there beats re-prefilling the prefix elsewhere."""
    return not engine.down and batch_full(engine) and kv_free_besides(engine, own_tokens) >= need
