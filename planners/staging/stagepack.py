"""Fluid in the staged flow: every stage is a TrialGroup packed onto the GPUs it has.

A synchronous stage (one rung of one bracket) is the TrialGroup of docs/algorithms.md §6: the
scheduler waits for all of its segments. When its first segment asks to start, the stage's
segments still to run are packed over the GPUs free for the stage right now: StaticFluid's
water-filling widths from the profile's speedup, or its water-level allotment, or one width
for all, whichever packs shortest (:func:`elastune.planners.staging.fluid.best_rigid`). Its segments
then start in turn at the planned widths, each as soon as that many GPUs are free: admission
counts GPUs, not segments. At the top rungs, where fewer trials remain than GPUs, the
survivors get the idle GPUs (width > 1).

Which GPUs a stage has:

* a stage the cost planner sized (``Stage.slots``): its own ``slots x gpus_per_trial``;
* otherwise one pool shared by every stage that runs: ``compute.max_gpus``, or
  ``compute.workers`` GPUs. A stage that starts while others run packs over what they left
  (DynamicFluid's "later groups get what is left", §6.4).

A running segment keeps its width: a Prefect task cannot be widened in flight, so this is
StaticFluid's rule (§6.3), not DynamicFluid's rescaling.

Every segment of a stage trains the same resource, so the group's heights are equal and the
widths depend on the speedup and on what each segment pays outside its units (the
profile's overhead, counted per segment: more waves pay it more often); measured speeds per
trial would not change them.

Example (rung 0: four trials on two GPUs, one GPU each; the top rung's survivor takes both):
    >>> from elastune.planners.staging.profile import Profile
    >>> from elastune.planners.staging.plan import Plan, Stage
    >>> plan = Plan((Stage(0, 0, 4, 0, 1), Stage(0, 1, 1, 1, 3)), workers=2)
    >>> packer = StagePacker(plan, Profile.from_speeds({2: 1.8}), gpus=2)
    >>> rung0 = [Segment(t, 0, 1, rung=0) for t in range(4)]
    >>> [packer.may_start(s, rung0[:i]) for i, s in enumerate(rung0)]
    [True, True, False, False]
    >>> packer.may_start(rung0[2], rung0[1:2]), packer.width(rung0[2])
    (True, 1.0)
    >>> top = Segment(0, 1, 3, rung=1)
    >>> packer.may_start(top, []), packer.width(top)
    (True, 2.0)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

from elastune.planners.search import Segment
from elastune.planners.spec import JobSpec
from elastune.planners.staging.fluid import StaticFluid, best_rigid
from elastune.planners.staging.packing import Work
from elastune.planners.staging.plan import Plan, Stage
from elastune.planners.staging.profile import GpuNode, Profile

_EPS = 1e-9
SegmentKey = tuple[int, int, int]  # (bracket, rung, trial): one segment of a synchronous job


@dataclass
class _Group:
    """A stage's planned widths of the segments still to start, in the order they start."""

    widths: list[float]
    started: int = 0  # segments of the stage admitted so far


@dataclass
class _Admitted:
    segment: Segment
    width: float
    scope: tuple[int, int] | None  # the stage whose GPUs it holds; None: the shared pool


