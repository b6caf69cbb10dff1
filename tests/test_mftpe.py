"""The multi-fidelity TPE sampler: ladder ranking, candidate pools, any search space."""

from __future__ import annotations

import math

import numpy as np
import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.distributions import (
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState

from elastune.planners.samplers import MultiFidelityTpeSampler
from elastune.planners.samplers.mftpe import MIN_BANDWIDTH, from_unit, magic_clip, to_unit
from elastune.planners.sim.configs import RowDraw

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = {
    "lr": FloatDistribution(1e-4, 0.3, log=True),
    "width": IntDistribution(4, 32, log=True),
    "dropout": FloatDistribution(0.0, 0.5, step=0.1),
    "layers": IntDistribution(1, 5),
    "optimizer": CategoricalDistribution(["sgd", "adam", "lamb"]),
}


def report(study: optuna.Study, trial: optuna.Trial, values: dict[int, float]) -> None:
    for step, value in values.items():
        trial.report(value, step)
    study.tell(trial, state=TrialState.PRUNED)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gamma": 0}, "gamma must lie in \\(0, 1\\), got 0"),
        ({"random_fraction": 1.5}, "random_fraction must lie in \\[0, 1\\], got 1.5"),
        ({"min_points": 1}, "min_points must be >= 2, got 1"),
        ({"n_candidates": 0}, "n_candidates must be >= 1, got 0"),
        ({"bandwidth": 0}, "bandwidth must be > 0, got 0"),
        ({"candidates": []}, "candidates must hold at least one configuration"),
    ],
)
def test_bad_arguments_are_named(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        MultiFidelityTpeSampler(**kwargs)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(list(SPACE)), st.floats(0, 1))
def test_unit_coordinates_round_trip_on_the_grid(name, u) -> None:
    distribution = SPACE[name]
    if isinstance(distribution, CategoricalDistribution):
        u = float(int(u * 2.999))
    value = from_unit(distribution, u)
    assert distribution._contains(distribution.to_internal_repr(value))
    assert from_unit(distribution, to_unit(distribution, value)) == value


def test_the_ladder_ranks_a_higher_rung_above_any_value_below_it() -> None:
    sampler = MultiFidelityTpeSampler(seed=0, min_points=2, gamma=0.2)
    study = optuna.create_study(sampler=sampler)
    space = {"x": FloatDistribution(0, 1)}
    # Ten trials at rung 1; the two with the largest x reach rung 3 with a worse value
    # than many rung-1 values: they still form the good set.
    for i in range(10):
        trial = study.ask(space)
        x = trial.params["x"]
        values = {1: 0.1 + x}
        if i < 2:
            values[3] = 5.0
        report(study, trial, values)
    trials = study.get_trials(deepcopy=False)
    good, bad = sampler._split(study, trials, space)
    assert len(good) == 2 and len(bad) == 8
    assert sorted(good[:, 0]) == sorted(t.params["x"] for t in trials[:2])


def test_by_default_the_good_set_is_the_best_of_the_top_rung() -> None:
    # Bloom's ladder: 90 trials at rung 1, a third of them at rung 3, a ninth at rung 9.
    # The good set is the best 7% of the ranking: the top rung's best 7 of its 10, not all
    # 10 and the best promoted trials of the rung below (what 15% took in).
    sampler = MultiFidelityTpeSampler(seed=0)
    study = optuna.create_study(sampler=sampler)
    space = {"x": FloatDistribution(0, 1)}
    for i in range(90):
        trial = study.ask(space)
        x = trial.params["x"]
        levels = (1,) + ((3,) if i % 3 == 0 else ()) + ((9,) if i % 9 == 0 else ())
        report(study, trial, {level: x for level in levels})
    trials = study.get_trials(deepcopy=False)
    good, _ = sampler._split(study, trials, space)
    top = sorted(t.params["x"] for t in trials if 9 in t.intermediate_values)
    assert sampler.gamma == 0.07
    assert sorted(good[:, 0]) == top[:7]


