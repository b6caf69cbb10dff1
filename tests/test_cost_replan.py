"""Re-planning in flight and spot with a deadline (planners/cost/inflight/replanner.py,
planners/cost/planning/spot.py; docs/algorithms.md §5.8, §5.9): pure, in milliseconds."""

from __future__ import annotations

import pytest

from elastune.planners.cost.inflight.estimate import ProfileEstimate
from elastune.planners.cost.inflight.replanner import (
    Reason,
    Replanner,
    begun,
    first_wave,
    left_to_run,
    part,
)
from elastune.planners.cost.montecarlo.held import Held
from elastune.planners.cost.montecarlo.simulate import PlanSimulator
from elastune.planners.cost.planning.spot import SpotDeadline, plan_spot
from elastune.planners.cost.pricing.allocation import AllocationPlan, GpuTier, StagePlan
from elastune.planners.cost.pricing.catalog import parse_catalog, read_catalog
from elastune.planners.staging import Profile, Stage

CATALOG = parse_catalog(
    {
        "instance_types": {
            "p3.8xlarge": {
                "gpus": 4,
                "gpu": "V100",
                "price_per_hour": 12.24,
                "startup": {"mean_s": 180},
                "spot": {"discount": 0.7, "interruptions_per_hour": 0.5},
            }
        }
    }
)
TYPES = ["p3.8xlarge"]
PRIOR = Profile.from_scaling(720, speedup={2: 1.8, 4: 3.2}, segment_cv=0.05)
JOB = [Stage(0, 0, 8, 0, 1), Stage(0, 1, 4, 1, 3), Stage(0, 2, 2, 3, 7)]
DEADLINE = 80 * 60


def scaled(factor: float) -> Profile:
    return Profile.from_scaling(720 * factor, speedup={2: 1.8, 4: 3.2}, segment_cv=0.05)


def replanner(**options: float) -> Replanner:
    options.setdefault("deadline", DEADLINE)
    return Replanner(CATALOG, TYPES, JOB, samples=100, **options)  # type: ignore[arg-type]


def after_first_stage(plan: AllocationPlan) -> tuple[dict[tuple[int, int], int], dict]:
    return {(0, 0): 8}, {0: Held(plan.chains[0][0])}


# --- decisions ----------------------------------------------------------------------------


def test_a_run_as_the_profile_said_keeps_its_plan() -> None:
    planner = replanner()
    plan = planner.plan(PRIOR).plan
    finished, held = after_first_stage(plan)
    decision = planner.decide(plan, finished, 900.0, 5.0, PRIOR, held)
    assert decision.reason is Reason.ON_TRACK and not decision.changed
    assert decision.plan == AllocationPlan((plan.chains[0][1:],))
    assert decision.kept.jct_s <= DEADLINE - 900


def test_a_run_twice_as_slow_replans_the_rest_to_meet_the_deadline() -> None:
    planner = replanner()
    plan = planner.plan(PRIOR).plan
    finished, held = after_first_stage(plan)
    decision = planner.decide(plan, finished, 1600.0, 5.0, scaled(2.0), held)
    assert decision.reason is Reason.LATE and decision.changed
    assert decision.kept.jct_s > DEADLINE - 1600 >= decision.chosen.jct_s
    assert not decision.deadline_at_risk
    assert "late" in decision.describe()


def test_a_deadline_out_of_reach_goes_on_at_the_fastest_plan_and_says_so() -> None:
    planner = replanner()
    plan = planner.plan(PRIOR).plan
    finished, held = after_first_stage(plan)
    decision = planner.decide(plan, finished, DEADLINE - 60.0, 5.0, scaled(2.0), held)
    assert decision.reason is Reason.DEADLINE_AT_RISK and decision.deadline_at_risk
    assert decision.plan.gpus_per_trial == (("4", "4"),)  # the fastest on this type
    assert decision.meets_at is None and "misses it even at p50" in decision.describe()
    # Past the deadline: still a plan, not a crash.
    late = planner.decide(plan, finished, DEADLINE + 600.0, 5.0, scaled(2.0), held)
    assert late.deadline_at_risk and late.deadline_left_s == 1.0


