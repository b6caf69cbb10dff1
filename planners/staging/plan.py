"""The compiled plan: a staged DAG with one stage per rung of every bracket (docs/algorithms.md §9).

Example:
    >>> from elastune.planners.spec import parse_job
    >>> spec = parse_job({"name": "d", "trainable": "m:f", "metric": "acc",
    ...     "space": {"x": {"type": "float", "low": 0, "high": 1}},
    ...     "scheduler": {"name": "sha", "min_resource": 1, "max_resource": 9}})
    >>> [(s.trials, s.start, s.stop) for s in compile_plan(spec).stages]
    [(9, 0, 1), (3, 1, 3), (1, 3, 9)]
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from elastune.planners.search import brackets
from elastune.planners.spec import JobSpec
from elastune.planners.spec.model import HyperbandSpec, ShaSpec


@dataclass(frozen=True)
class Stage:
    """``trials`` segments of bracket ``bracket``, each from ``start`` to ``stop``."""

    bracket: int
    rung: int
    trials: int
    start: float
    stop: float
    gpus_per_trial: float = 1.0
    # Set by a cost planner: segments of this stage that run at once, and where.
    slots: int | None = None
    instance_type: str | None = None
    market: str = "on-demand"  # or "spot"

    @property
    def name(self) -> str:
        return f"b{self.bracket}-r{self.rung}"

    @property
    def work(self) -> float:
        """Resource trained in this stage, resuming from checkpoints."""
        return self.trials * (self.stop - self.start)


@dataclass(frozen=True)
class Plan:
    """Stages in the order the executor first reaches them; brackets are independent chains."""

    stages: tuple[Stage, ...]
    workers: int

    @property
    def trials(self) -> int:
        return sum(s.trials for s in self.stages if s.rung == 0)

    @property
    def segments(self) -> int:
        return sum(s.trials for s in self.stages)

    def stage(self, bracket: int, rung: int) -> Stage:
        return next(s for s in self.stages if (s.bracket, s.rung) == (bracket, rung))

    def to_markdown(self) -> str:
        rows = [
            "| stage | bracket | rung | trials | resource | GPUs/trial | at once | instance |"
            " market |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for s in self.stages:
            rows.append(
                f"| {s.name} | {s.bracket} | {s.rung} | {s.trials} | "
                f"{s.start:g} → {s.stop:g} | {s.gpus_per_trial:g} | "
                f"{s.slots or self.workers} | {s.instance_type or 'local'} | {s.market} |"
            )
        return "\n".join(rows)


class Allocation(Protocol):
    """What a cost planner decided for one stage (see ``elastune.planners.cost``)."""

    bracket: int
    rung: int
    gpus_per_trial: float
    instance_type: str
    concurrent: int
    market: str


def allocate(plan: Plan, allocations: Iterable[Allocation]) -> Plan:
    """The plan with each stage's GPUs per trial, concurrency and instance type set; a
    stage without an allocation keeps its own (a re-plan allocates the stages left)."""
    chosen = {(a.bracket, a.rung): a for a in allocations}
    stages = []
    for stage in plan.stages:
        a = chosen.get((stage.bracket, stage.rung))
        if a is None:
            stages.append(stage)
            continue
        stages.append(
            replace(
                stage,
                gpus_per_trial=a.gpus_per_trial,
                slots=a.concurrent,
                instance_type=a.instance_type,
                market=a.market,
            )
        )
    return Plan(tuple(stages), plan.workers)


def is_staged(spec: JobSpec) -> bool:
    """Synchronous schedulers compile to a staged plan; asynchronous ones unroll at run time."""
    return isinstance(spec.scheduler, ShaSpec | HyperbandSpec)


def compile_plan(spec: JobSpec) -> Plan:
    stages = []
    for index, bracket in enumerate(brackets(spec)):
        start: float = 0
        for rung, level in enumerate(bracket.rungs):
            stages.append(Stage(index, rung, level.trials, start, level.resource))
            start = level.resource
    return Plan(tuple(stages), spec.compute.workers)
