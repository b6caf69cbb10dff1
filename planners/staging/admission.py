"""Admission: which of a job's segments may start now, at what width, and what the pool
must hold for the stages that run.

Three policies, one per way a job runs; the execution plan chooses one
(:func:`elastune.planners.execution.resolve_execution`):

* :class:`WorkerCap`: at most ``compute.workers`` segments at once, one GPU each
  (asynchronous schedulers, and staged plans the cost planner did not size), and on a warm
  pool as many more queued on their nodes;
* :class:`StageSlots`: each stage at the concurrency the cost planner gave it, at its
  planned GPUs per trial;
* :class:`planners.stagepack.StagePacker`: each stage's segments packed onto its GPUs by
  width (Fluid); admission counts GPUs, not segments.

Example (two workers; a third segment waits until one finishes):
    >>> cap = WorkerCap(2)
    >>> a, b, c = (Segment(t, 0, 1, rung=0) for t in range(3))
    >>> cap.may_start(a, []), cap.may_start(b, [a]), cap.may_start(c, [a, b])
    (True, True, False)
    >>> cap.may_start_any([b]), cap.width(c), cap.demand([])
    (True, 1.0, (2, 1.0))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from elastune.planners.search.schedulers.base import Segment
from elastune.planners.staging.plan import Plan, Stage


class Admission(Protocol):
    """What the driver asks before it starts segments, and before it sizes the pool."""

    #: Each stage has slots of its own, so a segment waiting for its stage does not stop
    #: the driver drawing segments of other stages (Hyperband's brackets side by side).
    stages_side_by_side: ClassVar[bool]

    def may_start(self, segment: Segment, running: Sequence[Segment]) -> bool:
        """May ``segment`` start now, next to ``running``? If so, it is admitted."""
        ...

    def may_start_any(self, running: Sequence[Segment]) -> bool:
        """Is there room for one more segment of some stage?"""
        ...

    def width(self, segment: Segment) -> float:
        """The GPUs an admitted ``segment`` runs on."""
        ...

    def demand(self, stages: Sequence[Stage]) -> tuple[int, float]:
        """Pool size for the ``stages`` now active (none: an asynchronous job): segments
        at once and GPUs per segment."""
        ...


@dataclass(frozen=True)
class WorkerCap:
    """At most ``workers`` segments at once, each at the width it was handed out with, and
    ``ahead`` more handed out early: on a warm pool each waits on its node and starts there
    as a segment ends, without the driver's round trip (:meth:`queued_ahead`)."""

    workers: int
    ahead: int = 0
    stages_side_by_side: ClassVar[bool] = False

    def may_start(self, segment: Segment, running: Sequence[Segment]) -> bool:
        return len(running) < self.workers + self.ahead

    def may_start_any(self, running: Sequence[Segment]) -> bool:
        return len(running) < self.workers + self.ahead

    def queued_ahead(self) -> WorkerCap:
        """The same cap with one segment queued behind each of its ``workers``.

        >>> WorkerCap(2).queued_ahead().may_start_any([Segment(t, 0, 1, 0) for t in range(3)])
        True
        """
        return WorkerCap(self.workers, ahead=self.workers)

    def width(self, segment: Segment) -> float:
        return segment.gpus

    def demand(self, stages: Sequence[Stage]) -> tuple[int, float]:
        # An asynchronous job has no stages: the pool holds every worker the whole time.
        slots = min(self.workers, sum(s.trials for s in stages)) if stages else self.workers
        return slots, max((s.gpus_per_trial for s in stages), default=1.0)


@dataclass(frozen=True)
class StageSlots:
    """Each stage at most at its planned concurrency (``Stage.slots``, set by the cost
    planner for every stage), each segment at its stage's GPUs per trial. ``draining``:
    segments (bracket, rung, trial) that a re-plan moved their stage away from (another
    instance type or market): they end where they run and take none of its slots."""

    plan: Plan
    draining: frozenset[tuple[int, int, int]] = frozenset()
    stages_side_by_side: ClassVar[bool] = True

    def may_start(self, segment: Segment, running: Sequence[Segment]) -> bool:
        return self._has_room(self._stage(segment), running)

    def may_start_any(self, running: Sequence[Segment]) -> bool:
        """A bracket's stages run one after another (a rung waits for the barrier of the
        one before it), so a bracket with segments running has room only in the lowest
        stage it runs, and one with none in any of its stages. (Counting every stage's
        slots drew a planned SHA job's whole first rung from the sampler before its first
        segment started: the slots idle while it proposed, and none of the rung's results
        there to propose from.)"""
        lowest: dict[int, int] = {}
        for segment in running:
            lowest[segment.bracket] = min(lowest.get(segment.bracket, segment.rung), segment.rung)
        for stage in self.plan.stages:
            rung = lowest.get(stage.bracket)
            if rung is None and (stage.slots or 0) > 0:
                return True
            if rung == stage.rung and self._has_room(stage, running):
                return True
        return False

    def width(self, segment: Segment) -> float:
        return self._stage(segment).gpus_per_trial

    def demand(self, stages: Sequence[Stage]) -> tuple[int, float]:
        return sum(s.slots or 0 for s in stages), max(s.gpus_per_trial for s in stages)

    def replanned(
        self, plan: Plan, draining: frozenset[tuple[int, int, int]] = frozenset()
    ) -> StageSlots:
        """The same policy on ``plan``, the job's stages re-planned in flight, the segments
        ``draining`` (bracket, rung, trial) left out of their stage's slots."""
        return StageSlots(plan, self.draining | draining)

    def _stage(self, segment: Segment) -> Stage:
        return self.plan.stage(segment.bracket, segment.rung)

    def _has_room(self, stage: Stage, running: Sequence[Segment]) -> bool:
        key = (stage.bracket, stage.rung)
        same = sum(
            (s.bracket, s.rung) == key and (*key, s.trial) not in self.draining for s in running
        )
        return same < (stage.slots or 0)