def test_a_deadline_at_risk_at_p95_goes_on_at_the_cheapest_plan_likeliest_to_meet_it() -> None:
    # Six scattered segments read a speed that misses the deadline at p95 whatever the
    # plan; a plan that meets it at p80 costs far less than the fastest.
    types = ["g5.xlarge", "g5.12xlarge"]
    job = [Stage(0, 0, 27, 0, 1), Stage(0, 1, 9, 1, 3), Stage(0, 2, 3, 3, 9), Stage(0, 3, 1, 9, 27)]
    prior = Profile.from_scaling(240, speedup={2: 1.8, 4: 3.2}, segment_cv=0.1)
    planner = Replanner(read_catalog(), types, job, deadline=3380.0, samples=100)
    plan = planner.plan(prior).plan
    first = plan.chains[0][0]
    assert first.gpus_label == "1"
    estimate = ProfileEstimate(prior)
    for ratio in (1.4, 0.7, 1.2, 0.9, 0.8, 1.1):
        estimate.observe(1, 1.0, 240 * ratio)
    finished, held = {(0, 0): first_wave(first, read_catalog())}, {0: Held(first)}
    decision = planner.decide(plan, finished, 400.0, 1.0, estimate.profile(), held)
    assert decision.reason is Reason.DEADLINE_AT_RISK and decision.meets_at == 0.8
    assert "meets it at p80" in decision.describe()
    # At p95 RubberBand finds no plan that meets it, and answers with the fastest.
    rubberband = planner.rubberband(estimate.profile(), decision.deadline_left_s, held)
    fastest = rubberband.plan(left_to_run(job, finished))
    assert not fastest.feasible
    assert decision.chosen.cost_mean < 0.8 * fastest.outcome.cost_mean


def test_a_faster_run_moves_to_a_cheaper_plan() -> None:
    planner = replanner(deadline=2400.0)  # tight: the plan is wide, and dear
    plan = planner.plan(PRIOR).plan
    finished, held = after_first_stage(plan)
    decision = planner.decide(plan, finished, 400.0, 5.0, scaled(0.5), held)
    assert decision.reason is Reason.CHEAPER and decision.changed
    assert decision.chosen.cost_mean < decision.kept.cost_mean * 0.95


def test_a_plan_over_the_budget_moves_to_one_within_it() -> None:
    fastest = replanner(deadline=1.0).plan(PRIOR).plan  # dear: 4 GPUs per trial throughout
    planner = replanner(budget=20.0, margin=0.99)  # margin: no "cheaper" re-plan
    finished, held = after_first_stage(fastest)
    decision = planner.decide(fastest, finished, 900.0, 10.0, PRIOR, held)
    assert decision.reason is Reason.OVER_BUDGET
    assert decision.kept.cost_q > 10.0 and decision.chosen.cost_q < decision.kept.cost_q


def test_inside_a_stage_only_its_trials_left_are_replanned() -> None:
    planner = replanner()
    plan = planner.plan(PRIOR).plan
    finished = {(0, 0): 3}
    assert [s.trials for s in left_to_run(JOB, finished)] == [5, 4, 2]
    decision = planner.decide(plan, finished, 700.0, 2.0, scaled(2.0), {0: Held(plan.chains[0][0])})
    assert decision.plan.chains[0][0].trials == 5
    kept = decision.kept  # the kept plan counts the 5 trials left, not 8
    assert kept.jct_s < planner.decide(plan, {}, 0.0, 0.0, scaled(2.0)).kept.jct_s
    with pytest.raises(ValueError, match="nothing left"):
        planner.decide(plan, {(0, 0): 8, (0, 1): 4, (0, 2): 2}, 0.0, 0.0, PRIOR)


def test_part_keeps_the_trials_in_rank_order() -> None:
    stage = StagePlan(0, 0, (GpuTier(2, 4.0, 1.0), GpuTier(3, 1.0, 1.0)), "p3.8xlarge", 2)
    assert part(stage, 1).tiers == (GpuTier(1, 4.0, 1.0), GpuTier(3, 1.0, 1.0))
    assert part(stage, 0, 2).tiers == (GpuTier(2, 4.0, 1.0),)
    with pytest.raises(ValueError):
        part(stage, 5)


def test_a_held_pool_starts_without_a_startup() -> None:
    stage = StagePlan(0, 1, (GpuTier(4, 1.0, 2.0),), "p3.8xlarge", 1)
    fresh = PlanSimulator(CATALOG, PRIOR, samples=20).chain((stage,))
    held = PlanSimulator(CATALOG, PRIOR, samples=20, holding={0: Held(stage)}).chain((stage,))
    assert float((fresh.end - held.end).min()) == pytest.approx(180.0)
    other_type = dict(CATALOG.instance_types)  # a held pool of another market is released
    assert other_type
    spot_held = PlanSimulator(
        CATALOG, PRIOR, samples=20, holding={0: Held(stage.replace(market="spot"))}
    ).chain((stage,))
    assert float((spot_held.end - held.end).min()) == pytest.approx(180.0)


# --- spot with a deadline -------------------------------------------------------------------