@dataclass
class StagePacker:
    """Widths and admission of a staged job's segments (see the module docstring).

    Args:
        plan: The staged plan; stages with ``slots`` have their own GPUs.
        profile: Speed at each width (the job's profile, :attr:`Profile.packable`).
        gpus: GPUs of the pool shared by stages without ``slots``.
        max_width: Most GPUs one segment may use (e.g. the worker's devices, or 1 for a
            trainable that is not data-parallel); default the widest the profile covers.
        gpus_per_node: GPUs per node of the shared pool (a segment's workers stay on one).
        nodes: Each instance type a planned stage may run on (the catalog's): its GPUs per
            node, and its GPU model's speed.
        max_share: Most segments sharing one GPU; default every count the profile measured.
    """

    plan: Plan
    profile: Profile
    gpus: int
    max_width: int | None = None
    gpus_per_node: int | None = None
    nodes: Mapping[str, GpuNode] = field(default_factory=dict)
    max_share: int | None = None
    stages_side_by_side: ClassVar[bool] = False
    _groups: dict[tuple[int, int], _Group] = field(default_factory=dict, init=False)
    _admitted: dict[SegmentKey, _Admitted] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.gpus, int) or self.gpus < 1:
            raise ValueError(f"gpus must be an integer >= 1, got {self.gpus!r}")
        if self.max_width is not None and self.max_width < 1:
            raise ValueError(f"max_width must be >= 1, got {self.max_width}")
        if self.gpus_per_node is not None and self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be >= 1, got {self.gpus_per_node}")
        if self.max_share is None:
            self.max_share = max(self.profile.sharing, default=1)
        if self.max_share != 1 and self.max_share not in self.profile.sharing:
            raise ValueError(
                f"max_share {self.max_share} is not covered by the profile "
                f"(sharing measured for {sorted(self.profile.sharing) or 'no counts'})"
            )

    # --- what the flow asks ---------------------------------------------------------------

    def may_start(self, segment: Segment, running: Sequence[Segment]) -> bool:
        """May ``segment`` start now, next to ``running``? If so, it is admitted at the width
        :meth:`width` returns. Segments admitted earlier and missing from ``running`` have
        finished: their GPUs are free again."""
        self._forget(running)
        key = _key(segment)
        if key in self._admitted:
            raise ValueError(f"segment {key} was admitted already and has not finished")
        stage = self.plan.stage(segment.bracket, segment.rung)
        scope = self._scope(stage)
        free = self._budget(stage) - self._used(scope)
        group = self._groups.setdefault((stage.bracket, stage.rung), _Group([]))
        if not group.widths:  # the stage's first segment (or more than it planned for)
            widths = self._pack(stage, free, group.started)
            if widths is None:
                return False
            group.widths = widths
        width = group.widths[0]
        if width > free + _EPS:
            return False
        group.widths.pop(0)
        group.started += 1
        self._admitted[key] = _Admitted(segment, width, scope)
        return True

    def width(self, segment: Segment) -> float:
        """The width ``segment`` was admitted at."""
        admitted = self._admitted.get(_key(segment))
        if admitted is None:
            raise ValueError(f"segment {_key(segment)} was not admitted by may_start")
        return admitted.width

    def may_start_any(self, running: Sequence[Segment]) -> bool:
        """Is there room for one more segment of some stage?"""
        self._forget(running)
        if self._shared:
            return self.gpus - self._used(None) >= self._narrowest - _EPS
        total = sum(self._budget(s) for s in self.plan.stages)
        return total - sum(a.width for a in self._admitted.values()) >= self._narrowest - _EPS

    def replanned(self, plan: Plan, draining: frozenset[SegmentKey] = frozenset()) -> StagePacker:
        """This packer on ``plan``, the same stages re-planned in flight (other nodes, GPUs
        or instance type): the segments admitted keep their widths, and a stage whose
        allocation changed packs the segments it has not started over its new GPUs. The
        segments ``draining`` (bracket, rung, trial) end on the nodes the stage left: they
        hold none of its GPUs."""
        packer = replace(self, plan=plan)
        packer._admitted = {
            key: replace(a, scope=None) if key in draining else a
            for key, a in self._admitted.items()
        }
        for key, group in self._groups.items():
            kept = self.plan.stage(*key) == plan.stage(*key)
            packer._groups[key] = _Group(list(group.widths) if kept else [], group.started)
        return packer

    def demand(self, stages: Sequence[Stage]) -> tuple[int, float]:
        """Pool sizing for the ``stages`` now active: (segments at once, GPUs per segment)
        such that their product is the GPUs the stages have, in units of the narrowest width
        (a segment of width ``w`` takes ``w`` units' worth of them)."""
        gpus = self.gpus if self._shared else sum(self._budget(s) for s in stages)
        return max(1, math.floor(gpus / self._narrowest + _EPS)), self._narrowest

    # --- internals ------------------------------------------------------------------------

    @property
    def _shared(self) -> bool:
        return any(stage.slots is None for stage in self.plan.stages)

    @property
    def _narrowest(self) -> float:
        """The narrowest width the packer may choose: a share of a GPU only where it pays."""
        shares = [
            1 / c
            for c, sigma in self.profile.sharing.items()
            if c <= (self.max_share or 1) and c * sigma > 1
        ]
        return min(shares, default=1.0)

    def _scope(self, stage: Stage) -> tuple[int, int] | None:
        return None if self._shared else (stage.bracket, stage.rung)

    def _budget(self, stage: Stage) -> float:
        if self._shared:
            return float(self.gpus)
        assert stage.slots is not None
        # A stage holds at least one GPU (its node), so every segment can start eventually.
        return max(1.0, stage.slots * stage.gpus_per_trial)

    def _used(self, scope: tuple[int, int] | None) -> float:
        return sum(a.width for a in self._admitted.values() if a.scope == scope)

    def _forget(self, running: Sequence[Segment]) -> None:
        alive = {_key(s) for s in running}
        for key in [k for k in self._admitted if k not in alive]:
            del self._admitted[key]

    def _pack(self, stage: Stage, free: float, started: int) -> list[float] | None:
        """Widths for the stage's segments not started yet, packed over ``free`` GPUs, in
        the order they start; None when not even the narrowest width is free."""
        if free < 1 - _EPS:  # a share of one GPU is left: the narrowest width, if it fits
            return [self._narrowest] if free >= self._narrowest - _EPS else None
        gpus = math.floor(free + _EPS)
        node = self.gpus_per_node
        instance = self.nodes.get(stage.instance_type or "") if stage.slots is not None else None
        if instance is not None:
            node = instance.gpus
        node = min(gpus, node or gpus)
        cap = min(node, self.max_width or node)
        widest = max(g for g in self.profile.speedup if g <= cap)
        packer = StaticFluid(
            self.profile, gpus, gpus_per_node=node, max_width=widest, max_share=self.max_share
        )
        # Equal heights: every segment of a stage trains the same resource. Each also pays
        # the profile's overhead, in units of one GPU's unit time: more waves pay it more.
        count = max(1, stage.trials - started)
        unit = self.profile.timing(1, instance).mean  # on the stage's GPU model
        overhead = self.profile.segment_overhead(stage.start == 0) / unit
        group = [Work(i, stage.stop - stage.start, 1.0, overhead) for i in range(count)]
        schedule = best_rigid(packer, group)
        order = sorted(schedule.rectangles, key=lambda p: (p.start, -p.width, p.trial))
        return [p.width for p in order]


