"""Synchronous Hyperband (docs/algorithms.md §2.2): its brackets run as independent chains.

A worker that finds the current bracket waiting at a barrier starts work from the next
bracket, so brackets overlap in time instead of leaving workers idle.

Example:
    >>> hb = Hyperband(1, 9, 3)
    >>> [b.bracket.trials for b in hb.brackets]
    [9, 5, 3]
    >>> first = [hb.next_segment() for _ in range(17)]
    >>> sorted({(job.bracket, job.stop) for job in first})
    [(0, 1), (1, 3), (2, 9)]
"""

from __future__ import annotations

from elastune.planners.search.schedulers.base import (
    Decision,
    Result,
    Scheduler,
    Segment,
    TrialCounter,
)
from elastune.planners.search.schedulers.sha import SuccessiveHalving
from elastune.planners.spec.geometry import hyperband_brackets


class Hyperband(Scheduler):
    """All Hyperband brackets for ``min_resource``..``max_resource`` at reduction ``eta``.

    Args:
        min_resource: Least resource at which trials are compared.
        max_resource: Resource every finalist is trained to.
        eta: Reduction factor, at least 2.
    """

    def __init__(self, min_resource: float, max_resource: float, eta: int):
        if eta < 2:
            raise ValueError(f"eta must be >= 2, got {eta}")
        counter = TrialCounter()
        self.brackets = [
            SuccessiveHalving(bracket, counter, index)
            for index, bracket in enumerate(hyperband_brackets(min_resource, max_resource, eta))
        ]
        self._owner: dict[int, SuccessiveHalving] = {}

    def next_segment(self) -> Segment | None:
        for bracket in self.brackets:
            job = bracket.next_segment()
            if job is not None:
                self._owner[job.trial] = bracket
                return job
        return None

    def on_result(self, result: Result) -> list[Decision]:
        return self._owner[result.trial].on_result(result)
