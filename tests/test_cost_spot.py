"""Spot capacity in the cost planner: prices, interruptions, the planner's choice, the report."""

import math
from pathlib import Path

import numpy as np
import pytest

from elastune.planners.cost import plan_job
from elastune.planners.cost.montecarlo.outcome import upper_quantile
from elastune.planners.cost.montecarlo.simulate import PlanSimulator
from elastune.planners.cost.planning.rubberband import RubberBand
from elastune.planners.cost.pricing.allocation import AllocationPlan, GpuTier, StagePlan
from elastune.planners.cost.pricing.catalog import parse_catalog
from elastune.planners.cost.reports.gantt import draw_gantt
from elastune.planners.spec import SpecError, parse_job
from elastune.planners.staging import Profile, Stage, nodes_needed

# docs/algorithms.md §5.6: 4-GPU nodes at $12.24/h, 3 min to become ready; 12 min per epoch on
# 1 GPU, S = {2: 1.8, 4: 3.2}; SHA with (8, 4, 2) trials training (1, 2, 4) epochs.
NODE = {"gpus": 4, "gpu": "V100", "price_per_hour": 12.24, "startup": {"mean_s": 180}}
JOB = [Stage(0, 0, 8, 0, 1), Stage(0, 1, 4, 1, 3), Stage(0, 2, 2, 3, 7)]


def catalog(rate: float | None, discount: float = 0.7):
    spot = {} if rate is None else {"spot": {"discount": discount, "interruptions_per_hour": rate}}
    return parse_catalog({"instance_types": {"p3.8xlarge": {**NODE, **spot}}})


def profile(segment_cv: float = 0.0) -> Profile:
    return Profile.from_scaling(720, speedup={2: 1.8, 4: 3.2}, segment_cv=segment_cv)


def example(gpus: tuple[int, int, int], market: str = "on-demand") -> AllocationPlan:
    stages = []
    for k, (stage, g) in enumerate(zip(JOB, gpus, strict=True)):
        nodes = nodes_needed((float(g),) * stage.trials, 4)
        tier = GpuTier(stage.trials, float(g), stage.stop - stage.start)
        stages.append(StagePlan(0, k, (tier,), "p3.8xlarge", nodes, market))
    return AllocationPlan((tuple(stages),))


def one_node(rate: float, overhead_s: float = 0.0, samples: int = 3) -> PlanSimulator:
    """One 1-GPU node at $3.60/h (75% off on spot), ready after a fixed 180 s, 60 s/unit."""
    node = {
        "gpus": 1,
        "gpu": "T4",
        "price_per_hour": 3.6,
        "startup": {"mean_s": 180},
        "spot": {"discount": 0.75, "interruptions_per_hour": rate},
    }
    cat = parse_catalog({"instance_types": {"n1": node}})
    return PlanSimulator(cat, Profile({1.0: 60.0}, overhead_s=overhead_s), samples=samples, seed=5)


def single(units: float, market: str) -> AllocationPlan:
    return AllocationPlan(((StagePlan(0, 0, (GpuTier(1, 1.0, units),), "n1", 1, market),),))


# --- the simulator ----------------------------------------------------------------------


def test_spot_pays_the_discounted_price() -> None:
    # 180 s of startup + 600 s of training, billed from the request: 780 s at $3.60/h
    # on-demand ($0.78), at $0.90/h on spot.
    sim = one_node(rate=0.0)
    on_demand, spot = sim.run(single(10, "on-demand")), sim.run(single(10, "spot"))
    assert np.allclose(on_demand.jct, 780) and np.allclose(spot.jct, 780)
    assert np.allclose(on_demand.cost, 0.78)
    assert np.allclose(spot.cost, 0.195)
    assert np.all(spot.interruptions == 0)


def test_at_rate_zero_spot_is_a_discounted_on_demand_run() -> None:
    sim = PlanSimulator(catalog(rate=0.0), profile(segment_cv=0.1), samples=300, seed=2)
    on_demand = sim.run(example((2, 4, 4)))
    spot = sim.run(example((2, 4, 4)).on_market("spot"))
    assert np.array_equal(spot.jct, on_demand.jct)  # same stragglers, same startup draws
    assert np.allclose(spot.cost, on_demand.cost * 0.3)
    assert [s.cost for s in spot.stages] == pytest.approx([s.cost * 0.3 for s in on_demand.stages])


