"""The plan simulator on the worked example of docs/algorithms.md §5.6 and on hand-worked cases."""

import dataclasses

import numpy as np
import pytest

from elastune.planners.cost.montecarlo.draws import Draws
from elastune.planners.cost.montecarlo.simulate import PlanSimulator
from elastune.planners.cost.planning.baselines import static_pool
from elastune.planners.cost.pricing.allocation import AllocationPlan, GpuTier, StagePlan
from elastune.planners.cost.pricing.catalog import parse_catalog
from elastune.planners.staging import Profile, nodes_needed

# §5.6: 4-GPU nodes at $12.24/h, 3 min to become ready, billed from request; 12 min per
# epoch on 1 GPU, S = {2: 1.8, 4: 3.2}; SHA with (8, 4, 2) trials training (1, 2, 4) epochs.
NODE = {"gpus": 4, "gpu": "V100", "price_per_hour": 12.24, "startup": {"mean_s": 180}}
PER_SECOND = parse_catalog({"instance_types": {"p3.8xlarge": NODE}})
HOURLY = parse_catalog(
    {
        "instance_types": {
            "p3.8xlarge": {**NODE, "billing": {"quantum_s": 3600, "min_charge_s": 3600}}
        }
    }
)
JOB = ((8, 1), (4, 2), (2, 4))


def profile(segment_cv: float = 0.0) -> Profile:
    return Profile.from_scaling(720, speedup={2: 1.8, 4: 3.2}, segment_cv=segment_cv)


def plan(gpus: tuple[int, int, int]) -> AllocationPlan:
    stages = []
    for k, ((trials, epochs), g) in enumerate(zip(JOB, gpus, strict=True)):
        nodes = nodes_needed((float(g),) * trials, 4)
        stages.append(StagePlan(0, k, (GpuTier(trials, float(g), epochs),), "p3.8xlarge", nodes))
    return AllocationPlan((tuple(stages),))


@pytest.mark.parametrize(
    ("gpus", "nodes", "minutes", "dollars"),
    [
        ((4, 4, 4), (8, 4, 2), 29.25, 23.26),
        ((2, 4, 4), (4, 4, 2), 32.17, 20.13),
        ((4, 2, 4), (8, 2, 2), 35.08, 22.58),
        ((4, 4, 2), (8, 4, 1), 40.92, None),
        ((2, 2, 4), (4, 2, 2), 38.00, 19.45),
        ((2, 4, 2), (4, 4, 1), 43.83, None),
        ((1, 4, 4), (2, 4, 2), 40.50, 20.81),  # stage 2 waits 3 min for 2 new nodes
        ((1, 2, 4), (2, 2, 2), 43.33, 17.68),
    ],
)
def test_worked_example_table(gpus, nodes, minutes, dollars) -> None:
    example = plan(gpus)
    assert tuple(s.instances for s in example.stages) == nodes
    outcome = PlanSimulator(PER_SECOND, profile(), samples=5).run(example)
    assert np.allclose(outcome.jct, outcome.jct[0])  # no noise: every sample agrees
    assert outcome.jct_q / 60 == pytest.approx(minutes, abs=0.005)
    if dollars is not None:
        assert outcome.cost_mean == pytest.approx(dollars, abs=0.005)


def test_stragglers_at_ten_percent_per_segment() -> None:
    simulator = PlanSimulator(PER_SECOND, profile(segment_cv=0.1), samples=4000, seed=1)
    elastic = simulator.run(plan((2, 4, 4)))
    fastest = simulator.run(plan((4, 4, 4)))
    # §5.6: (2,4,4) has mean JCT about 34.7 and p95 about 37.1 min; (4,4,4) p95 about 33.7.
    assert elastic.jct.mean() / 60 == pytest.approx(34.7, abs=0.15)
    assert elastic.jct_q / 60 == pytest.approx(37.1, abs=0.25)
    assert fastest.jct_q / 60 == pytest.approx(33.7, abs=0.25)


def test_a_simulator_judging_at_another_quantile_reruns_nothing() -> None:
    p95 = PlanSimulator(PER_SECOND, profile(segment_cv=0.1), samples=400, seed=1)
    elastic = p95.run(plan((2, 4, 4)))
    p50 = p95.judging(0.5)
    median = p50.run(plan((2, 4, 4)))
    assert median.chains[0][0] is elastic.chains[0][0]  # the run p95 made, not a new one
    assert median.jct_q == pytest.approx(float(np.quantile(elastic.jct, 0.5)))
    assert elastic.jct_q > median.jct_q and p95.quantile == 0.95
    with pytest.raises(ValueError, match="quantile must lie in"):
        p95.judging(1.0)


