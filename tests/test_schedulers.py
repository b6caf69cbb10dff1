"""FIFO, median stopping, PBT, the Optuna-pruner adapter, Repeat, and their job-file specs."""

from __future__ import annotations

import numpy as np
import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from benchmarks.baselines import PrunerScheduler, Repeat
from elastune.planners.search import Action, Result, make_scheduler
from elastune.planners.search.explore import draw, explore, perturb
from elastune.planners.search.schedulers import (
    Asha,
    Fifo,
    Hyperband,
    MedianStopping,
    Pbt,
    SuccessiveHalving,
)
from elastune.planners.spec import SpecError, parse_job
from elastune.planners.spec.geometry import sha_bracket

JOB = {
    "name": "t",
    "trainable": "m:f",
    "metric": "acc",
    "space": {
        "lr": {"type": "float", "low": 1e-4, "high": 0.1, "log": True},
        "width": {"type": "int", "low": 8, "high": 128, "log": True},
        "opt": {"type": "categorical", "choices": ["sgd", "adam", "lamb"]},
    },
}
SPACE = {
    "lr": FloatDistribution(1e-4, 0.1, log=True),
    "width": IntDistribution(8, 128, log=True),
    "opt": CategoricalDistribution(["sgd", "adam", "lamb"]),
}

# --- FIFO ---------------------------------------------------------------------------------


def test_fifo_trains_every_trial_to_the_top_and_fails_failures():
    fifo = Fifo(9, max_trials=3)
    jobs = [fifo.next_segment() for _ in range(4)]
    assert [(j.trial, j.start, j.stop) for j in jobs[:3]] == [(0, 0, 9), (1, 0, 9), (2, 0, 9)]
    assert jobs[3] is None
    assert fifo.on_result(Result(0, 9, 0.2))[0].action is Action.COMPLETE
    assert fifo.on_result(Result(1, 9, 0.2, failed=True))[0].action is Action.FAIL


# --- median stopping ----------------------------------------------------------------------


def _run_to(rule: MedianStopping, losses: dict[int, list[float]]) -> dict[int, Action]:
    """Drive trials one segment at a time; ``losses[t][k]`` is trial t's loss at end k."""
    last: dict[int, Action] = {}
    while (job := rule.next_segment()) is not None:
        loss = losses[job.trial][job.rung]
        last[job.trial] = rule.on_result(Result(job.trial, job.stop, loss))[0].action
    return last


def test_median_rule_stops_a_trial_worse_than_the_median_of_running_means():
    # Three good trials run first; the fourth is worse than their running means.
    losses = {0: [0.5, 0.4, 0.3], 1: [0.6, 0.5, 0.4], 2: [0.55, 0.45, 0.35], 3: [0.9, 0.1, 0.1]}
    rule = MedianStopping(1, 3, min_samples_required=3, max_trials=4)
    assert _run_to(rule, losses) == {
        0: Action.COMPLETE,
        1: Action.COMPLETE,
        2: Action.COMPLETE,
        3: Action.STOP,
    }


def test_median_rule_waits_for_grace_period_and_enough_samples():
    losses = {t: [0.1 * (t + 1)] * 4 for t in range(4)}
    # grace 3: the worst trial survives ends 1 and 2 and is stopped at 3.
    rule = MedianStopping(1, 4, grace_period=3, min_samples_required=3, max_trials=4)
    seen = []
    while (job := rule.next_segment()) is not None:
        action = rule.on_result(Result(job.trial, job.stop, losses[job.trial][job.rung]))[0]
        seen.append((job.trial, job.stop, action.action))
    assert (3, 2, Action.PROMOTE) in seen
    assert (3, 3, Action.STOP) in seen
    # With too few other trials no one is ever stopped.
    lenient = MedianStopping(1, 4, min_samples_required=4, max_trials=4)
    assert set(_run_to(lenient, losses).values()) == {Action.COMPLETE}


def test_median_rule_uses_the_history_inside_a_segment():
    # Segments of 2: the mean over the reports at 1 and 2 decides, not only the last one.
    rule = MedianStopping(2, 4, grace_period=1, min_samples_required=1, max_trials=2)
    a, b = rule.next_segment(), rule.next_segment()
    rule.on_result(Result(a.trial, 2, 0.5, history=((1, 0.5),)))
    # b's best (0.45) beats a's running mean (0.5) though its history was bad.
    decision = rule.on_result(Result(b.trial, 2, 0.45, history=((1, 0.9),)))
    assert decision[0].action is Action.PROMOTE
    c = MedianStopping(2, 4, grace_period=1, min_samples_required=1, max_trials=2)
    a, b = c.next_segment(), c.next_segment()
    c.on_result(Result(a.trial, 2, 0.5, history=((1, 0.1),)))  # running mean 0.3
    assert c.on_result(Result(b.trial, 2, 0.45, history=((1, 0.9),)))[0].action is Action.STOP


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"interval": 0}, "interval must lie in"),
        ({"interval": 10}, "interval must lie in"),
        ({"min_samples_required": 0}, "min_samples_required must be >= 1"),
        ({"grace_period": -1}, "grace_period must be >= 0"),
    ],
)
def test_median_rejects_bad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MedianStopping(1, 9, **kwargs)


