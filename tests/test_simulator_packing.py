"""The simulator with Fluid packing: synchronous stages as TrialGroups on a pool of
GPUs, elastic widths from a scaling profile."""

from __future__ import annotations

import pytest

from elastune.planners.sim import Curve, Packing, simulate
from elastune.planners.spec import parse_job
from elastune.planners.staging import Profile

S = {2: 1.8, 4: 3.2, 8: 5.6}


class Toy:
    """Accuracy grows with x and with epochs; an epoch costs 1 + x seconds, so trials differ
    in height."""

    name, max_resource, table = "toy", 9, None

    def curve(self, config):
        x = config["x"]
        return Curve([x * e / 9 for e in range(1, 10)], [(1 + x) * e for e in range(1, 10)])


def job(scheduler: dict):
    return parse_job(
        {
            "name": "toy",
            "trainable": "m:f",
            "metric": "acc",
            "space": {"x": {"type": "float", "low": 0, "high": 1}},
            "sampler": {"name": "random", "seed": 0},
            "scheduler": scheduler,
        }
    )


SHA = job({"name": "sha", "eta": 3, "min_resource": 1, "max_resource": 9, "max_trials": 27})
HYPERBAND = job({"name": "hyperband", "eta": 3, "min_resource": 1, "max_resource": 9})


@pytest.mark.parametrize("spec", [SHA, HYPERBAND], ids=["sha", "hyperband"])
@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_packing_shortens_synchronous_stages_and_changes_no_decision(spec, policy):
    alone = simulate(spec, Toy(), workers=8, seed=0)
    packed = simulate(
        spec,
        Toy(),
        workers=8,
        seed=0,
        packing=Packing(policy, Profile.from_speeds(S), gpus_per_node=8),
    )
    # The top rungs leave GPUs idle without packing; widening the survivors uses them.
    assert packed.simulated_seconds < alone.simulated_seconds
    assert packed.best_trial == alone.best_trial
    assert packed.segments_run == alone.segments_run == alone.results == packed.results
    # Sub-linear speed-up: the same work costs more GPU time when it runs wide.
    assert packed.gpu_seconds > alone.gpu_seconds
    assert packed.gpu_seconds <= 8 * packed.simulated_seconds + 1e-6


@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_linear_scaling_costs_no_extra_gpu_time(policy):
    alone = simulate(SHA, Toy(), workers=8, seed=0)
    packed = simulate(SHA, Toy(), workers=8, seed=0, packing=Packing(policy, Profile.linear(8)))
    assert packed.gpu_seconds == pytest.approx(alone.gpu_seconds)


def test_a_lone_trial_runs_on_the_widest_width_the_profile_covers():
    spec = job({"name": "sha", "eta": 3, "min_resource": 9, "max_resource": 9, "max_trials": 1})
    alone = simulate(spec, Toy(), workers=8, seed=0)
    packed = simulate(
        spec, Toy(), workers=8, seed=0, packing=Packing("static", Profile.from_speeds(S))
    )
    assert packed.simulated_seconds == pytest.approx(alone.simulated_seconds / 5.6)
    assert packed.gpu_seconds == pytest.approx(8 * packed.simulated_seconds)
    # Its observations keep their order, spread over its shorter run.
    times = [t for t, _ in packed.anytime]
    assert times == sorted(times) and times[-1] == pytest.approx(packed.simulated_seconds)


def test_a_deadline_cuts_a_packed_run():
    full = simulate(SHA, Toy(), workers=8, seed=0, packing=Packing(profile=Profile.from_speeds(S)))
    deadline = full.simulated_seconds / 2
    cut = simulate(
        SHA,
        Toy(),
        workers=8,
        seed=0,
        deadline=deadline,
        packing=Packing(profile=Profile.from_speeds(S)),
    )
    assert cut.simulated_seconds == deadline
    assert cut.results < full.results
    assert cut.gpu_seconds <= 8 * deadline + 1e-6
    assert all(t <= deadline for t, _ in cut.anytime)


def test_packing_is_for_synchronous_schedulers():
    asha = job({"name": "asha", "min_resource": 1, "max_resource": 9, "max_trials": 9})
    with pytest.raises(ValueError, match="synchronous sha or hyperband, not asha"):
        simulate(asha, Toy(), workers=4, packing=Packing())
    with pytest.raises(ValueError, match="policy must be one of static, dynamic"):
        Packing("greedy")