def test_a_rung_with_too_few_results_does_not_count() -> None:
    sampler = MultiFidelityTpeSampler(seed=0, min_points=3)
    study = optuna.create_study(sampler=sampler)
    space = {"x": FloatDistribution(0, 1)}
    for i in range(4):
        trial = study.ask(space)
        report(study, trial, {1: trial.params["x"], **({5: 9.0} if i == 0 else {})})
    good, bad = sampler._split(study, study.get_trials(deepcopy=False), space)
    # Rung 5 holds one result, so trial 0 is ranked by its rung-1 value like the rest.
    xs = sorted(t.params["x"] for t in study.trials)
    assert good[:, 0].tolist() == xs[:2] and sorted(bad[:, 0]) == xs[2:]


def test_it_finds_the_good_region_of_a_mixed_space() -> None:
    sampler = MultiFidelityTpeSampler(seed=1, random_fraction=0.0)
    study = optuna.create_study(sampler=sampler)

    def loss(p: dict) -> float:
        return (
            abs(math.log10(p["lr"]) + 2)
            + abs(p["width"] - 16) / 16
            + (p["optimizer"] != "adam")
            + p["dropout"]
        )

    for _ in range(60):
        trial = study.ask(SPACE)
        report(study, trial, {1: loss(trial.params)})
    late = [loss(t.params) for t in study.trials[40:]]
    early = [loss(t.params) for t in study.trials[:10]]  # random: the model is not ready
    assert np.median(late) < 0.5 * np.median(early)
    for t in study.trials:
        assert all(SPACE[n]._contains(SPACE[n].to_internal_repr(v)) for n, v in t.params.items())


def test_candidates_are_tried_once_and_random_picks_follow_rowdraw() -> None:
    rows = [{"x": i / 20, "y": (i * 7 % 20) / 20} for i in range(20)]
    space = {"x": FloatDistribution(0, 1), "y": FloatDistribution(0, 1)}
    sampler = MultiFidelityTpeSampler(seed=3, random_fraction=1.0, candidates=rows)
    study = optuna.create_study(sampler=sampler)
    picked = []
    for _ in range(20):
        trial = study.ask(space)
        picked.append(rows.index(trial.params))
        report(study, trial, {1: trial.params["x"]})
    assert picked == RowDraw(20, 3)._rows  # the permutation random search draws
    with pytest.raises(ValueError, match="all 20 candidates have been tried"):
        study.ask(space)


def test_the_model_chooses_among_candidates_by_their_parameters_only() -> None:
    rows = [{"x": i / 99} for i in range(100)]
    space = {"x": FloatDistribution(0, 1)}
    sampler = MultiFidelityTpeSampler(seed=0, random_fraction=0.0, candidates=rows)
    study = optuna.create_study(sampler=sampler)
    for _ in range(40):
        trial = study.ask(space)
        report(study, trial, {1: abs(trial.params["x"] - 0.3)})
    picked = [t.params["x"] for t in study.trials]
    assert len(set(picked)) == 40  # never twice
    # Once the model starts (10 results), it picks the rows next to 0.3 first.
    assert np.median([abs(x - 0.3) for x in picked[10:25]]) < 0.1


def test_proposals_on_a_whole_space_do_not_clone_the_good_set() -> None:
    # Two basins, the broad one found first. With kernels only kept above 0.03, 118 of
    # these 150 model proposals landed within 0.02 of an earlier trial (a real job's
    # proposals collapsed onto its first good trial alike); the magic clip keeps the
    # kernels of a small good set wide, and 33 do.
    space = {"x": FloatDistribution(0, 1), "y": FloatDistribution(0, 1)}

    def loss(x: float, y: float) -> float:
        broad = 0.5 + 2 * ((x - 0.25) ** 2 + (y - 0.25) ** 2)
        narrow = 20 * ((x - 0.8) ** 2 + (y - 0.75) ** 2)
        return min(broad, narrow)

    near = 0
    for seed in range(5):
        study = optuna.create_study(sampler=MultiFidelityTpeSampler(seed, random_fraction=0.0))
        for _ in range(40):
            trial = study.ask(space)
            report(study, trial, {1: loss(**trial.params)})
        xs = np.array([[t.params["x"], t.params["y"]] for t in study.trials])
        near += sum(
            bool((np.linalg.norm(xs[:i] - xs[i], axis=1) < 0.02).any()) for i in range(10, 40)
        )
    assert near < 75
    assert magic_clip(2) == 0.25 and magic_clip(1000) == MIN_BANDWIDTH