def test_static_pool_costs_more_per_second_and_the_same_hourly() -> None:
    per_second = PlanSimulator(PER_SECOND, profile(), samples=3)
    static = static_pool(per_second, plan((2, 4, 4)), "p3.8xlarge", 4)
    assert static is not None and static.hold
    assert per_second.run(static).cost_mean == pytest.approx(26.25, abs=0.005)
    hourly = PlanSimulator(HOURLY, profile(), samples=3)
    static = static_pool(hourly, plan((2, 4, 4)), "p3.8xlarge", 4)
    assert static is not None
    # Under hourly billing every node pays one hour: elasticity saves nothing.
    assert hourly.run(plan((2, 4, 4))).cost_mean == pytest.approx(48.96)
    assert hourly.run(static).cost_mean == pytest.approx(48.96)


def test_stage_costs_add_up_to_the_plan_cost() -> None:
    outcome = PlanSimulator(PER_SECOND, profile(0.1), samples=50).run(plan((1, 4, 4)))
    assert sum(s.cost for s in outcome.stages) == pytest.approx(outcome.cost_mean)
    starts = [float(np.median(s.start)) for s in outcome.stages]
    assert starts == sorted(starts) and starts[0] == pytest.approx(180)


def test_waves_when_the_pool_is_smaller_than_the_stage() -> None:
    # 5 trials of 2 GPUs on one 4-GPU node: 2 slots, 3 waves of 400 s after 180 s startup.
    stage = StagePlan(0, 0, (GpuTier(5, 2.0, 1),), "p3.8xlarge", 1)
    outcome = PlanSimulator(PER_SECOND, profile(), samples=2).run(AllocationPlan(((stage,),)))
    assert outcome.jct_q == pytest.approx(180 + 3 * 400)
    assert outcome.cost_mean == pytest.approx(12.24 * (180 + 1200) / 3600)


def test_trials_wider_than_a_node_are_refused_by_the_cost_model() -> None:
    stage = StagePlan(0, 0, (GpuTier(1, 8.0, 1),), "p3.8xlarge", 2)
    with pytest.raises(ValueError, match=r"8 GPUs does not fit one p3\.8xlarge node"):
        PlanSimulator(PER_SECOND, profile(), samples=2).run(AllocationPlan(((stage,),)))


def test_common_random_numbers_and_resumed_prefixes() -> None:
    first = PlanSimulator(PER_SECOND, profile(0.1), samples=64, seed=3)
    a = first.run(plan((4, 4, 4)))
    b = first.run(plan((4, 4, 2)))  # resumes after the shared first two stages
    fresh = PlanSimulator(PER_SECOND, profile(0.1), samples=64, seed=3).run(plan((4, 4, 2)))
    assert np.array_equal(b.jct, fresh.jct) and np.array_equal(b.cost, fresh.cost)
    # Same draws for the shared stages: plan b's first two stages end exactly as plan a's.
    assert np.array_equal(a.stages[1].end, b.stages[1].end)
    other = PlanSimulator(PER_SECOND, profile(0.1), samples=64, seed=4).run(plan((4, 4, 4)))
    assert not np.array_equal(a.jct, other.jct)


def test_trace_places_every_segment_on_a_live_node() -> None:
    trace = PlanSimulator(PER_SECOND, profile(), samples=2).trace(plan((1, 4, 4)))
    assert trace.jct / 60 == pytest.approx(40.5)
    assert trace.cost == pytest.approx(20.81, abs=0.005)
    assert len(trace.nodes) == 4 and len(trace.segments) == 14
    nodes = {n.node: n for n in trace.nodes}
    for segment in trace.segments:
        node = nodes[segment.node]
        assert node.ready <= segment.start < segment.end <= node.released
        assert segment.offset + segment.gpus <= node.gpus