def test_an_interruption_costs_the_work_since_the_checkpoint_and_a_restart() -> None:
    # A 180 s startup, then a segment of 30 s overhead (restore) and 10 units of 60 s:
    # 810 s without interruption. At 3 per hour a running node is interrupted after 1200 s
    # on average. Each interruption waits 180 s for the replacement, restores again (30 s)
    # and redoes part of one unit (0-60 s).
    sim = one_node(rate=3.0, overhead_s=30, samples=4000)
    outcome = sim.run(single(10, "spot"))
    k = outcome.interruptions
    redo = outcome.jct - 810 - k * (180 + 30)
    assert np.all(redo[k == 0] == 0)
    assert np.all((redo >= 0) & (redo <= 60 * k + 1e-9))
    # Lost work is half a unit on average.
    assert float(np.mean(redo[k == 1])) == pytest.approx(30, abs=2.5)
    # The first interruption comes within the 630 s of running with P = 1 - exp(-630/1200).
    assert float(np.mean(k == 0)) == pytest.approx(math.exp(-630 / 1200), abs=0.025)
    # Every instance is billed from its request to its interruption or release: the pieces
    # tile the run, each rounded up to a whole second (each lasts over the 60 s minimum).
    floor = 0.9 / 3600 * outcome.jct
    assert np.all(outcome.cost >= floor - 1e-9)
    assert np.all(outcome.cost <= floor + 0.9 / 3600 * (k + 1) + 1e-9)
    assert np.mean(outcome.cost[k > 0]) > np.mean(outcome.cost[k == 0])


@pytest.mark.parametrize(
    "plan",
    [
        example((2, 4, 4), "spot"),
        example((1, 2, 4), "spot"),
        # Fewer nodes than trials: waves, and idle nodes at the barriers.
        AllocationPlan(
            (
                (
                    StagePlan(0, 0, (GpuTier(8, 1.0, 1),), "p3.8xlarge", 1, "spot"),
                    StagePlan(0, 1, (GpuTier(4, 2.0, 2, 1),), "p3.8xlarge", 1, "spot"),
                    StagePlan(0, 2, (GpuTier(2, 4.0, 4, 3),), "p3.8xlarge", 2, "spot"),
                ),
            )
        ),
        # Spot in the middle: the pool is released and re-provisioned on both sides.
        AllocationPlan(
            (
                (
                    example((4, 4, 4)).stages[0],
                    example((2, 2, 4), "spot").stages[1],
                    example((4, 4, 4)).stages[2],
                ),
            )
        ),
    ],
)
def test_interruptions_only_delay_and_are_counted(plan: AllocationPlan) -> None:
    calm = PlanSimulator(catalog(rate=0.0), profile(0.05), samples=400, seed=7).run(plan)
    risky = PlanSimulator(catalog(rate=1.5), profile(0.05), samples=400, seed=7).run(plan)
    assert np.all(risky.jct >= calm.jct - 1e-9)  # same draws: interruptions only add time
    # (a node interrupted while another one holds the stage up may cost no time at all)
    assert risky.jct.mean() > calm.jct.mean()
    assert risky.interruptions.mean() > 0 and calm.interruptions.max() == 0
    for stage, outcome in zip(plan.stages, risky.stages, strict=True):
        assert (outcome.interruptions > 0) == (stage.market == "spot")


def test_a_spot_stage_needs_spot_prices_and_a_known_market() -> None:
    sim = PlanSimulator(catalog(rate=None), profile(), samples=2)
    with pytest.raises(ValueError, match=r"p3\.8xlarge has no spot prices"):
        sim.run(example((4, 4, 4), "spot"))
    with pytest.raises(ValueError, match="market must be one of"):
        example((4, 4, 4), "reserved")


