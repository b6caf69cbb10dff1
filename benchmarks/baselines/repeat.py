"""Run a finite scheduler again and again: idle workers start the next copy.

Synchronous SHA and Hyperband end after their brackets. Under a deadline the fair baseline
keeps going: whenever no running copy has work for a free worker (its rung waits at a
barrier, or it is done), a fresh copy starts, so workers never idle while trials remain.
Trial ids are renumbered so copies never share one.

Example:
    >>> from elastune.planners.spec.geometry import sha_bracket
    >>> from elastune.planners.search.schedulers import SuccessiveHalving
    >>> sha = Repeat(lambda: SuccessiveHalving(sha_bracket(3, 1, 3, 3)), trials_per_copy=3)
    >>> [(j.trial, j.stop) for j in (sha.next_segment() for _ in range(4))]  # 4th: second copy
    [(0, 1), (1, 1), (2, 1), (3, 1)]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from elastune.planners.search.schedulers.base import (
    Decision,
    Result,
    Scheduler,
    Segment,
    TrialCounter,
)


class Repeat(Scheduler):
    """Copies of ``make()`` started back to back, oldest first in line for free workers.

    Args:
        make: Builds one fresh copy (e.g. one SHA bracket, or one Hyperband iteration).
        trials_per_copy: How many trials one copy starts.
        max_trials: No copy starts that would take the total past this; None: no limit.
    """

    def __init__(
        self,
        make: Callable[[], Scheduler],
        trials_per_copy: int,
        max_trials: int | None = None,
    ):
        if trials_per_copy < 1:
            raise ValueError(f"trials_per_copy must be >= 1, got {trials_per_copy}")
        if max_trials is not None and max_trials < trials_per_copy:
            raise ValueError(
                f"max_trials ({max_trials}) must be at least trials_per_copy ({trials_per_copy})"
            )
        self.make = make
        self.trials_per_copy = trials_per_copy
        self.max_trials = max_trials
        self.copies: list[Scheduler] = []
        self._counter = TrialCounter()
        self._outer: dict[tuple[int, int], int] = {}  # (copy, inner id) -> trial id
        self._inner: dict[int, tuple[int, int]] = {}

    def next_segment(self) -> Segment | None:
        for index, copy in enumerate(self.copies):
            job = copy.next_segment()
            if job is not None:
                return self._rename(index, job)
        room = self.max_trials is None or (
            (len(self.copies) + 1) * self.trials_per_copy <= self.max_trials
        )
        if not room:
            return None
        self.copies.append(self.make())
        job = self.copies[-1].next_segment()
        return None if job is None else self._rename(len(self.copies) - 1, job)

    def _rename(self, index: int, job: Segment) -> Segment:
        key = (index, job.trial)
        if key not in self._outer:
            self._outer[key] = self._counter.new()
            self._inner[self._outer[key]] = key
        return dataclasses.replace(job, trial=self._outer[key])

    def on_result(self, result: Result) -> list[Decision]:
        index, inner = self._inner[result.trial]
        decisions = self.copies[index].on_result(dataclasses.replace(result, trial=inner))
        return [self._outward(index, d) for d in decisions]

    def finish(self) -> list[Decision]:
        return [self._outward(i, d) for i, copy in enumerate(self.copies) for d in copy.finish()]

    def _outward(self, index: int, decision: Decision) -> Decision:
        return dataclasses.replace(decision, trial=self._outer[(index, decision.trial)])
