"""SEER's solver on docs/algorithms.md §4.5, and the priced SEER planner."""

import pytest

from elastune.planners.cost.montecarlo.simulate import PlanSimulator
from elastune.planners.cost.planning.seer import Seer, solve, stage_gpus, survivors
from elastune.planners.cost.pricing.catalog import parse_catalog
from elastune.planners.staging import Profile

SPEED = {1: 1.0, 2: 1.8, 4: 3.2, 8: 5.6}  # epochs per hour on g GPUs


def example(**changes):
    args = {"max_resource": 27, "eta": 3, "units_per_hour": SPEED, **changes}
    return solve(12, 150, **args)


def test_worked_example_table() -> None:
    rows = {row.stages: row for row in example().rows}
    expected = {
        1: (12, (4,), (3,), 144, 38.4),
        2: (6, (2, 4), (8, 2), 144, 30.0),
        3: (4, (1, 2, 4), (17, 5, 1), 132, 29.6),
        4: (3, (1, 1, 1, 4), (28, 9, 3, 1), 150, 31.8),
    }
    for k, (hours, units, trials, cost, progress) in expected.items():
        row = rows[k]
        assert row.feasible
        assert (row.stage_hours, row.units, row.trials) == (hours, units, trials)
        assert row.gpu_hours == pytest.approx(cost)
        assert row.finalist_progress == pytest.approx(progress)
    assert not rows[5].feasible and "stage-1 target 0.333 < min_resource" in rows[5].reason
    assert len(rows) == 5


def test_chosen_plan_is_k4_with_two_tiers() -> None:
    best = example().best
    assert best is not None
    assert (best.stages, best.units, best.trials) == (4, (1, 1, 1, 4), (28, 9, 3, 1))
    assert best.stage_gpus == (28, 12, 6, 4)  # 3 h x (28 + 12 + 6 + 4) = 150 GPU-h
    assert best.gpu_hours == pytest.approx(150)


def test_the_cheaper_looking_alternatives_fail() -> None:
    # 1 GPU for everyone: a trial reaches at most 12 epochs.
    assert example(units_per_hour={1: 1.0}).best is None
    # 4 GPUs for everyone with K = 4: a finalist needs N_1 >= 27, which costs 480 GPU-h.
    row = next(r for r in example(units_per_hour={4: 3.2}).rows if r.stages == 4)
    assert not row.feasible and "27 trials need 480 GPU-h" in row.reason


def test_quota_and_overhead_limit_the_plan() -> None:
    capped = solve(12, 150, max_resource=27, eta=3, units_per_hour=SPEED, max_gpus=20).best
    assert capped is not None and max(capped.stage_gpus) <= 20
    slow = solve(12, 150, max_resource=27, eta=3, units_per_hour=SPEED, overhead_h=1).best
    assert slow is not None and slow.stage_hours == 12 / slow.stages - 1


def test_survivors_and_stage_gpus() -> None:
    assert survivors(28, 4, 3) == (28, 9, 3, 1)
    assert stage_gpus((28, 9, 3, 1), (1, 1, 1, 4)) == (28, 12, 6, 4)


def priced(deadline_h: float, budget: float, startup: float = 0.0) -> Seer:
    catalog = parse_catalog(
        {
            "instance_types": {
                "p3.8xlarge": {
                    "gpus": 4,
                    "gpu": "V100",
                    "price_per_hour": 12.24,
                    "startup": {"mean_s": startup},
                }
            }
        }
    )
    profile = Profile({g: 3600 / s for g, s in SPEED.items()}, segment_cv=0.05)
    simulator = PlanSimulator(catalog, profile, samples=200)
    return Seer(simulator, ["p3.8xlarge"], deadline=deadline_h * 3600, budget=budget)


def test_priced_plan_meets_deadline_and_budget_on_whole_nodes() -> None:
    budget = 150 * 12.24 / 4  # the example's 150 GPU-h in dollars
    result = priced(12, budget, startup=180).plan(27, 3)
    assert result.feasible
    assert result.outcome.jct_q <= 12 * 3600
    assert result.outcome.cost_q <= budget
    # Whole 4-GPU nodes, startup and stragglers cost more than the arithmetic: fewer trials.
    assert 1 <= result.solution.trials[0] <= 28
    units = result.solution.units
    assert list(units) == sorted(units)  # tiers ascend
    for stage in result.plan.stages:
        gpus = [t.gpus for t in stage.tiers]
        assert gpus == sorted(gpus, reverse=True)  # projected finalists first
        assert all(t.stop <= 27 + 1e-9 for t in stage.tiers)  # nobody trains past R


def test_infeasible_deadline_and_budget_say_what_would_work() -> None:
    late = priced(1, 10_000).plan(27, 3)
    assert not late.feasible and late.smallest_deadline is not None
    # One trial on 8 GPUs is fastest but does not fit a 4-GPU node: 27 / 3.2 h on 4 GPUs.
    assert late.smallest_deadline / 3600 == pytest.approx(27 / 3.2, rel=0.1)
    assert priced(late.smallest_deadline / 3600, 10_000).plan(27, 3).feasible
    poor = priced(12, 5).plan(27, 3)
    assert not poor.feasible and poor.smallest_budget is not None and poor.smallest_budget > 5
    assert priced(12, poor.smallest_budget).plan(27, 3).feasible