def test_upper_quantile_is_a_conservative_order_statistic() -> None:
    values = np.arange(1.0, 201.0)  # 1..200
    assert upper_quantile(values, 0.95, 0.5) == 190.0
    assert upper_quantile(values, 0.95, 0.95) == 196.0  # 190 + 1.645 * sqrt(9.5), rounded up
    assert upper_quantile(values[:10], 0.95, 0.95) == 10.0


# --- RubberBand ------------------------------------------------------------------------


def test_with_spot_disallowed_the_worked_example_is_unchanged() -> None:
    def plans(cat, deadline: float):
        sim = PlanSimulator(cat, profile(), samples=400)
        result = RubberBand(sim, ["p3.8xlarge"], deadline=deadline * 60).plan(JOB)
        return result, [m.plan for m in result.moves]

    for deadline, cost in ((36, 20.13), (45, 17.68)):
        _, path = plans(catalog(rate=None), deadline)
        priced, path_priced = plans(catalog(rate=0.015), deadline)
        assert path_priced == path  # spot prices in the catalog change nothing
        assert priced.outcome.cost_mean == pytest.approx(cost, abs=0.005)
        assert {s.market for s in priced.plan.stages} == {"on-demand"}


def test_spot_is_chosen_at_a_loose_deadline_and_rejected_at_a_tight_one() -> None:
    cat = catalog(rate=2.0)  # a very unreliable spot market, 70% off

    def plan(deadline_min: float, spot: bool):
        sim = PlanSimulator(cat, profile(), samples=400)
        return RubberBand(sim, ["p3.8xlarge"], deadline=deadline_min * 60, spot=spot).plan(JOB)

    tight = plan(45, spot=True)
    assert tight.feasible and {s.market for s in tight.plan.stages} == {"on-demand"}
    assert tight.plan == plan(45, spot=False).plan
    # The same plan on spot is far cheaper on average, and without an interruption it
    # would be on time; the interruption risk pushes its p95 past the deadline.
    twin = tight.plan.on_market("spot")
    risky = PlanSimulator(cat, profile(), samples=400).run(twin)
    assert risky.cost_mean < 0.5 * tight.outcome.cost_mean
    assert np.all(risky.jct[risky.interruptions == 0] <= 45 * 60)
    assert risky.jct_q > 45 * 60

    loose = plan(60, spot=True)
    on_demand = plan(60, spot=False)
    assert loose.feasible and {s.market for s in loose.plan.stages} == {"spot"}
    assert loose.outcome.cost_mean < 0.7 * on_demand.outcome.cost_mean
    assert loose.outcome.jct_q <= 60 * 60
    assert loose.outcome.interruptions.mean() > 1  # it plans through interruptions


@pytest.mark.parametrize(("rate", "deadline_min"), [(2.0, 60), (0.5, 45), (1.0, 50)])
def test_spot_plans_meet_the_p95_deadline_on_fresh_seeds(rate: float, deadline_min: int) -> None:
    cat = catalog(rate=rate)
    sim = PlanSimulator(cat, profile(0.05), samples=200)
    result = RubberBand(sim, ["p3.8xlarge"], deadline=deadline_min * 60, spot=True).plan(JOB)
    assert result.feasible and any(s.market == "spot" for s in result.plan.stages)
    fresh = PlanSimulator(cat, profile(0.05), samples=4000, seed=20_240_611).run(result.plan)
    assert np.mean(fresh.jct <= deadline_min * 60) >= 0.95


def test_a_one_stage_switch_to_spot_in_the_neighbourhood() -> None:
    sim = PlanSimulator(catalog(rate=0.015), profile(), samples=50)
    planner = RubberBand(sim, ["p3.8xlarge"], deadline=3600, spot=True)
    plan = example((4, 4, 4))
    chains = [JOB]
    caps = planner.usable(chains)
    moved = [chain for _, chain in planner.neighbours(plan, chains, caps)]
    markets = {tuple(s.market for s in chain) for chain in moved}
    assert ("on-demand", "spot", "on-demand") in markets
    assert ("spot", "spot", "spot") in markets
    off = RubberBand(sim, ["p3.8xlarge"], deadline=3600)
    assert all(
        s.market == "on-demand" for _, chain in off.neighbours(plan, chains, caps) for s in chain
    )


