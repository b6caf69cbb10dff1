"""Trials running in flight when a job is re-planned (planners/cost/montecarlo/held.py, simulate.py,
replan.py; docs/algorithms.md §5.8): they end where they run, and what is left is planned
around them. Pure, in milliseconds."""

from __future__ import annotations

import numpy as np
import pytest

from elastune.planners.cost.inflight.replanner import Replanner, under_way
from elastune.planners.cost.montecarlo.held import Held, left_after
from elastune.planners.cost.montecarlo.simulate import PlanSimulator
from elastune.planners.cost.pricing.allocation import AllocationPlan, GpuTier, StagePlan
from elastune.planners.cost.pricing.catalog import parse_catalog
from elastune.planners.staging import Profile, Stage

# No startup, no minimum charge: times and bills read off exactly.
CATALOG = parse_catalog(
    {
        "defaults": {"billing": {"min_charge_s": 0}},
        "instance_types": {
            "one": {"gpus": 1, "gpu": "A", "price_per_hour": 3.6},
            "other": {"gpus": 1, "gpu": "A", "price_per_hour": 7.2},
        },
    }
)
EXACT = Profile({1: 100.0})  # 100 s a unit, no spread, no overhead


def stage(rung: int, trials: int, nodes: int, instance_type: str = "one") -> StagePlan:
    return StagePlan(0, rung, (GpuTier(trials, 1.0, 1.0),), instance_type, nodes)


def simulator(held: Held | None, samples: int = 1) -> PlanSimulator:
    holding = None if held is None else {held.stage.bracket: held}
    return PlanSimulator(CATALOG, EXACT, samples=samples, holding=holding)


def test_the_next_stage_starts_once_the_trials_running_in_flight_end() -> None:
    running = stage(0, 2, 2)
    nxt = stage(1, 1, 1)
    idle = simulator(Held(running)).chain((nxt,))
    busy = simulator(Held(running, (30.0, 60.0))).chain((nxt,))
    assert float(idle.end[0]) == pytest.approx(100.0)
    assert float(busy.end[0]) == pytest.approx(70.0 + 100.0)  # the longer one has 70 s left
    # The node let go is billed up to the barrier, as at any barrier.
    assert float(busy.released_cost[0]) == pytest.approx(3.6 * 70 / 3600)


def test_the_rest_of_a_stage_starts_on_the_node_that_frees_first() -> None:
    held = Held(stage(0, 3, 3), (90.0, 10.0, 50.0))  # 10, 90 and 50 s left
    rest = stage(0, 1, 1)  # its one trial not begun, on one of the three nodes
    run = simulator(held).chain((rest,))
    assert float(run.end[0]) == pytest.approx(10.0 + 100.0)
    # The two nodes let go are billed until their trials end (90 and 50 s).
    assert float(run.released_cost[0]) == pytest.approx(3.6 * 140 / 3600)
    # Its trials still running end the stage: one of 100 s left outlasts a rest of 55 s.
    short = StagePlan(0, 0, (GpuTier(1, 1.0, 0.5),), "one", 1)
    late = simulator(Held(stage(0, 2, 2), (95.0, 0.0))).chain((short,))
    assert float(late.end[0]) == pytest.approx(100.0)


def test_a_stage_moved_to_another_type_leaves_its_trials_to_drain() -> None:
    held = Held(stage(0, 2, 2), (20.0, 40.0))  # 80 and 60 s left
    rest = stage(0, 1, 1, "other")
    run = simulator(held).chain((rest,))
    assert float(run.end[0]) == pytest.approx(100.0)  # the new node starts at once
    assert float(run.released_cost[0]) == pytest.approx(3.6 * 140 / 3600)
    # A trial of 100 s left holds the stage past a rest of 50 s on the new node.
    short = StagePlan(0, 0, (GpuTier(1, 1.0, 0.5),), "other", 1)
    longer = simulator(Held(stage(0, 1, 1), (0.0,))).chain((short,))
    assert float(longer.end[0]) == pytest.approx(100.0)


def test_a_bracket_with_only_trials_running_ends_the_job_with_them() -> None:
    holding = {
        0: Held(stage(0, 1, 1), (0.0,)),
        1: Held(StagePlan(1, 0, (GpuTier(1, 1.0, 1.0),), "one", 1)),
    }
    other = StagePlan(1, 1, (GpuTier(1, 1.0, 0.5),), "one", 1)  # 50 s
    outcome = PlanSimulator(CATALOG, EXACT, samples=1, holding=holding).run(
        AllocationPlan(((other,),))
    )
    assert float(outcome.jct[0]) == pytest.approx(100.0)  # bracket 0's trial, not bracket 1
    assert float(outcome.cost[0]) == pytest.approx(0.1 + 0.05)


def test_a_running_trial_is_timed_given_how_long_it_has_run() -> None:
    u = np.random.default_rng(0).random((4000, 1))
    mean, sd, speed = np.array([100.0]), np.array([20.0]), np.ones((4000, 1))
    fresh = left_after(np.array([0.0]), mean, sd, speed, u)
    late = left_after(np.array([130.0]), mean, sd, speed, u)
    assert float(fresh.mean()) == pytest.approx(100.0, rel=0.03)
    # Past its mean by 1.5 sd and still running: a few seconds left, never none.
    assert float(late.min()) > 0.0 and 3.0 < float(late.mean()) < 15.0
    with pytest.raises(ValueError, match="running"):
        Held(stage(0, 1, 1), (-1.0,))


def test_a_decision_inside_a_stage_plans_only_its_trials_not_begun() -> None:
    job = [Stage(0, 0, 6, 0, 1), Stage(0, 1, 2, 1, 3)]
    replanner = Replanner(CATALOG, ["one", "other"], job, deadline=3000.0, samples=20)
    plan = replanner.plan(EXACT).plan
    first = plan.chains[0][0]
    held = {0: Held(first, (50.0,))}  # two of the six finished, one running
    assert under_way({(0, 0): 2}, held) == {(0, 0): 3}
    decision = replanner.decide(plan, {(0, 0): 2}, 200.0, 0.1, EXACT, held)
    assert decision.plan.chains[0][0].trials == 3
    second = plan.chains[0][1]
    everything = {0: Held(second, (5.0, 5.0))}  # the last stage's two trials both running
    with pytest.raises(ValueError, match="every trial has begun"):
        replanner.decide(plan, {(0, 0): 6}, 900.0, 0.5, EXACT, everything)
