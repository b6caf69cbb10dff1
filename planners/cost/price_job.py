"""``plan_job``: a job file in, a priced plan out. What ``elastune plan`` calls.

RubberBand (the default) prices the job's own geometry (``compile_plan``: SHA is one
bracket, Hyperband's brackets are independent chains) and finds its cheapest allocation
meeting ``budget.deadline``; ``budget.max_cost_usd`` is then checked. SEER chooses the
number of trials itself from the scheduler's ``eta``, ``min_resource`` and
``max_resource``, and needs both a deadline and a budget.

A job on this machine (the local pool, or ``compute.instance_types: [local]``) is planned on the
``local`` type (:mod:`elastune.planners.cost.pricing.this_machine`): its slots, its price, no
catalog.

A job that ``elastune run`` re-plans after its first wave (``replanned``: every job RubberBand
plans, :mod:`elastune.flows.replanning`) starts from
:func:`~elastune.planners.cost.inflight.recourse.recourse_start`'s plan where there is one (one
chain, a deadline, on-demand, at most :data:`~elastune.planners.cost.inflight.recourse.MAX_OPTIONS`
first-stage options, not free): its first stage chosen for the re-planning to come, the rest
RubberBand's; the report names RubberBand's own first stage, or why the start is its.

``compute.spot: true`` lets RubberBand put stages on spot instances where that is cheaper
and the p95 JCT, interruptions included, still meets the deadline. SEER ignores it and
plans on-demand capacity (the report says so). Static baselines are on-demand pools.

Example:
    >>> from elastune.planners.spec import parse_job
    >>> spec = parse_job({"name": "d", "trainable": "m:f", "metric": "acc",
    ...     "space": {"x": {"type": "float", "low": 0, "high": 1}},
    ...     "scheduler": {"name": "sha", "min_resource": 1, "max_resource": 9},
    ...     "budget": {"deadline": "2h"},
    ...     "compute": {"instance_types": ["g5.xlarge", "g5.12xlarge"]},
    ...     "profile": {"seconds_per_unit": {1: 300}, "speedup": {2: 1.8, 4: 3.2}}})
    >>> report = plan_job(spec)
    >>> report.feasible, report.allocation(0, 0).trials
    (True, 9)
    >>> report.to_dict()["jct_s"]["p95"] <= 2 * 3600
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, NamedTuple

from elastune.planners.cost.inflight.recourse import (
    MAX_OPTIONS,
    NoStart,
    first_options,
    recourse_start,
)
from elastune.planners.cost.inflight.replanner import Replanner
from elastune.planners.cost.montecarlo.outcome import Outcome
from elastune.planners.cost.montecarlo.simulate import PlanSimulator
from elastune.planners.cost.planning.baselines import static_baselines
from elastune.planners.cost.planning.rubberband import Move, RubberBand
from elastune.planners.cost.planning.seer import Seer
from elastune.planners.cost.pricing.allocation import AllocationPlan
from elastune.planners.cost.pricing.catalog import Catalog, read_catalog
from elastune.planners.cost.pricing.stage_shapes import chains_of
from elastune.planners.cost.pricing.this_machine import (
    check_brackets,
    local_catalog,
    local_slots,
    plans_local,
)
from elastune.planners.cost.reports.plan_report import (
    PlanReport,
    Problem,
    format_duration,
    rows_for,
)
from elastune.planners.spec import JobSpec, SpecError
from elastune.planners.staging import Profile, compile_plan

PLANNERS = ("rubberband", "seer")


def job_profile(spec: JobSpec) -> Profile:
    if spec.profile is None:
        raise SpecError(
            "profile: the job has no profile; add a profile: section (seconds per resource "
            "unit per GPU count) or measure one with `elastune profile`"
        )
    return Profile.from_spec(spec.profile)


def instance_types(spec: JobSpec, catalog: Catalog, profile: Profile) -> list[str]:
    """The job's instance types, checked; by default every type the profile covers."""
    if spec.compute.instance_types:
        return [t.name for t in catalog.select(spec.compute.instance_types)]
    names = [
        name
        for name, t in catalog.instance_types.items()
        if profile.covers(t) and profile.counts_for(t)
    ]
    if not names:
        raise SpecError(
            "compute.instance_types: no instance type in the catalog fits the profile "
            "(its GPU model and GPU counts)"
        )
    return names


