"""The event-driven scheduler interface (docs/algorithms.md §7.4).

An executor (a Prefect flow, or the simulator) asks :meth:`Scheduler.next_segment` for work
whenever a worker is free and reports every finished segment to :meth:`Scheduler.on_result`.
Schedulers never touch Prefect, MLflow, Optuna or files: new configurations are the
executor's business (it samples one the first time it sees a trial id).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


@dataclass(frozen=True)
class Segment:
    """Train ``trial`` from resource ``start`` (its checkpoint) up to ``stop``."""

    trial: int
    start: float
    stop: float
    rung: int
    bracket: int = 0
    gpus: float = 1.0
    # Set by schedulers that change a trial's configuration (PBT explore).
    config: Mapping[str, Any] | None = None
    # Copy this trial's checkpoint before training (PBT exploit).
    clone_from: int | None = None


@dataclass(frozen=True)
class Result:
    """What one segment produced. ``loss`` is minimised; a failed segment has ``failed=True``."""

    trial: int
    resource: float
    loss: float
    failed: bool = False
    # (resource, loss) of every report inside the segment, for curve-aware schedulers.
    history: tuple[tuple[float, float], ...] = ()
    seconds: float = 0.0


class Action(StrEnum):
    PROMOTE = "promote"  # another segment of this trial follows
    PAUSE = "pause"  # waits at its rung; it may be promoted later
    STOP = "stop"  # stopped early, for good
    COMPLETE = "complete"  # trained to the maximum resource
    FAIL = "fail"  # the segment raised or reported NaN/inf


@dataclass(frozen=True)
class Decision:
    trial: int
    action: Action
    rung: int


def rank_key(loss: float) -> tuple[bool, float]:
    """Sort key: NaN and inf rank last (§3.6.5)."""
    bad = not math.isfinite(loss)
    return (bad, 0.0 if bad else loss)


def ranked(losses: Mapping[int, float]) -> list[int]:
    """Trial ids, best first. The sort is stable, so ties go to the earlier arrival
    (the mapping's insertion order)."""
    return sorted(losses, key=lambda t: rank_key(losses[t]))


def check_max_trials(max_trials: int | None) -> None:
    """``max_trials`` as every scheduler takes it: a count of configurations, or None."""
    if max_trials is not None and max_trials < 1:
        raise ValueError(f"max_trials must be >= 1 or None, got {max_trials}")


@dataclass
class TrialCounter:
    """Hands out trial ids; brackets that share one never reuse an id."""

    next_id: int = 0

    def new(self) -> int:
        trial, self.next_id = self.next_id, self.next_id + 1
        return trial


class Scheduler(ABC):
    """Decides which segment runs next and what happens to a trial after each result."""

    @abstractmethod
    def next_segment(self) -> Segment | None:
        """The next segment to run, or None when nothing can start now."""

    @abstractmethod
    def on_result(self, result: Result) -> list[Decision]:
        """Record a finished segment; return what became of the trials it affected."""

    def finish(self) -> list[Decision]:
        """The job is over: settle trials still paused. Default: none are."""
        return []


class Stopping(Scheduler):
    """Base of the stopping-type schedulers (docs/algorithms.md §3.5): every trial trains along
    the same segment ends ``levels``; after each segment it either continues, its next
    segment going before any new trial, or stops for good.

    Subclasses validate their own arguments, compute ``levels`` and decide in
    :meth:`on_result` (through :meth:`_continue` or a STOP/COMPLETE/FAIL decision).
    """

    def __init__(self, levels: Iterable[float], max_trials: int | None):
        check_max_trials(max_trials)
        self.levels = list(levels)
        self.max_trials = max_trials
        self._counter = TrialCounter()
        self._level: dict[int, int] = {}  # trial -> index of the segment it runs
        self._continuing: deque[int] = deque()

    def next_segment(self) -> Segment | None:
        if self._continuing:
            trial = self._continuing.popleft()
            k = self._level[trial] + 1
        elif self.max_trials is None or self._counter.next_id < self.max_trials:
            trial, k = self._counter.new(), 0
            self._started(trial)
        else:
            return None
        self._level[trial] = k
        return Segment(trial, self.levels[k - 1] if k else 0, self.levels[k], k)

    def _started(self, trial: int) -> None:
        """A new trial starts (a hook; nothing by default)."""

    def _continue(self, trial: int, k: int) -> list[Decision]:
        self._continuing.append(trial)
        return [Decision(trial, Action.PROMOTE, k)]
