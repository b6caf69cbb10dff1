"""The nominal trace: a plan played once with mean times and mean delays, node by node.

It is what the Gantt chart draws (``elastune.planners.cost.reports.gantt``); the plan simulator
records it (:meth:`elastune.planners.cost.montecarlo.simulate.PlanSimulator.trace`).

Example:
    >>> from elastune.planners.cost.pricing.catalog import read_catalog
    >>> trace = Trace()
    >>> trace.request(0, read_catalog().get("g5.xlarge"), "on-demand", 0.0, [120.0, 150.0])
    (0, 1)
    >>> trace.release([1, 0], 900.0)
    >>> [(n.node, n.ready, n.released) for n in trace.nodes]
    [(0, 120.0, 900.0), (1, 150.0, 900.0)]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from elastune.planners.cost.montecarlo.nodes import Array
from elastune.planners.cost.pricing.allocation import StagePlan
from elastune.planners.cost.pricing.catalog import InstanceType
from elastune.planners.staging.placement import Placement


@dataclass(frozen=True)
class NodeSpan:
    """One node's life in the nominal trace (seconds from job submission)."""

    node: int
    bracket: int
    instance_type: str
    gpus: int
    requested: float
    ready: float
    released: float
    market: str = "on-demand"


@dataclass(frozen=True)
class SegmentSpan:
    """One trial's segment in the nominal trace: GPUs ``[offset, offset+gpus)`` of ``node``."""

    bracket: int
    rung: int
    trial: int
    node: int
    offset: float
    gpus: float
    start: float
    end: float


@dataclass
class Trace:
    """The plan played once with mean times and mean delays: what the Gantt chart draws."""

    nodes: list[NodeSpan] = field(default_factory=list)
    segments: list[SegmentSpan] = field(default_factory=list)
    jct: float = 0.0
    cost: float = 0.0
    _open: dict[int, tuple[int, str, int, float, float, str]] = field(default_factory=dict)

    def request(
        self, bracket: int, instance: InstanceType, market: str, at: float, ready: Iterable[float]
    ) -> tuple[int, ...]:
        ids = []
        for when in ready:
            node = len(self.nodes) + len(self._open)
            self._open[node] = (bracket, instance.name, instance.gpus, at, float(when), market)
            ids.append(node)
        return tuple(ids)

    def release(self, ids: Sequence[int], at: float) -> None:
        for node in ids:
            bracket, name, gpus, requested, ready, market = self._open.pop(node)
            self.nodes.append(NodeSpan(node, bracket, name, gpus, requested, ready, at, market))
        self.nodes.sort(key=lambda n: n.node)

    def stage(
        self,
        stage: StagePlan,
        placement: Placement,
        durations: Array,
        slot_ready: Array,
        ids: Sequence[int],
    ) -> None:
        """The segments of ``stage``: each slot runs its trials in turn from ``slot_ready``,
        on the nodes ``ids``."""
        free = [float(t) for t in slot_ready]  # when each slot is next free
        for trial, slot_index in enumerate(placement.trial_slot):
            slot = placement.slots[slot_index]
            start, free[slot_index] = free[slot_index], free[slot_index] + durations[trial]
            span = SegmentSpan(
                stage.bracket,
                stage.rung,
                trial,
                ids[slot.node],
                slot.offset,
                slot.gpus,
                start,
                free[slot_index],
            )
            self.segments.append(span)