def _key(segment: Segment) -> SegmentKey:
    return segment.bracket, segment.rung, segment.trial


def stage_packer(
    spec: JobSpec,
    plan: Plan | None,
    *,
    distributed: bool,
    devices: int | None = None,
    nodes: Mapping[str, GpuNode] | None = None,
) -> StagePacker | None:
    """The job's stage packer, or None where packing changes nothing (no staged plan, no
    profile, or one that gives no width but 1): the flow then admits segments as before.

    Args:
        spec: The validated job (its profile, ``compute.max_gpus`` and ``compute.workers``).
        plan: Its staged plan (None for asynchronous schedulers).
        distributed: Whether the trainable trains data-parallel (widths above 1).
        devices: CUDA devices of the local worker (None on CPU, where ranks are processes).
        nodes: Each instance type a planned stage may run on (the catalog's).
    """
    if plan is None or spec.profile is None:
        return None
    profile = Profile.from_spec(spec.profile)
    if not profile.packable:
        return None
    gpus = spec.compute.max_gpus or spec.compute.workers
    caps = [spec.compute.max_gpus, devices, None if distributed else 1]
    max_width = min((c for c in caps if c is not None), default=None)
    reach = min(gpus, max_width or gpus)
    wide = any(s > 1 for g, s in profile.speedup.items() if 1 < g <= reach)
    pays = any(c * sigma > 1 for c, sigma in profile.sharing.items())
    if not wide and not pays:
        return None
    return StagePacker(
        plan,
        profile,
        gpus,
        max_width=max_width,
        gpus_per_node=devices,
        nodes=dict(nodes or {}),
    )
