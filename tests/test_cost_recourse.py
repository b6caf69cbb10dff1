"""A first stage chosen for the re-planning to come (planners/cost/recourse.py;
docs/algorithms.md §5.10): pure, in about a second."""

from __future__ import annotations

import numpy as np
import pytest

from planners.cost.billing import BillingRule
from planners.cost.catalog import Catalog, read_catalog
from planners.cost.local import LOCAL, LocalType
from planners.cost.recourse import recourse_start
from planners.cost.replan import Replanner
from planners.staging import Profile, Stage

TYPES = ["g5.xlarge", "g5.12xlarge"]
PROFILE = Profile.from_scaling(240, speedup={2: 1.8, 4: 3.2}, segment_cv=0.1)
JOB = [Stage(0, 0, 9, 0, 1), Stage(0, 1, 3, 1, 3), Stage(0, 2, 1, 3, 9)]


def replanner(job: list[Stage] = JOB, deadline: float | None = 1700) -> Replanner:
    return Replanner(read_catalog(), TYPES, job, deadline=deadline, samples=50)


def p95(planner: Replanner, plan: object) -> float:
    outcome = planner.rubberband(PROFILE, None).simulator.run(plan)  # type: ignore[arg-type]
    return float(np.quantile(outcome.jct, 0.95))


def test_the_start_meets_the_deadline_under_the_profile_and_holds_every_stage() -> None:
    planner = replanner()
    start = recourse_start(planner, PROFILE)
    assert [(s.bracket, s.rung, s.trials) for s in start.stages] == [
        (0, 0, 9),
        (0, 1, 3),
        (0, 2, 1),
    ]
    assert p95(planner, start) <= 1700
    # Under the profile alone the start costs more than RubberBand's plan: it buys the
    # profile's errors down, not its own forecast.
    static = planner.plan(PROFILE)
    outcome = planner.rubberband(PROFILE, None).simulator.run(start)
    assert start.stages[0] != static.plan.stages[0]
    assert outcome.cost_mean >= static.outcome.cost_mean


def test_a_profile_held_exact_starts_as_rubberband_and_its_errors_widen_the_wave() -> None:
    planner = replanner(deadline=2400)
    exact = recourse_start(planner, PROFILE, points=1)  # the one error: none
    hedged = recourse_start(planner, PROFILE)
    assert exact.stages[0] == planner.plan(PROFILE).plan.stages[0]
    assert p95(planner, hedged) <= 2400
    # Seven errors instead of none: a wider first wave, for what a wrong profile costs.
    assert hedged.stages[0].instances > exact.stages[0].instances


def test_where_every_option_costs_the_same_the_start_is_rubberbands_plan() -> None:
    node = LocalType(
        name=LOCAL, gpus=4, gpu=LOCAL, price_per_hour=0.0, billing=BillingRule(min_charge_s=0)
    )
    free = Catalog(region="here", prices_read="-", source="-", instance_types={LOCAL: node})
    planner = Replanner(free, [LOCAL], JOB, deadline=5000, samples=50)
    start = recourse_start(planner, PROFILE)
    assert start.stages[0] == planner.plan(PROFILE).plan.stages[0]


def test_a_one_stage_job_gets_a_start_too() -> None:
    planner = replanner(job=[Stage(0, 0, 4, 0, 1)], deadline=1200)
    start = recourse_start(planner, PROFILE)
    assert [s.trials for s in start.stages] == [4]
    assert p95(planner, start) <= 1200


@pytest.mark.parametrize(
    ("planner", "options", "message"),
    [
        (replanner(), {"points": 0}, "points must be >= 1, got 0"),
        (replanner(), {"prior_error": 0.0}, "prior_error must be > 0, got 0.0"),
        (replanner(deadline=None), {}, "needs a deadline"),
        (replanner(job=[*JOB, Stage(1, 0, 3, 0, 3)]), {}, "plans one chain, the job has 2"),
        (replanner(deadline=300), {}, "no first stage meets the deadline under the profile"),
    ],
)
def test_what_it_cannot_plan_is_named(
    planner: Replanner, options: dict[str, float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        recourse_start(planner, PROFILE, **options)  # type: ignore[arg-type]