def plan_job(
    spec: JobSpec,
    planner: Literal["rubberband", "seer"] = "rubberband",
    catalog: Catalog | None = None,
    *,
    profile: Profile | None = None,
    samples: int = 200,
    seed: int = 0,
    packing: bool = False,
    devices: int | None = None,
    replanned: bool = False,
) -> PlanReport:
    """Plan and price ``spec``; the report says if the deadline or budget cannot be met.

    Args:
        spec: The validated job.
        planner: ``rubberband`` (cheapest plan meeting the deadline) or ``seer`` (most
            trials within deadline and budget).
        catalog: Prices and instance types; default: elastune's catalog, or this machine
            (the ``local`` type) for a job on the local pool that names no types.
        profile: Timings; default: the job file's ``profile:`` section.
        samples: Monte Carlo samples per plan.
        seed: Seed of the simulated stragglers and delays.
        packing: Price every stage as Fluid packs it onto its nodes (the staged flow's
            stage packer): trials take the widths StaticFluid chooses over the stage's
            GPUs instead of the plan's GPUs per trial (``PlanSimulator(packing=True)``).
        devices: CUDA devices of this machine (None: CPU): a local job's slots.
        replanned: The job is re-planned in flight: start it from the recourse start.
    """
    if planner not in PLANNERS:
        raise SpecError(f"--planner: unknown planner {planner!r} (use rubberband or seer)")
    profile = profile if profile is not None else job_profile(spec)
    local = plans_local(spec, catalog_given=catalog is not None)
    if local:
        check_brackets(spec, len(chains_of(compile_plan(spec).stages)), devices)
        catalog = local_catalog(spec, profile.gpu, devices)
    elif catalog is None:
        catalog = read_catalog()
    names = instance_types(spec, catalog, profile)
    max_gpus = local_slots(spec, devices) if local else spec.compute.max_gpus
    simulator = PlanSimulator(catalog, profile, samples=samples, seed=seed, packing=packing)
    chosen = _rubberband if planner == "rubberband" else _seer
    planned = chosen(spec, simulator, names, max_gpus)
    if replanned and planner == "rubberband" and not packing:
        planned = _recourse(spec, simulator, names, max_gpus, planned)
    plan, outcome = planned.plan, planned.outcome
    deadline, budget = spec.budget.deadline, spec.budget.max_cost_usd
    baselines = static_baselines(simulator, plan, names, deadline=deadline, max_gpus=max_gpus)
    return PlanReport(
        planner,
        plan,
        outcome,
        rows_for(plan, outcome, catalog),
        baselines,
        catalog,
        deadline,
        budget,
        samples,
        planned.problems,
        planned.details,
        simulator.trace(plan),
        spec.compute.spot,
    )


class _Planned(NamedTuple):
    """What a planner chose, the budget fields it cannot meet, and its report details."""

    plan: AllocationPlan
    outcome: Outcome
    problems: tuple[Problem, ...]
    details: dict[str, object]


def _rubberband(
    spec: JobSpec, simulator: PlanSimulator, names: list[str], max_gpus: int | None
) -> _Planned:
    """RubberBand's cheapest plan meeting the deadline; the budget is checked after."""
    deadline, budget = spec.budget.deadline, spec.budget.max_cost_usd
    spot = spec.compute.spot
    rubberband = RubberBand(simulator, names, deadline=deadline, max_gpus=max_gpus, spot=spot)
    result = rubberband.plan(compile_plan(spec).stages)
    plan, outcome = result.plan, result.outcome
    problems: list[Problem] = []
    details: dict[str, object] = {}
    if result.smallest_deadline is not None:
        problems.append(_unmet("budget.deadline", deadline, result.smallest_deadline))
    elif budget is not None and outcome.cost_q > budget:
        problems.append(
            _unmet("budget.max_cost_usd", budget, math.ceil(outcome.cost_q * 100) / 100)
        )
    if spot:
        on_spot = any(stage.market == "spot" for stage in plan.stages)
        details["spot_feasibility"] = {
            "rule": (
                "a plan with spot stages meets the deadline at the one-sided "
                f"{rubberband.spot_confidence:.0%} upper confidence bound of its p95 JCT"
            ),
            "jct_s_judged": round(rubberband.judged(outcome.jct, on_spot), 1),
        }
    details["search"] = {"moves": [_move(m, spot) for m in result.moves]}
    return _Planned(plan, outcome, tuple(problems), details)