def spot_chain() -> AllocationPlan:
    return AllocationPlan(
        (
            tuple(
                StagePlan(0, k, (GpuTier(n, 1.0, r),), "p3.8xlarge", max(1, n // 4))
                for k, (n, r) in enumerate([(8, 1), (4, 2), (2, 4)])
            ),
        )
    )


def test_spot_is_used_while_the_slack_allows() -> None:
    simulator = PlanSimulator(CATALOG, PRIOR, samples=300)
    policy = SpotDeadline(simulator, spot_chain(), deadline=4 * 3600)
    assert [policy.market(k, 0.0) for k in range(3)] == ["spot"] * 3
    # With the slack spent, the last stage goes on-demand.
    assert policy.market(2, 4 * 3600 - policy.rest[2] + 1) == "on-demand"
    assert policy.spot[2] > policy.rest[2]  # spot's tail is longer than on-demand's


def test_a_spot_run_meets_its_deadline_in_every_world_here() -> None:
    simulator = PlanSimulator(CATALOG, PRIOR, samples=300)
    deadline = 2.0 * 3600
    policy = SpotDeadline(simulator, spot_chain(), deadline)
    runs = [policy.play(simulator.world(seed)) for seed in range(50)]
    assert all(jct <= deadline for jct, _, _ in runs)
    assert any("spot" in markets for _, _, markets in runs)
    assert any("on-demand" in markets for _, _, markets in runs)


def test_plan_spot_picks_a_base_plan_or_none() -> None:
    simulator = PlanSimulator(CATALOG, PRIOR, samples=100)
    policy = plan_spot(simulator, TYPES, JOB, 2.0 * 3600, worlds=40)
    assert policy is not None and policy.deadline == 2.0 * 3600
    assert plan_spot(simulator, TYPES, JOB, 600.0, worlds=10) is None
    with pytest.raises(ValueError, match="one chain"):
        two = AllocationPlan((spot_chain().chains[0], spot_chain().chains[0]))
        SpotDeadline(simulator, two, 3600.0)


def test_a_replan_also_starts_from_the_plan_made_as_if_no_node_were_held() -> None:
    # A profile 2x too pessimistic put the first wave on 4-GPU nodes; the rest is cheaper on
    # single-GPU ones. The held 4-GPU nodes go on without a startup, and the greedy from
    # its own starts stays on them (3.93 $ here, the kept plan 4.06 $: not 5% cheaper);
    # the plan made as if nothing were held, priced with them held, costs 3.67 $.
    catalog = parse_catalog(
        {
            "defaults": {"startup": {"mean_s": 180, "sd_s": 60}},
            "instance_types": {
                "g5.xlarge": {"gpus": 1, "gpu": "A10G", "price_per_hour": 1.006},
                "g5.12xlarge": {"gpus": 4, "gpu": "A10G", "price_per_hour": 5.672},
            },
        }
    )
    job = [Stage(0, 0, 27, 0, 1), Stage(0, 1, 9, 1, 3), Stage(0, 2, 3, 3, 9), Stage(0, 3, 1, 9, 27)]
    speedup = {2: 1.8, 4: 3.2}
    prior = Profile.from_scaling(240, speedup=speedup, segment_cv=0.1)
    truth = Profile.from_scaling(120, speedup=speedup, segment_cv=0.05)
    planner = Replanner(catalog, ["g5.xlarge", "g5.12xlarge"], job, deadline=3458, samples=100)
    plan = planner.plan(prior).plan
    first = plan.chains[0][0]
    assert (first.instance_type, first.instances) == ("g5.12xlarge", 4)
    wave = part(first, 0, 16)
    decision = planner.decide(plan, {(0, 0): 16}, 448.0, 2.83, truth, {0: Held(wave)})
    assert decision.reason is Reason.CHEAPER
    assert decision.chosen.cost_mean < decision.kept.cost_mean * 0.95
    assert "g5.xlarge" in {s.instance_type for s in decision.plan.stages}


@pytest.mark.parametrize(
    ("instances", "trials", "wave", "started"), [(14, 27, 14, 27), (4, 27, 4, 7), (1, 3, 1, 1)]
)
def test_a_first_waves_report_finds_the_slots_it_freed_on_the_next_trials(
    instances: int, trials: int, wave: int, started: int
) -> None:
    # Each of the wave's slots freed before its last report began another trial; the last
    # one's slot begins its next after the decision, on the plan the decision leaves.
    catalog = read_catalog()
    stage = StagePlan(0, 0, (GpuTier(trials, 1.0, 1.0),), "g5.xlarge", instances)
    assert first_wave(stage, catalog) == wave
    assert begun(stage, catalog) == started
