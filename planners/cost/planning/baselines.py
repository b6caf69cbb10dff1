"""Static-allocation baselines, priced by the same simulator as the plan.

A static pool holds a fixed number of nodes of one type from the job's start to its end
(brackets share it in proportion to their work, each keeping its share). Each stage runs
on it as fast as it can: a RubberBand stage takes the GPUs per trial that finish it
soonest on the pool (waves counted); a SEER stage keeps its tiers. Two pools are priced:

- ``static-max``: the job's GPU quota (``compute.max_gpus``), or, without one, the peak
  GPUs of the plan;
- ``static-min``: the fewest nodes whose p95 JCT meets the deadline.

For each, every allowed instance type is tried and the cheapest pool that meets the
deadline is reported (the cheapest of all when none does), so the comparison is with
the best static choice, not a strawman.

Example:
    >>> from elastune.planners.cost.pricing.catalog import parse_catalog
    >>> from elastune.planners.staging import Profile
    >>> from elastune.planners.cost.planning.rubberband import RubberBand
    >>> from elastune.planners.cost.montecarlo.simulate import PlanSimulator
    >>> from elastune.planners.staging import Stage
    >>> catalog = parse_catalog({"instance_types": {"p3.8xlarge": {
    ...     "gpus": 4, "gpu": "V100", "price_per_hour": 12.24, "startup": {"mean_s": 180}}}})
    >>> simulator = PlanSimulator(catalog, Profile.from_scaling(720, speedup={2: 1.8, 4: 3.2}))
    >>> job = [Stage(0, 0, 8, 0, 1), Stage(0, 1, 4, 1, 3), Stage(0, 2, 2, 3, 7)]
    >>> plan = RubberBand(simulator, ["p3.8xlarge"], deadline=36 * 60).plan(job).plan
    >>> static = static_pool(simulator, plan, "p3.8xlarge", 4)    # docs/algorithms.md §5.6
    >>> round(simulator.run(static).cost_mean, 2)
    26.25
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from elastune.planners.cost.montecarlo.outcome import Outcome
from elastune.planners.cost.montecarlo.simulate import PlanSimulator
from elastune.planners.cost.pricing.allocation import AllocationPlan, StagePlan
from elastune.planners.cost.pricing.stage_shapes import fastest_stage, split
from elastune.planners.staging import Stage


@dataclass(frozen=True)
class Baseline:
    """A static pool of ``nodes`` nodes of ``instance_type`` (None: no pool qualifies)."""

    name: str
    instance_type: str | None
    nodes: int
    gpus: int
    plan: AllocationPlan | None
    outcome: Outcome | None
    meets_deadline: bool
    note: str = ""


def static_pool(
    simulator: PlanSimulator,
    plan: AllocationPlan,
    instance_type: str,
    nodes: int,
    market: str = "on-demand",
) -> AllocationPlan | None:
    """The work of ``plan`` on ``nodes`` nodes of ``instance_type`` held for the whole job
    (bought on ``market``; the reported baselines are on-demand pools).

    None when the type cannot run it (a tier wider than a node, or fewer nodes than
    brackets).
    """
    instance = simulator.catalog.get(instance_type)
    profile = simulator.profile
    weights = [sum(t.trials * t.resource for s in chain for t in s.tiers) for chain in plan.chains]
    shares = split(nodes, weights)
    if shares is None or not profile.covers(instance):
        return None
    chains = []
    for chain, share in zip(plan.chains, shares, strict=True):
        stages = []
        for stage in chain:
            if len(stage.tiers) == 1:
                tier = stage.tiers[0]
                job = Stage(stage.bracket, stage.rung, tier.trials, tier.start, tier.stop)
                if not profile.counts_for(instance):
                    return None
                stages.append(fastest_stage(profile, job, instance, share, True, market))
            elif max(t.gpus for t in stage.tiers) <= instance.gpus:
                stages.append(
                    StagePlan(stage.bracket, stage.rung, stage.tiers, instance.name, share, market)
                )
            else:
                return None
        chains.append(tuple(stages))
    return AllocationPlan(tuple(chains), hold=True)


def peak_gpus(plan: AllocationPlan, simulator: PlanSimulator) -> int:
    """GPUs the plan holds at most: the sum over brackets of each one's largest pool."""
    return sum(
        max(s.instances * simulator.catalog.get(s.instance_type).gpus for s in chain)
        for chain in plan.chains
    )


def static_baselines(
    simulator: PlanSimulator,
    plan: AllocationPlan,
    instance_types: Sequence[str],
    *,
    deadline: float | None,
    max_gpus: int | None,
) -> tuple[Baseline, Baseline]:
    """``static-max`` and ``static-min`` for ``plan`` (see the module docstring)."""
    limit = math.inf if deadline is None else deadline
    ceiling = max_gpus if max_gpus is not None else peak_gpus(plan, simulator)
    at_max: list[Baseline] = []
    at_min: list[Baseline] = []
    for name in instance_types:
        top = ceiling // simulator.catalog.get(name).gpus
        largest = _priced(simulator, plan, name, top, limit)
        if largest is None:
            continue
        at_max.append(dataclasses.replace(largest, name="static-max"))
        if not largest.meets_deadline:
            continue
        low, high, fewest = len(plan.chains), top, largest  # JCT falls as nodes grow: bisect
        while low < high:
            mid = (low + high) // 2
            candidate = _priced(simulator, plan, name, mid, limit)
            if candidate is not None and candidate.meets_deadline:
                high, fewest = mid, candidate
            else:
                low = mid + 1
        at_min.append(fewest)
    return _cheapest(at_max, "static-max", ceiling), _cheapest(at_min, "static-min", ceiling)


def _priced(
    simulator: PlanSimulator, plan: AllocationPlan, instance_type: str, nodes: int, limit: float
) -> Baseline | None:
    static = static_pool(simulator, plan, instance_type, nodes)
    if static is None:
        return None
    outcome = simulator.run(static)
    gpus = nodes * simulator.catalog.get(instance_type).gpus
    meets = outcome.jct_q <= limit
    return Baseline("static-min", instance_type, nodes, gpus, static, outcome, meets)


def _cheapest(options: list[Baseline], name: str, ceiling: int) -> Baseline:
    """The cheapest pool that meets the deadline, else the cheapest of all."""
    if not options:
        note = f"no static pool of up to {ceiling} GPUs can run the job"
        if name == "static-min":
            note = f"no static pool of up to {ceiling} GPUs meets the deadline"
        return Baseline(name, None, 0, 0, None, None, False, note)
    on_time = [b for b in options if b.meets_deadline] or options
    return min(on_time, key=lambda b: b.outcome.cost_mean if b.outcome else math.inf)