# --- PBT ----------------------------------------------------------------------------------


def _pbt(**kwargs) -> Pbt:
    options = {"max_resource": 12, "perturbation_interval": 3, "population_size": 4, "seed": 0}
    return Pbt(SPACE, **{**options, **kwargs})


def test_pbt_population_starts_with_its_own_configs_inside_the_space():
    pbt = _pbt()
    jobs = [pbt.next_segment() for _ in range(5)]
    assert jobs[4] is None
    assert [(j.trial, j.start, j.stop) for j in jobs[:4]] == [(t, 0, 3) for t in range(4)]
    for job in jobs[:4]:
        assert job.config == pbt.configs[job.trial]
        assert all(SPACE[k]._contains(SPACE[k].to_internal_repr(v)) for k, v in job.config.items())


def test_pbt_bottom_member_exploits_a_top_member_and_explores_its_config():
    pbt = _pbt(population_size=8)
    jobs = {job.trial: job for job in (pbt.next_segment() for _ in range(8))}
    # Worst first: each arrival is the best so far, so nobody exploits in the first round.
    for trial in reversed(range(8)):
        pbt.on_result(Result(trial, 3, loss=trial / 10))
    assert [(j.trial, j.start, j.clone_from) for j in (pbt.next_segment() for _ in range(8))] == [
        (t, 3, None) for t in reversed(range(8))
    ]
    # Trial 7 is in the bottom ceil(8 * 0.25) = 2: it copies a top-2 member's checkpoint,
    # which is still at resource 3, and explores that member's configuration.
    pbt.on_result(Result(7, 6, loss=0.75))
    job = pbt.next_segment()
    assert (job.trial, job.start, job.stop) == (7, 3, 6)
    assert job.clone_from in (0, 1)
    assert job.config == pbt.configs[7] != jobs[job.clone_from].config
    assert set(job.config) == set(SPACE)
    # A middling member just continues with its own configuration.
    pbt.on_result(Result(3, 6, loss=0.3))
    job = pbt.next_segment()
    assert (job.trial, job.start, job.stop, job.clone_from, job.config) == (3, 6, 9, None, None)


def test_pbt_members_complete_at_max_resource_and_failed_are_no_donors():
    pbt = _pbt(population_size=2, max_resource=3)
    a, b = pbt.next_segment(), pbt.next_segment()
    assert pbt.on_result(Result(a.trial, 3, 0.1))[0].action is Action.COMPLETE
    assert pbt.on_result(Result(b.trial, 3, 0.2, failed=True))[0].action is Action.FAIL
    assert pbt.next_segment() is None


def test_pbt_equal_seeds_give_equal_populations():
    first = [(j.trial, j.config) for j in (_pbt(seed=5).next_segment() for _ in range(4))]
    again = [(j.trial, j.config) for j in (_pbt(seed=5).next_segment() for _ in range(4))]
    other = [(j.trial, j.config) for j in (_pbt(seed=6).next_segment() for _ in range(4))]
    assert first == again != other


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"population_size": 1}, "population_size must be >= 2"),
        ({"quantile_fraction": 0.6}, "quantile_fraction must lie in"),
        ({"quantile_fraction": 0}, "quantile_fraction must lie in"),
        ({"resample_probability": 1.5}, "resample_probability must lie in"),
        ({"perturbation_interval": 20}, "perturbation_interval must lie in"),
    ],
)
def test_pbt_rejects_bad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _pbt(**kwargs)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 10**6), st.floats(0, 1))
def test_explore_stays_inside_the_space(seed, probability):
    rng = np.random.default_rng(seed)
    config = {name: draw(dist, rng) for name, dist in SPACE.items()}
    for _ in range(5):
        config = explore(config, SPACE, rng, probability)
        for name, value in config.items():
            assert SPACE[name]._contains(SPACE[name].to_internal_repr(value))
    assert isinstance(config["width"], int)


def test_perturb_scales_numbers_and_moves_choices_to_a_neighbour():
    rng = np.random.default_rng(0)
    values = {perturb(SPACE["lr"], 0.01, rng) for _ in range(50)}
    assert sorted(values) == pytest.approx([0.008, 0.012])
    assert {perturb(SPACE["opt"], "sgd", rng) for _ in range(20)} == {"adam"}
    assert {perturb(SPACE["opt"], "adam", rng) for _ in range(50)} == {"sgd", "lamb"}
    assert perturb(SPACE["lr"], 0.1, np.random.default_rng(1)) <= 0.1  # clipped at the bound
    assert {perturb(IntDistribution(1, 5), 1, rng) for _ in range(30)} == {1, 2}


