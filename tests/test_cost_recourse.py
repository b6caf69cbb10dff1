"""A first stage chosen for the re-planning to come (planners/cost/inflight/recourse.py;
docs/algorithms.md §5.10): pure, in seconds."""

from __future__ import annotations

import numpy as np
import pytest

from elastune.planners.cost.inflight.recourse import (
    MIN_WAVE,
    _known,
    _scaled,
    first_options,
    profile_errors,
    recourse_start,
    start_on,
)
from elastune.planners.cost.inflight.replanner import (
    Replanner,
    begun,
    first_wave,
    left_to_run,
    part,
)
from elastune.planners.cost.pricing.allocation import StagePlan
from elastune.planners.cost.pricing.billing import BillingRule
from elastune.planners.cost.pricing.catalog import Catalog, read_catalog
from elastune.planners.cost.pricing.this_machine import LOCAL, LocalType
from elastune.planners.staging import Profile, Stage

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


def test_a_profile_held_exact_starts_as_rubberband() -> None:
    planner = replanner(deadline=2400)
    exact = recourse_start(planner, PROFILE, points=1)  # the one error: none
    assert exact.stages[0] == planner.plan(PROFILE).plan.stages[0]


def test_the_profiles_errors_start_the_job_on_the_cheapest_gpus() -> None:
    # RubberBand's plan starts on a 4-GPU node, each GPU dearer than a g5.xlarge's: right
    # only if the profile is. Whatever the error, single GPUs cost least, and their wave
    # still meets the deadline.
    planner = replanner(deadline=2200)
    assert planner.plan(PROFILE).plan.stages[0].instance_type == "g5.12xlarge"
    start = recourse_start(planner, PROFILE)
    assert (start.stages[0].instance_type, start.stages[0].gpus_label) == ("g5.xlarge", "1")
    assert p95(planner, start) <= 2200


@pytest.mark.parametrize("deadline", [4000, 6000])
def test_a_loose_deadline_still_measures_half_the_first_stage_at_once(deadline: float) -> None:
    # Next to what knowing each error would cost, one node costs least here (a fast truth
    # needs no more, a slow one is found out with time left to buy speed), and so does
    # RubberBand's own at 6000 s. But every later decision reads the first wave, and one
    # segment says little of the speed and nothing of its spread: the start runs at least
    # half the stage at once (nine trials: fewer than MIN_WAVE), on the cheapest GPUs.
    planner = replanner(deadline=deadline)
    own = planner.plan(PROFILE).plan.stages[0]
    first = recourse_start(planner, PROFILE).stages[0]
    assert 2 * first_wave(own, planner.catalog) < 9
    assert first.instance_type == "g5.xlarge"
    assert 2 * first_wave(first, planner.catalog) >= 9


def test_a_large_first_stage_measures_fourteen_segments_at_once_not_half_of_it() -> None:
    # Sixty trials: fourteen segments read the spread within about a fifth of itself, and
    # a wave of thirty is dear where the truth is fast. The costing alone starts on ten.
    job = [Stage(0, 0, 60, 0, 1), Stage(0, 1, 20, 1, 3), Stage(0, 2, 6, 3, 9)]
    planner = replanner(job=job, deadline=4000)
    first = recourse_start(planner, PROFILE).stages[0]
    assert MIN_WAVE <= first_wave(first, planner.catalog) < 30


def test_where_no_first_wave_can_hold_half_the_stage_the_start_is_chosen_among_all() -> None:
    # Four GPUs at most: no wave reaches five of the nine trials. The start still weighs
    # the profile's errors, and at a loose deadline runs on fewer nodes than RubberBand's.
    planner = Replanner(read_catalog(), TYPES, JOB, deadline=4000, samples=50, max_gpus=4)
    own = planner.plan(PROFILE).plan.stages[0]
    first = recourse_start(planner, PROFILE).stages[0]
    assert (own.instance_type, first.instance_type) == ("g5.xlarge", "g5.xlarge")
    assert first.instances < own.instances


def test_no_deadline_rubberbands_start_keeps_within_reach_is_given_up() -> None:
    planner = replanner(deadline=1700)
    errors = profile_errors(7, 0.5)  # the seven recourse_start weighs by default

    def within_reach(first: StagePlan) -> list[bool]:
        plan = start_on(planner, PROFILE, first)
        assert plan is not None
        ran = part(first, 0, begun(first, planner.catalog))
        left = left_to_run(planner.stages, {(0, 0): ran.trials})
        return [_known(planner, _scaled(PROFILE, e), plan, ran, left).meets for e in errors]

    own = within_reach(planner.plan(PROFILE).plan.stages[0])
    start = within_reach(recourse_start(planner, PROFILE).stages[0])
    assert all(s or not o for s, o in zip(start, own, strict=True))
    # The cheapest GPUs, all nine at once, would give one up: why they are not the start.
    rubberband = planner.rubberband(PROFILE, 1700)
    nine = rubberband.options(JOB[0], 0, rubberband.usable([JOB]))
    wide = [o for o in nine if (o.instance_type, o.instances) == ("g5.xlarge", 9)]
    assert wide and any(o and not s for s, o in zip(within_reach(wide[0]), own, strict=True))


def test_where_every_option_costs_the_same_the_start_is_rubberbands_plan() -> None:
    node = LocalType(
        name=LOCAL, gpus=4, gpu=LOCAL, price_per_hour=0.0, billing=BillingRule(min_charge_s=0)
    )
    free = Catalog(region="here", prices_read="-", source="-", instance_types={LOCAL: node})
    planner = Replanner(free, [LOCAL], JOB, deadline=5000, samples=50)
    start = recourse_start(planner, PROFILE)
    assert start.stages[0] == planner.plan(PROFILE).plan.stages[0]


def test_each_start_runs_its_option_first_and_meets_the_deadline_or_is_none() -> None:
    planner = replanner()
    starts = {o: start_on(planner, PROFILE, o) for o in first_options(planner, PROFILE)}
    met = [(o, s) for o, s in starts.items() if s is not None]
    assert met and len(met) < len(starts)  # 1700 s: some first stages leave too little
    for option, start in met:
        assert start.stages[0] == option
        assert [s.trials for s in start.stages] == [9, 3, 1]
    # The start chosen is one of them.
    assert recourse_start(planner, PROFILE) in [s for _, s in met]


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
