"""RubberBand's greedy planner on docs/algorithms.md §5.6, and on deadlines and quotas."""

import itertools
import math

import pytest

from elastune.planners.cost.montecarlo.simulate import PlanSimulator
from elastune.planners.cost.planning.rubberband import RubberBand
from elastune.planners.cost.pricing.catalog import parse_catalog
from elastune.planners.cost.pricing.stage_shapes import build_stage, chains_of, split
from elastune.planners.spec import SpecError, parse_job
from elastune.planners.staging import Profile, Stage, compile_plan

NODE = {"gpus": 4, "gpu": "V100", "price_per_hour": 12.24, "startup": {"mean_s": 180}}
CATALOG = parse_catalog({"instance_types": {"p3.8xlarge": NODE}})
JOB = [Stage(0, 0, 8, 0, 1), Stage(0, 1, 4, 1, 3), Stage(0, 2, 2, 3, 7)]


def simulator(segment_cv: float = 0.0, catalog=CATALOG) -> PlanSimulator:
    profile = Profile.from_scaling(720, speedup={2: 1.8, 4: 3.2}, segment_cv=segment_cv)
    return PlanSimulator(catalog, profile, samples=400)


def path(result) -> list[tuple[str, ...]]:
    return [m.plan.gpus_per_trial[0] for m in result.moves]


def test_deadline_36_minutes_takes_one_cut() -> None:
    result = RubberBand(simulator(), ["p3.8xlarge"], deadline=36 * 60).plan(JOB)
    assert result.feasible
    assert path(result) == [("4", "4", "4"), ("2", "4", "4")]
    # M = $3.13 saved / 2.92 min given up = 1.07 $/min.
    assert result.moves[1].benefit * 60 == pytest.approx(3.13 / 2.92, abs=0.01)
    assert result.outcome.cost_mean == pytest.approx(20.13, abs=0.005)
    assert result.outcome.jct_q / 60 == pytest.approx(32.17, abs=0.005)


def test_deadline_45_minutes_reaches_the_cheapest_plan() -> None:
    sim = simulator()
    result = RubberBand(sim, ["p3.8xlarge"], deadline=45 * 60).plan(JOB)
    assert path(result) == [("4", "4", "4"), ("2", "4", "4"), ("2", "2", "4"), ("1", "2", "4")]
    assert result.outcome.cost_mean == pytest.approx(17.68, abs=0.005)
    # Exhaustive search over GPUs per trial (all trials at once) agrees: nothing cheaper fits.
    node = CATALOG.get("p3.8xlarge")
    feasible = []
    for gpus in itertools.product((1.0, 2.0, 4.0), repeat=3):
        chain = tuple(build_stage(s, g, node, None) for s, g in zip(JOB, gpus, strict=True))
        outcome = sim.run(result.plan.with_chain(0, chain))
        if outcome.jct_q <= 45 * 60:
            feasible.append(outcome.cost_mean)
    assert min(feasible) == pytest.approx(result.outcome.cost_mean)


def test_p95_feasibility_keeps_the_fastest_plan_under_stragglers() -> None:
    result = RubberBand(simulator(segment_cv=0.1), ["p3.8xlarge"], deadline=36 * 60).plan(JOB)
    assert result.feasible
    assert path(result) == [("4", "4", "4")]


def test_infeasible_deadline_names_the_smallest_that_works() -> None:
    sim = simulator(segment_cv=0.1)
    result = RubberBand(sim, ["p3.8xlarge"], deadline=25 * 60).plan(JOB)
    assert not result.feasible
    assert result.smallest_deadline == math.ceil(result.outcome.jct_q)
    assert 29.25 * 60 < result.smallest_deadline < 36 * 60
    again = RubberBand(sim, ["p3.8xlarge"], deadline=result.smallest_deadline).plan(JOB)
    assert again.feasible


def test_moves_to_the_cheaper_instance_type() -> None:
    catalog = parse_catalog(
        {
            "instance_types": {
                "p3.8xlarge": NODE,
                "g4dn.xlarge": {**NODE, "gpus": 1, "gpu": "T4", "price_per_hour": 0.526},
            }
        }
    )
    sim = simulator(catalog=catalog)
    # One GPU per trial everywhere takes 3 + 12 + 24 + 48 = 87 min on the cheap type.
    loose = RubberBand(sim, ["p3.8xlarge", "g4dn.xlarge"], deadline=2 * 3600).plan(JOB)
    assert {s.instance_type for s in loose.plan.stages} == {"g4dn.xlarge"}
    assert loose.outcome.cost_mean < 17.68 / 4
    # Within an hour the long last stage needs 4-GPU nodes; the early ones stay cheap.
    tight = RubberBand(sim, ["p3.8xlarge", "g4dn.xlarge"], deadline=3600).plan(JOB)
    assert tight.feasible and tight.plan.stages[0].instance_type == "g4dn.xlarge"
    assert tight.plan.stages[-1].instance_type == "p3.8xlarge"


def test_loose_deadline_is_never_dearer_than_the_smallest_static_pool() -> None:
    result = RubberBand(simulator(0.05), ["p3.8xlarge"], deadline=4 * 3600).plan(JOB)
    static = RubberBand(simulator(0.05), ["p3.8xlarge"], deadline=4 * 3600)
    lean = static.lean(chains_of(JOB), CATALOG.get("p3.8xlarge"), [None])
    assert lean is not None
    assert result.outcome.cost_mean <= static.simulator.run(lean).cost_mean + 1e-9
    assert result.outcome.jct_q <= 4 * 3600


HYPERBAND = {
    "name": "d",
    "trainable": "m:f",
    "metric": "acc",
    "space": {"x": {"type": "float", "low": 0, "high": 1}},
    "scheduler": {"name": "hyperband", "min_resource": 1, "max_resource": 27},
}


def test_quota_caps_the_gpus_held_by_side_by_side_brackets() -> None:
    stages = compile_plan(parse_job(HYPERBAND)).stages
    result = RubberBand(simulator(0.05), ["p3.8xlarge"], max_gpus=24).plan(stages)
    assert result.feasible
    peaks = [max(s.instances * 4 for s in chain) for chain in result.plan.chains]
    assert len(peaks) == 4 and sum(peaks) <= 24
    with pytest.raises(SpecError, match=r"compute.max_gpus: 12 GPUs is too few for 4 brackets"):
        RubberBand(simulator(), ["p3.8xlarge"], max_gpus=12).plan(stages)


def test_split_is_proportional_with_at_least_one_each() -> None:
    assert split(10, [1, 1, 2]) == [3, 3, 4]
    assert split(3, [100, 1, 1]) == [1, 1, 1]
    assert sum(split(17, [5, 3, 2, 7]) or []) == 17
    assert split(2, [1, 1, 1]) is None


def test_constructor_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="deadline must be positive"):
        RubberBand(simulator(), ["p3.8xlarge"], deadline=0)
    with pytest.raises(ValueError, match="max_gpus must be >= 1"):
        RubberBand(simulator(), ["p3.8xlarge"], max_gpus=0)
    with pytest.raises(SpecError, match="unknown instance type 'x'"):
        RubberBand(simulator(), ["x"])