def test_spot_needs_a_type_with_spot_prices() -> None:
    sim = PlanSimulator(catalog(rate=None), profile(), samples=2)
    with pytest.raises(SpecError, match=r"compute.spot: none of the instance types \(p3.8xlarge\)"):
        RubberBand(sim, ["p3.8xlarge"], spot=True)
    with pytest.raises(ValueError, match="spot_confidence must lie in"):
        RubberBand(sim, ["p3.8xlarge"], spot_confidence=1.0)


# --- the job file, the report and the Gantt chart ----------------------------------------

CATALOG = parse_catalog(
    {
        "defaults": {"startup": {"mean_s": 120, "sd_s": 30}, "queueing": {"mean_s": 10}},
        "instance_types": {
            "x1": {"gpus": 1, "gpu": "T4", "price_per_hour": 0.5,
                   "spot": {"discount": 0.7, "interruptions_per_hour": 1.0}},
            "x4": {"gpus": 4, "gpu": "T4", "price_per_hour": 2.4,
                   "spot": {"discount": 0.6, "interruptions_per_hour": 4.0}},
        },
    }
)  # fmt: skip
SPEC = {
    "name": "d",
    "trainable": "m:f",
    "metric": "acc",
    "space": {"x": {"type": "float", "low": 0, "high": 1}},
    "scheduler": {"name": "sha", "min_resource": 1, "max_resource": 27},
    "budget": {"deadline": "40m", "max_cost_usd": 20},
    "compute": {"max_gpus": 32},
    "profile": {"seconds_per_unit": {1: 120}, "speedup": {2: 1.8, 4: 3.2}, "segment_cv": 0.05},
}


def job(spot: bool | None, **changes: object):
    compute = dict(SPEC["compute"]) | ({} if spot is None else {"spot": spot})  # type: ignore[arg-type]
    return parse_job({**SPEC, "compute": compute, **changes})


def test_compute_spot_defaults_to_off_and_is_validated() -> None:
    assert job(None).compute.spot is False
    assert job(True).compute.spot is True
    for bad in ("maybe", 1, "true"):
        with pytest.raises(SpecError, match=r"job: compute.spot: Input should be a valid boolean"):
            job(bad)  # type: ignore[arg-type]


def test_report_without_spot_is_the_on_demand_one() -> None:
    default, off = plan_job(job(None), catalog=CATALOG), plan_job(job(False), catalog=CATALOG)
    assert default.to_dict() == off.to_dict()
    data = default.to_dict()
    assert {s["market"] for s in data["stages"]} == {"on-demand"}
    assert data["spot"] == {"allowed": False, "stages": [], "expected_interruptions": 0.0}
    assert not any(line.startswith("spot") for line in default.summary_lines())


def test_report_json_table_and_gantt_mark_spot_stages(tmp_path: Path) -> None:
    report = plan_job(job(True), catalog=CATALOG)
    assert report.feasible
    data = report.to_dict()
    spot = [s for s in data["stages"] if s["market"] == "spot"]
    assert spot and data["spot"]["allowed"] and data["spot"]["stages"] == [s["stage"] for s in spot]
    assert all(s["expected_interruptions"] > 0 for s in spot)
    assert data["spot"]["expected_interruptions"] == pytest.approx(
        sum(s["expected_interruptions"] for s in data["stages"]), abs=1e-3
    )
    assert data["jct_s"]["p95"] <= data["spot_feasibility"]["jct_s_judged"] <= 40 * 60
    columns, rows = report.to_table()
    market, interruptions = columns.index("market"), columns.index("interruptions")
    assert [row[market] for row in rows] == [s["market"] for s in data["stages"]]
    assert all(float(row[interruptions]) > 0 for row in rows if row[market] == "spot")
    assert any(line.startswith("spot: ") for line in report.summary_lines())
    assert report.trace is not None
    assert {n.market for n in report.trace.nodes} >= {"spot"}
    path = draw_gantt(report, tmp_path / "spot.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_seer_ignores_spot_and_says_so() -> None:
    report = plan_job(job(True), planner="seer", catalog=CATALOG)
    assert {a.market for a in report.allocations} == {"on-demand"}
    assert "spot ignored" in report.to_dict()["seer"]["note"]
