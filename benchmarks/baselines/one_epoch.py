"""The one-epoch baseline of T. Egele, J. Koch, P. Balaprakash et al., "The Unreasonable
Effectiveness of Early Discarding Baselines in Hyperparameter Optimization" (2023, arXiv
2307.15422): train every configuration one epoch, keep the top ``keep``, train those to the
end. Run under a deadline it goes round by round: a round screens ``screen`` new
configurations for one epoch; once all its results are in, its ``keep`` best resume from
their checkpoint and train to ``max_resource``, ahead of the next round's screening, which
idle workers start meanwhile.

Example (a round of four, the best two kept):
    >>> one = OneEpoch(9, screen=4, keep=2)
    >>> first = [one.next_segment() for _ in range(4)]
    >>> [(s.trial, s.stop) for s in first]
    [(0, 1), (1, 1), (2, 1), (3, 1)]
    >>> for s, loss in zip(first, [0.5, 0.2, 0.6, 0.3]):
    ...     _ = one.on_result(Result(s.trial, 1, loss))
    >>> [(s.trial, s.start, s.stop) for s in (one.next_segment() for _ in range(3))]
    [(1, 1, 9), (3, 1, 9), (4, 0, 1)]
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


class OneEpoch(Scheduler):
    """Screen ``screen`` configurations per round for one epoch, train the ``keep`` best.

    Args:
        max_resource: Epochs a kept configuration trains to.
        screen: New configurations per round (>= 1).
        keep: How many of a round go on to ``max_resource`` (1..screen).
    """

    def __init__(self, max_resource: int, screen: int = 100, keep: int = 3):
        if screen < 1:
            raise ValueError(f"screen must be >= 1, got {screen}")
        if not 1 <= keep <= screen:
            raise ValueError(f"keep must lie in 1..screen={screen}, got {keep}")
        self.max_resource, self.screen, self.keep = max_resource, screen, keep
        self._counter = TrialCounter()
        self._round: dict[int, int] = {}  # screened trial -> its round
        self._losses: dict[int, dict[int, float]] = {}  # round -> trial -> one-epoch loss
        self._kept: deque[int] = deque()

    def next_segment(self) -> Segment | None:
        if self._kept:
            return Segment(self._kept.popleft(), 1, self.max_resource, 1)
        trial = self._counter.new()
        self._round[trial] = trial // self.screen
        return Segment(trial, 0, 1, 0)

    def on_result(self, result: Result) -> list[Decision]:
        trial = result.trial
        if result.resource >= self.max_resource:
            return [Decision(trial, Action.COMPLETE, 1)]
        if result.failed:
            return [Decision(trial, Action.FAIL, 0)]
        losses = self._losses.setdefault(self._round[trial], {})
        losses[trial] = result.loss
        if len(losses) < self.screen:
            return [Decision(trial, Action.PAUSE, 0)]
        best = ranked(losses)[: self.keep]
        self._kept.extend(best)
        return [Decision(t, Action.PROMOTE if t in best else Action.STOP, 0) for t in losses]