def test_packing_gives_the_idle_gpus_of_a_stages_nodes_to_its_trials():
    # The §5.6 job at 1 GPU per trial on 2, 1 and 1 nodes: the last stage's 2 trials leave
    # 2 of their node's 4 GPUs idle; packed, they train on 2 GPUs each.
    chain = tuple(
        StagePlan(0, k, (GpuTier(n, 1.0, epochs),), "p3.8xlarge", nodes)
        for k, ((n, epochs), nodes) in enumerate(zip(JOB, (2, 1, 1), strict=True))
    )
    plain = PlanSimulator(PER_SECOND, profile(), samples=20)
    packing = PlanSimulator(PER_SECOND, profile(), samples=20, packing=True)
    node = PER_SECOND.get("p3.8xlarge")
    assert [packing.packed(s, node).gpus_label for s in chain] == ["1", "1", "2"]
    assert plain.packed(chain[2], node) == chain[2]
    before, after = plain.run(AllocationPlan((chain,))), packing.run(AllocationPlan((chain,)))
    last = 4 * 720  # the last stage's segments: 4 epochs of 12 min on 1 GPU
    assert before.jct_q - after.jct_q == pytest.approx(last - last / 1.8)
    assert after.cost_mean < before.cost_mean  # the node is released sooner


def test_packing_needs_the_time_on_one_gpu():
    with pytest.raises(ValueError, match=r"profile.seconds_per_unit: packing needs the time on 1"):
        PlanSimulator(PER_SECOND, Profile({2: 400, 4: 225}), packing=True)


def test_the_calibrations_error_widens_the_band_once_per_run() -> None:
    """A profile whose unit time may be 5% off (sd) forecasts about the same p50 and a p95
    about 1.645 x 5% of the work later; its job overhead's error moves the whole job. No
    error given: no change."""
    chain = plan((4, 4, 4))
    exact = PlanSimulator(PER_SECOND, profile(), samples=2000).run(chain)
    unit = np.zeros((4, 4))
    unit[3, 3] = 0.05**2
    calibrated = dataclasses.replace(profile(), calibration_cov=unit.tolist())
    uncertain = PlanSimulator(PER_SECOND, calibrated, samples=2000).run(chain)
    work = exact.jct_q - 180  # the nodes' startup is not the profile's
    assert np.median(uncertain.jct) == pytest.approx(exact.jct_q, rel=0.01)
    assert uncertain.jct_q - exact.jct_q == pytest.approx(1.645 * 0.05 * work, rel=0.1)
    start = np.zeros((4, 4))
    start[0, 0] = 30.0**2
    late = dataclasses.replace(profile(), job_overhead_s=300.0, calibration_cov=start.tolist())
    shifted = PlanSimulator(PER_SECOND, late, samples=2000).run(chain)
    assert np.std(shifted.jct) == pytest.approx(30.0, rel=0.1)
    assert np.median(shifted.jct) == pytest.approx(exact.jct_q + 300.0, rel=0.01)
    zero = dataclasses.replace(profile(), calibration_cov=np.zeros((4, 4)).tolist())
    assert np.array_equal(
        PlanSimulator(PER_SECOND, zero, samples=50).run(chain).jct,
        PlanSimulator(PER_SECOND, profile(), samples=50).run(chain).jct,
    )


def test_spreads_estimated_from_few_runs_make_a_runs_draws_student_t() -> None:
    """With 6 degrees of freedom a run's speed draw has Student-t's 95% quantile (1.943 sd
    above its mean, t tables), not the normal's 1.645; the other draws stay normal."""
    estimated, known = Draws(seed=0, samples=40_000, dof=6), Draws(seed=0, samples=40_000)
    assert np.quantile(estimated.speed(0.1), 0.95) == pytest.approx(1 + 0.1 * 1.943, abs=0.006)
    assert np.quantile(known.speed(0.1), 0.95) == pytest.approx(1 + 0.1 * 1.645, abs=0.006)
    assert np.array_equal(estimated.normals(0, 0, 0, 3), known.normals(0, 0, 0, 3))


def test_a_straggler_spread_read_from_few_segments_widens_the_tail() -> None:
    """Each simulated run draws a spread of its own around a ``segment_cv`` read with few
    degrees of freedom: a lone trial's p95 lies further out, its median barely moves."""
    stage = (StagePlan(0, 0, (GpuTier(1, 1.0, 4.0),), "p3.8xlarge", 1),)
    read = profile(segment_cv=0.3)
    exact = PlanSimulator(PER_SECOND, read, samples=4000).chain(stage).end
    few = dataclasses.replace(read, segment_cv_dof=5)
    loose = PlanSimulator(PER_SECOND, few, samples=4000).chain(stage).end
    assert np.median(loose) == pytest.approx(np.median(exact), rel=0.02)
    assert np.quantile(loose, 0.95) > np.quantile(exact, 0.95) * 1.03
