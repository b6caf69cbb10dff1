"""The median stopping rule (docs/algorithms.md §7.2, after Google Vizier and Ray Tune), in
segments.

Every trial trains in segments of ``interval`` resource. After each segment that ends at
``t >= grace_period``, the trial is stopped for good when its best loss so far is worse than
the median, over the other trials that reached ``t``, of their mean loss reported in
``[grace_period, t]``, provided at least ``min_samples_required`` of them did. Otherwise its
next segment follows; continuing trials go before new ones.

All trials share the same segment ends, so another trial's running mean at ``t`` is fixed
once it passes ``t``: each end keeps a sorted list of those means and the median costs
``O(log n)`` instead of a scan over every trial's history.

Example:
    >>> rule = MedianStopping(1, 3, min_samples_required=2)
    >>> jobs = [rule.next_segment() for _ in range(3)]     # three trials train to t=1
    >>> for job, loss in zip(jobs, [0.2, 0.4, 0.9]):
    ...     print(job.trial, rule.on_result(Result(job.trial, job.stop, loss))[0].action)
    0 promote
    1 promote
    2 stop
    >>> rule.next_segment()                                 # a survivor continues first
    Segment(trial=0, start=1, stop=2, rung=1, bracket=0, gpus=1.0, config=None, clone_from=None)
"""

from __future__ import annotations

import bisect
import math

from elastune.planners.search.schedulers.base import (
    Action,
    Decision,
    Result,
    Stopping,
)


class MedianStopping(Stopping):
    """Median stopping rule with hard stops.

    Args:
        min_resource: Default for ``interval`` and ``grace_period``.
        max_resource: Resource a surviving trial is trained to.
        interval: Resource per segment; the rule is checked at the end of each.
        grace_period: No trial is stopped before this resource; reports before it do not
            enter the running means.
        min_samples_required: Other trials that must have reached ``t`` before the rule
            may stop a trial at ``t``.
        max_trials: How many configurations to start; None runs until the executor's
            deadline or budget ends the job.
    """

    def __init__(
        self,
        min_resource: float,
        max_resource: float,
        interval: float | None = None,
        grace_period: float | None = None,
        min_samples_required: int = 3,
        max_trials: int | None = None,
    ):
        interval = min_resource if interval is None else interval
        grace_period = min_resource if grace_period is None else grace_period
        if not 0 < interval <= max_resource:
            raise ValueError(
                f"interval must lie in (0, max_resource={max_resource}], got {interval}"
            )
        if grace_period < 0:
            raise ValueError(f"grace_period must be >= 0, got {grace_period}")
        if min_samples_required < 1:
            raise ValueError(f"min_samples_required must be >= 1, got {min_samples_required}")
        count = math.ceil(max_resource / interval - 1e-9)
        super().__init__([min(max_resource, interval * (k + 1)) for k in range(count)], max_trials)
        self.grace_period = grace_period
        self.min_samples_required = min_samples_required
        self._means: list[list[float]] = [[] for _ in self.levels]  # sorted, per segment end
        self._window: dict[int, tuple[float, int]] = {}  # trial -> (sum, count) since grace
        self._best: dict[int, float] = {}

    def on_result(self, result: Result) -> list[Decision]:
        trial, k = result.trial, self._level[result.trial]
        if result.failed:
            return [Decision(trial, Action.FAIL, k)]
        total, count = self._window.get(trial, (0.0, 0))
        for resource, loss in (*result.history, (result.resource, result.loss)):
            self._best[trial] = min(self._best.get(trial, math.inf), loss)
            if resource >= self.grace_period:
                total, count = total + loss, count + 1
        self._window[trial] = (total, count)
        stop = self._stops(trial, k)
        if count:
            bisect.insort(self._means[k], total / count)
        if k == len(self.levels) - 1:
            return [Decision(trial, Action.COMPLETE, k)]
        if stop:
            return [Decision(trial, Action.STOP, k)]
        return self._continue(trial, k)

    def _stops(self, trial: int, k: int) -> bool:
        others = self._means[k]  # running means of the other trials that reached this end
        if self.levels[k] < self.grace_period or len(others) < self.min_samples_required:
            return False
        middle = len(others) // 2
        median = others[middle] if len(others) % 2 else (others[middle - 1] + others[middle]) / 2
        return self._best[trial] > median
