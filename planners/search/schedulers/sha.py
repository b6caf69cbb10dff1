"""Synchronous successive halving (docs/algorithms.md §2.1) as an event-driven scheduler.

Each rung is a stage with a barrier: its segments are handed out as workers free up, and
only when every trial of the rung has a result are the best ``rungs[i+1].trials`` promoted
(resuming from their checkpoints) and the rest stopped.

Example:
    >>> from elastune.planners.spec.geometry import sha_bracket
    >>> sha = SuccessiveHalving(sha_bracket(9, 1, 9, 3))
    >>> jobs = [sha.next_segment() for _ in range(9)]
    >>> sha.next_segment() is None                     # barrier: rung 0 is still running
    True
    >>> for job in jobs:
    ...     _ = sha.on_result(Result(job.trial, job.stop, loss=job.trial))
    >>> [(j.trial, j.start, j.stop) for j in [sha.next_segment() for _ in range(3)]]
    [(0, 1, 3), (1, 1, 3), (2, 1, 3)]
"""

from __future__ import annotations

from collections import deque

from elastune.planners.search.schedulers.base import (
    Action,
    Decision,
    Result,
    Scheduler,
    Segment,
    TrialCounter,
    ranked,
)
from elastune.planners.spec.geometry import Bracket


class SuccessiveHalving(Scheduler):
    """One synchronous SHA bracket.

    Args:
        bracket: The rung geometry (see :func:`elastune.planners.spec.geometry.sha_bracket`).
        counter: Shared trial-id source, so several brackets never reuse an id.
        index: This bracket's index, carried on every segment.
    """

    def __init__(self, bracket: Bracket, counter: TrialCounter | None = None, index: int = 0):
        if not bracket.rungs:
            raise ValueError("bracket must have at least one rung")
        self.bracket = bracket
        self.index = index
        self._counter = counter or TrialCounter()
        self._rung = 0
        self._losses: dict[int, float] = {}  # results of the current rung, in arrival order
        self._pending: deque[Segment] = deque(
            self._segment(self._counter.new(), 0) for _ in range(bracket.rungs[0].trials)
        )
        self._running = 0

    def _segment(self, trial: int, rung: int) -> Segment:
        start = self.bracket.rungs[rung - 1].resource if rung else 0
        return Segment(trial, start, self.bracket.rungs[rung].resource, rung, self.index)

    @property
    def done(self) -> bool:
        return not self._pending and not self._running and self._rung >= len(self.bracket.rungs)

    def next_segment(self) -> Segment | None:
        if not self._pending:
            return None
        self._running += 1
        return self._pending.popleft()

    def on_result(self, result: Result) -> list[Decision]:
        self._running -= 1
        if result.failed:
            decisions = [Decision(result.trial, Action.FAIL, self._rung)]  # never promoted
        else:
            self._losses[result.trial] = result.loss
            decisions = [Decision(result.trial, Action.PAUSE, self._rung)]
        if self._running or self._pending:
            return decisions
        return decisions + self._close_rung()

    def _close_rung(self) -> list[Decision]:
        rung, order = self._rung, ranked(self._losses)
        self._rung, self._losses = rung + 1, {}
        if rung + 1 == len(self.bracket.rungs):
            return [Decision(trial, Action.COMPLETE, rung) for trial in order]
        keep = self.bracket.rungs[rung + 1].trials
        for trial in order[:keep]:
            self._pending.append(self._segment(trial, rung + 1))
        return [
            Decision(trial, Action.PROMOTE if i < keep else Action.STOP, rung)
            for i, trial in enumerate(order)
        ]
