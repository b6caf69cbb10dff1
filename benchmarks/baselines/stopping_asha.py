"""Stopping-type ASHA, as Ray Tune's ``AsyncHyperBandScheduler`` and Syne Tune's stopping
Hyperband run it (docs/algorithms.md §3.5).

A trial never waits: it trains on, and each time it crosses a rung ``r * eta**k`` (below
``max_resource``) it is compared with the values other trials recorded at that rung
before it. The first arrival at a rung always continues. Later ones continue only if their
loss is no worse than the cutoff, the ``100/eta`` percentile (linear interpolation, NaN
ignored) of the losses recorded there, i.e. they rank in the top ``1/eta`` of what came
before; otherwise they stop for good. Either way the trial's own value is then recorded.
Rungs are anchored at the bottom, as in Ray: ``1, 3, 9, 27`` for ``r = 1, R = 52, eta = 3``.

In elastune a trial trains from rung to rung in segments; the decision after each segment
is PROMOTE (its next segment follows, before any new trial) or STOP.

Example:
    >>> asha = StoppingAsha(1, 9, 3)
    >>> jobs = [asha.next_segment() for _ in range(3)]              # three trials to rung 1
    >>> [asha.on_result(Result(j.trial, 1, loss))[0].action.value
    ...  for j, loss in zip(jobs, [0.5, 0.2, 0.6])]             # the first always continues
    ['promote', 'promote', 'stop']
    >>> asha.next_segment()                                         # a survivor goes first
    Segment(trial=0, start=1, stop=3, rung=1, bracket=0, gpus=1.0, config=None, clone_from=None)
"""

from __future__ import annotations

import math

import numpy as np

from elastune.planners.search.schedulers.base import (
    Action,
    Decision,
    Result,
    Stopping,
)
from elastune.planners.spec.geometry import ladder_depth


class StoppingAsha(Stopping):
    """Asynchronous successive halving that stops trials instead of pausing them.

    Args:
        min_resource: The first rung (Ray's ``grace_period``).
        max_resource: A trial that is never stopped trains to this resource.
        eta: Reduction factor (>= 2): a trial must rank in the top ``1/eta`` at each rung.
        max_trials: How many configurations to start; None runs until the executor's
            deadline or budget ends the job.
    """

    def __init__(
        self,
        min_resource: float,
        max_resource: float,
        eta: int = 3,
        max_trials: int | None = None,
    ):
        depth = ladder_depth(min_resource, max_resource, eta)
        rungs = [
            min_resource * eta**k for k in range(depth + 1) if min_resource * eta**k < max_resource
        ]
        super().__init__([*rungs, max_resource], max_trials)  # the last end is not a rung
        self.eta = eta
        self._recorded: list[list[float]] = [[] for _ in rungs]

    def on_result(self, result: Result) -> list[Decision]:
        trial, k = result.trial, self._level[result.trial]
        if result.failed:
            return [Decision(trial, Action.FAIL, k)]
        if k == len(self.levels) - 1:
            return [Decision(trial, Action.COMPLETE, k)]
        recorded = self._recorded[k]
        stop = False
        if recorded:
            cutoff = float(np.nanpercentile(recorded, 100 / self.eta))
            # NaN and inf lose against any finite cutoff.
            stop = not math.isfinite(result.loss) or result.loss > cutoff
        recorded.append(result.loss if math.isfinite(result.loss) else math.nan)
        if stop:
            return [Decision(trial, Action.STOP, k)]
        return self._continue(trial, k)