# --- Optuna pruners as stopping-type schedulers --------------------------------------------


def test_pruner_adapter_stops_what_optunas_sha_pruner_prunes():
    pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)
    sha = PrunerScheduler(pruner, 9, max_trials=4)
    assert sha.levels == list(range(1, 10))
    jobs = [sha.next_segment() for _ in range(4)]
    actions = [sha.on_result(Result(j.trial, 1, loss))[0].action for j, loss in
               zip(jobs, [0.5, 0.4, 0.6, 0.1], strict=False)]  # fmt: skip
    # Stopping-type: the first arrival continues, later ones must beat the rung's top 1/3.
    assert actions == [Action.PROMOTE, Action.PROMOTE, Action.STOP, Action.PROMOTE]
    assert sha.next_segment().trial == 0  # continuing trials go first
    assert sha.next_segment() is not None and sha.next_segment() is not None
    assert sha.next_segment() is None  # max_trials reached, nobody waiting


def test_pruner_adapter_checking_only_at_rungs_matches_every_epoch():
    def run(steps):
        pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)
        sched = PrunerScheduler(pruner, 9, steps=steps, max_trials=30)
        rng = np.random.default_rng(0)
        quality = rng.random(30)
        outcome = {}
        while (job := sched.next_segment()) is not None:
            loss = lambda r, q=quality[job.trial]: q / r  # noqa: E731
            history = tuple((r, loss(r)) for r in range(int(job.start) + 1, int(job.stop)))
            result = Result(job.trial, job.stop, loss(job.stop), history=history)
            for d in sched.on_result(result):
                outcome[d.trial] = (d.action, job.stop)
        return outcome

    every_epoch = run(None)
    assert run([1, 3, 9]) == every_epoch
    assert {action for action, _ in every_epoch.values()} == {Action.STOP, Action.COMPLETE}


# --- Repeat --------------------------------------------------------------------------------


def test_repeat_starts_a_new_copy_when_workers_would_idle():
    sha = Repeat(lambda: SuccessiveHalving(sha_bracket(3, 1, 3, 3)), 3, max_trials=6)
    first = [sha.next_segment() for _ in range(3)]
    second = [sha.next_segment() for _ in range(3)]
    assert sha.next_segment() is None  # a third copy would pass max_trials
    assert [j.trial for j in first + second] == list(range(6))
    for job, loss in zip(first, [0.3, 0.1, 0.2], strict=False):
        decisions = sha.on_result(Result(job.trial, 1, loss))
    assert {d.trial: d.action for d in decisions} == {
        0: Action.STOP,
        1: Action.PROMOTE,
        2: Action.STOP,
    }
    promoted = sha.next_segment()  # the older copy goes first
    assert (promoted.trial, promoted.start, promoted.stop) == (1, 1, 3)


def test_repeat_rejects_a_copy_larger_than_max_trials():
    with pytest.raises(ValueError, match="max_trials"):
        Repeat(lambda: Hyperband(1, 9, 3), 17, max_trials=10)


# --- the job file -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scheduler", "kind"),
    [
        ({"name": "random", "max_resource": 9}, Fifo),
        ({"name": "fifo"}, Fifo),
        ({"name": "asha"}, Asha),
        ({"name": "median", "interval": 3}, MedianStopping),
        ({"name": "pbt", "population_size": 4}, Pbt),
    ],
)
def test_make_scheduler_builds_every_kind(scheduler, kind):
    assert isinstance(make_scheduler(parse_job({**JOB, "scheduler": scheduler}), 0), kind)


@pytest.mark.parametrize(
    ("scheduler", "field"),
    [
        ({"name": "pbt", "population_size": 1}, "scheduler.population_size"),
        ({"name": "pbt", "quantile_fraction": 0.75}, "scheduler.quantile_fraction"),
        ({"name": "pbt", "perturbation_interval": 99}, "scheduler.perturbation_interval"),
        ({"name": "median", "interval": 99}, "scheduler.interval"),
        ({"name": "median", "min_resource": 30}, "scheduler.max_resource"),
        ({"name": "median", "min_samples_required": 0}, "scheduler.min_samples_required"),
        ({"name": "random", "max_trials": 0}, "scheduler.max_trials"),
        ({"name": "bohb"}, "scheduler"),
    ],
)
def test_bad_scheduler_options_name_the_field(scheduler, field):
    with pytest.raises(SpecError, match=field):
        parse_job({**JOB, "scheduler": scheduler})