def _recourse(
    spec: JobSpec,
    simulator: PlanSimulator,
    names: list[str],
    max_gpus: int | None,
    planned: _Planned,
) -> _Planned:
    """``planned`` (RubberBand's) with its first stage chosen for the re-planning to come,
    where a recourse start applies and stays within the budget; else ``planned``, the
    report saying why when the job is too large to choose."""
    deadline, budget = spec.budget.deadline, spec.budget.max_cost_usd
    stages = compile_plan(spec).stages
    free = planned.outcome.cost_mean <= 0  # nothing to save
    if planned.problems or deadline is None or spec.compute.spot or free:
        return planned
    if len(chains_of(stages)) != 1:
        return planned
    replanner = Replanner(
        simulator.catalog,
        names,
        stages,
        deadline=deadline,
        max_gpus=max_gpus,
        samples=simulator.samples,
        seed=simulator.seed,
    )
    own = planned.plan.stages[0]
    details = dict(planned.details)
    options = first_options(replanner, simulator.profile, own)
    if len(options) > MAX_OPTIONS:
        details["first_stage"] = {
            "chosen_for": (
                f"the profile alone (RubberBand's): {len(options)} options for the first "
                f"stage, more than the {MAX_OPTIONS} a start for re-planning is chosen among"
            )
        }
        return planned._replace(details=details)
    try:
        plan = recourse_start(replanner, simulator.profile, options=options)
    except NoStart:  # only RubberBand's plan as a whole meets the deadline: keep it
        return planned
    outcome = simulator.run(plan)
    if plan.stages[0] == own or (budget is not None and outcome.cost_q > budget):
        return planned
    details["first_stage"] = {
        "chosen_for": "re-planning after its first wave (recourse start)",
        "rubberband": {
            "instance_type": own.instance_type,
            "instances": own.instances,
            "gpus_per_trial": own.gpus_label,
            "plan_cost_mean_usd": round(planned.outcome.cost_mean, 4),
        },
    }
    return _Planned(plan, outcome, planned.problems, details)


def _move(move: Move, spot: bool) -> dict[str, object]:
    """One plan on RubberBand's greedy path, as the report lists it."""
    out: dict[str, object] = {
        "gpus_per_trial": [list(chain) for chain in move.plan.gpus_per_trial],
        "jct_p95_s": round(move.jct, 1),
        "cost_mean_usd": round(move.cost, 4),
        "benefit_usd_per_s": move.benefit,
    }
    if spot:
        out["spot"] = [s.name for s in move.plan.stages if s.market == "spot"]
    return out


def _seer(
    spec: JobSpec, simulator: PlanSimulator, names: list[str], max_gpus: int | None
) -> _Planned:
    """SEER's plan with the most trials meeting both the deadline and the budget."""
    deadline, budget = spec.budget.deadline, spec.budget.max_cost_usd
    for field, value in (("budget.deadline", deadline), ("budget.max_cost_usd", budget)):
        if value is None:
            raise SpecError(f"{field}: the seer planner needs both a deadline and a budget")
    s = spec.scheduler
    seer = Seer(simulator, names, deadline=deadline, budget=budget, max_gpus=max_gpus)
    result = seer.plan(s.max_resource, s.eta, s.min_resource)
    problems: list[Problem] = []
    if result.smallest_deadline is not None:
        problems.append(_unmet("budget.deadline", deadline, result.smallest_deadline))
    if result.smallest_budget is not None:
        problems.append(_unmet("budget.max_cost_usd", budget, result.smallest_budget))
    row = result.solution
    seer_details: dict[str, object] = {
        "stages": row.stages,
        "stage_s": round(row.stage_hours * 3600, 1),
        "units": list(row.units),
        "trials": list(row.trials),
        "instance_type": result.instance_type,
    }
    if spec.compute.spot:
        seer_details["note"] = "the seer planner plans on-demand capacity (spot ignored)"
    return _Planned(result.plan, result.outcome, tuple(problems), {"seer": seer_details})


# What a budget field asks for, and how its values read in a message.
_UNMET: dict[str, tuple[str, Callable[[float], str]]] = {
    "budget.deadline": ("deadline", format_duration),
    "budget.max_cost_usd": ("budget", lambda dollars: f"${dollars:,.2f}"),
}


def _unmet(field: str, given: float, smallest: float) -> Problem:
    """The budget ``field`` cannot be met; ``smallest`` is the least value that can."""
    noun, show = _UNMET[field]
    return Problem(
        field,
        f"{field}: {show(given)} cannot be met at p95; the smallest {noun} "
        f"that works is {show(smallest)}",
        smallest,
    )
