"""FIFO random search: every trial trains in one segment straight to the maximum resource.

The baseline every early-stopping scheduler must beat: no comparison, no waiting, configurations
started in arrival order until ``max_trials``.

Example:
    >>> fifo = Fifo(27, max_trials=2)
    >>> jobs = [fifo.next_segment(), fifo.next_segment(), fifo.next_segment()]
    >>> [(j.trial, j.start, j.stop) for j in jobs[:2]], jobs[2]
    ([(0, 0, 27), (1, 0, 27)], None)
    >>> fifo.on_result(Result(0, 27, 0.1))[0].action
    <Action.COMPLETE: 'complete'>
"""

from __future__ import annotations

from elastune.planners.search.schedulers.base import (
    Action,
    Decision,
    Result,
    Scheduler,
    Segment,
    TrialCounter,
    check_max_trials,
)


class Fifo(Scheduler):
    """Random search with the full budget per trial.

    Args:
        max_resource: Resource every trial is trained to.
        max_trials: How many configurations to start; None runs until the executor's
            deadline or budget ends the job.
    """

    def __init__(self, max_resource: float, max_trials: int | None = None):
        if max_resource <= 0:
            raise ValueError(f"max_resource must be > 0, got {max_resource}")
        check_max_trials(max_trials)
        self.max_resource = max_resource
        self.max_trials = max_trials
        self._counter = TrialCounter()

    def next_segment(self) -> Segment | None:
        if self.max_trials is not None and self._counter.next_id >= self.max_trials:
            return None
        return Segment(self._counter.new(), 0, self.max_resource, 0)

    def on_result(self, result: Result) -> list[Decision]:
        action = Action.FAIL if result.failed else Action.COMPLETE
        return [Decision(result.trial, action, 0)]
