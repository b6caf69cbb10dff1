"""The execution plan: what a job file turns into before anything runs, made in one place
for the tune flow, ``elastune plan`` and ``elastune run``'s mode line.

:func:`resolve_execution` takes the job, what the trainable can do (data-parallel or not), the
CUDA devices of a local worker and the instance catalog, and decides:

* the staged plan (synchronous schedulers; None for asynchronous ones), sized by the cost
  planner when the job has a ``profile:`` and a deadline or budget ("planned"), its widths
  checked (:func:`elastune.planners.staging.widths.check_widths`);
* the admission policy (:mod:`elastune.planners.staging.admission`): the stage packer when the job
packs
  (``compute.packing``: ``auto`` packs where the profile says it pays, ``on`` insists,
  ``off`` never), else the plan's stage slots when planned, else ``compute.workers``;
* the :class:`ExecutionMode` a user reads: planned (and so re-planned in flight) or not,
  packed or not, and what ``compute.workers`` counts.

Example (an asynchronous job: nothing to plan or pack, ``compute.workers`` segments at once):
    >>> from elastune.planners.spec import parse_job
    >>> spec = parse_job({"name": "d", "trainable": "m:f", "metric": "acc",
    ...     "space": {"x": {"type": "float", "low": 0, "high": 1}},
    ...     "scheduler": {"name": "asha", "max_resource": 9}})
    >>> execution = resolve_execution(spec, distributed=False)
    >>> execution.plan is None, execution.admission
    (True, WorkerCap(workers=2, ahead=0))
    >>> print(execution.mode)
    mode: not planned, not packed, workers = segments
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from elastune.planners.cost import Catalog, PlanReport, plan_job
from elastune.planners.cost.reports.plan_report import format_duration
from elastune.planners.search.schedulers.base import Segment
from elastune.planners.spec import MAX_WORKERS, JobSpec, SpecError
from elastune.planners.staging.admission import Admission, StageSlots, WorkerCap
from elastune.planners.staging.plan import Plan, Stage, allocate, compile_plan, is_staged
from elastune.planners.staging.profile import Profile
from elastune.planners.staging.stagepack import StagePacker, stage_packer
from elastune.planners.staging.widths import check_widths


@dataclass(frozen=True)
class ExecutionMode:
    """How a job runs, as one line a user can read.

    Args:
        limits: What the cost planner plans to (``deadline 2h``, ``budget $30.00``); None:
            the job is not planned.
        packed: Whether stages are packed onto their GPUs by width (Fluid).
        workers: What ``compute.workers`` counts: ``segments``, ``GPUs``, or why it is
            not used.
        unplanned: Why a job with a deadline or a budget is not planned; None: it is, or
            has neither.
        replanned: Whether the running job re-plans the stages left from its own segments
            (``flows/replanning.py``): a job RubberBand planned.
        stops_at: The deadline the run stops at (``3m``; ``flows/drive.py``), planned to or
            not; None: it has none.
    """

    limits: str | None
    packed: bool
    workers: str
    unplanned: str | None = None
    replanned: bool = False
    stops_at: str | None = None

    def __str__(self) -> str:
        planned = f"planned ({self.limits})" if self.limits else "not planned"
        if self.unplanned:
            planned += f" ({self.unplanned})"
        parts = [planned, "packed (fluid)" if self.packed else "not packed"]
        if self.limits:
            parts.append("re-planned in flight" if self.replanned else "not re-planned")
        if self.stops_at:
            parts.append(f"stops after {self.stops_at}")
        return f"mode: {', '.join(parts)}, workers = {self.workers}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "planned": self.limits is not None,
            "limits": self.limits,
            "unplanned": self.unplanned,
            "packed": self.packed,
            "replanned": self.replanned,
            "stops_at": self.stops_at,
            "workers": self.workers,
        }


@dataclass(frozen=True)
class Execution:
    """A job's staged plan (None: asynchronous), its admission policy, its mode and, for a
    planned job, the cost planner's report (its forecast is held against the run)."""

    plan: Plan | None
    admission: Admission
    mode: ExecutionMode
    report: PlanReport | None = None

    def stage(self, segment: Segment) -> Stage | None:
        """The segment's stage; None for asynchronous schedulers."""
        return None if self.plan is None else self.plan.stage(segment.bracket, segment.rung)

    def queued_on_nodes(self) -> Execution:
        """This plan on a pool whose nodes queue segments (a warm pool): a job capped at
        ``compute.workers`` hands out as many more, each to wait on its node for the one
        ahead of it to end. Planned and packed jobs keep their stages' concurrency.

        >>> from elastune.planners.spec import parse_job
        >>> spec = parse_job({"name": "d", "trainable": "m:f", "metric": "acc",
        ...     "space": {"x": {"type": "float", "low": 0, "high": 1}}})
        >>> print(resolve_execution(spec, distributed=False).queued_on_nodes().mode)
        mode: not planned, not packed, workers = segments (as many more queued on nodes)
        """
        if not isinstance(self.admission, WorkerCap):
            return self
        mode = replace(self.mode, workers=f"{self.mode.workers} (as many more queued on nodes)")
        return replace(self, admission=self.admission.queued_ahead(), mode=mode)


def resolve_execution(
    spec: JobSpec,
    *,
    distributed: bool,
    devices: int | None = None,
    catalog: Catalog | None = None,
    report: PlanReport | None = None,
) -> Execution:
    """Turn a validated job into its execution plan; bad input raises SpecError naming the
    field (an infeasible deadline or budget, a width that cannot run, packing that cannot).

    Args:
        spec: The job.
        distributed: Whether its trainable trains data-parallel (widths above 1).
        devices: CUDA devices of the local worker (None on CPU or on a work pool).
        catalog: Instance types and prices; default elastune's catalog.
        report: The cost planner's report on ``spec`` when the caller has one, checked
            (``elastune plan``); default: planned here when the job is planned.
    """
    plan = compile_plan(spec) if is_staged(spec) else None
    limits = _limits(spec) if plan is not None else None
    if plan is None or limits is None:
        report = None  # an unplanned job has no forecast
    else:
        if report is None:
            # Every job RubberBand plans is re-planned in flight (flows/replanning.py).
            report = plan_job(spec, catalog=catalog, devices=devices, replanned=True)
            report.check()
        catalog = report.catalog  # the types the plan names (``local``: this machine)
        plan = allocate(plan, report.allocations)
        _check_in_flight(plan)
    if plan is not None:
        check_widths(spec, plan, distributed=distributed, devices=devices)
    packer = _packer(spec, plan, distributed, devices, catalog)
    admission: Admission
    if packer is not None:
        admission = packer
    elif plan is not None and limits is not None:
        admission = StageSlots(plan)
    else:
        admission = WorkerCap(spec.compute.workers)
    workers = _workers(spec, limits, packer)
    unplanned = _unplanned(spec, plan is not None)
    replanned = report is not None and report.planner == "rubberband"
    deadline = spec.budget.deadline
    stops_at = None if deadline is None else format_duration(deadline)
    mode = ExecutionMode(limits, packer is not None, workers, unplanned, replanned, stops_at)
    return Execution(plan, admission, mode, report)


def _check_in_flight(plan: Plan) -> None:
    """Bad input when the cost plan may run more segments at once than one driver keeps
    in flight: the rest would wait for its threads, unseen by the plan. Brackets run side
    by side, each one stage at a time, so the most at once is the sum of each bracket's
    widest stage."""
    widest: dict[int, Stage] = {}
    for stage in sorted(plan.stages, key=lambda s: s.slots or 0):
        widest[stage.bracket] = stage  # sorted: the widest comes last
    at_once = sum(stage.slots or 0 for stage in widest.values())
    if at_once <= MAX_WORKERS:
        return
    if len(widest) == 1:
        (only,) = widest.values()
        where = f"{at_once} segments of stage {only.name} at once"
    else:
        named = ", ".join(f"{s.name} {s.slots}" for s in widest.values() if s.slots)
        where = f"up to {at_once} segments at once (its brackets side by side: {named})"
    raise SpecError(
        f"compute.max_gpus: the cost plan runs {where}, more than the {MAX_WORKERS} a job "
        f"keeps in flight; set compute.max_gpus to {MAX_WORKERS} or less"
    )


def _limits(spec: JobSpec) -> str | None:
    """What the cost planner plans a job to; None when it does not plan the job (it needs
    a profile, and a deadline or a budget)."""
    deadline, budget = spec.budget.deadline, spec.budget.max_cost_usd
    if spec.profile is None or (deadline is None and budget is None):
        return None
    limits = [] if deadline is None else [f"deadline {format_duration(deadline)}"]
    return ", ".join([*limits, *([] if budget is None else [f"budget ${budget:,.2f}"])])


def _unplanned(spec: JobSpec, staged: bool) -> str | None:
    """Why the cost planner leaves a job with a deadline or a budget unplanned; None when
    it plans it, or the job has neither."""
    asked = [k for k, v in spec.budget.model_dump().items() if v is not None]
    if not asked:
        return None
    ignored = " and ".join(f"budget.{k}" for k in asked) + " not planned to"
    if not staged:
        name = spec.scheduler.name
        return f"{ignored}: {name} is asynchronous, the cost planner plans sha and hyperband"
    if spec.profile is None:
        return f"{ignored}: the job has no profile, `elastune profile` measures one"
    return None


def _packer(
    spec: JobSpec,
    plan: Plan | None,
    distributed: bool,
    devices: int | None,
    catalog: Catalog | None,
) -> StagePacker | None:
    """The stage packer as ``compute.packing`` asks; ``on`` where it cannot is bad input."""
    if spec.compute.packing == "off":
        return None
    # Only a planned plan names instance types, and then the catalog was read to plan it:
    # every type's node, since a re-plan in flight may move a stage to another type.
    nodes = dict(catalog.instance_types) if catalog else {}
    packer = stage_packer(spec, plan, distributed=distributed, devices=devices, nodes=nodes)
    if packer is None and spec.compute.packing == "on":
        raise SpecError(f"compute.packing: on, but {_why_not_packed(spec, plan, distributed)}")
    return packer


def _why_not_packed(spec: JobSpec, plan: Plan | None, distributed: bool) -> str:
    if plan is None:
        return (
            f"scheduler {spec.scheduler.name} is asynchronous: only the stages of sha and "
            "hyperband are packed"
        )
    if spec.profile is None or not Profile.from_spec(spec.profile).packable:
        return (
            "packing needs a profile: section that times one whole GPU (seconds_per_unit: {1: ...})"
        )
    trainable = "" if distributed else f", trainable {spec.trainable} is not distributed"
    return (
        "the profile gives no width that packs faster: no speedup above 1 GPU within reach "
        f"(compute.max_gpus: {spec.compute.max_gpus}{trainable}) and no GPU share that pays"
    )


def _workers(spec: JobSpec, limits: str | None, packer: StagePacker | None) -> str:
    if limits is not None:
        return "not used (the cost plan sets each stage's concurrency)"
    if packer is None:
        return "segments"
    if spec.compute.max_gpus is not None:
        return f"not used (stages share compute.max_gpus = {spec.compute.max_gpus} GPUs)"
    return "GPUs"
