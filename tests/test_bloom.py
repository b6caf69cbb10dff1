"""Bloom (the default scheduler) and stopping-type ASHA: ladders, ranking, revival, stops."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.baselines import StoppingAsha
from elastune.planners.search import Action, Result
from elastune.planners.search.schedulers import Asha, Bloom


def drive(scheduler, loss, workers: int = 1, limit: int = 10_000) -> list[tuple[int, float]]:
    """Run to the end with ``workers`` parallel slots, results in submission order;
    returns (trial, stop) of every segment."""
    order, running = [], []
    for _ in range(limit):
        while len(running) < workers and (job := scheduler.next_segment()) is not None:
            order.append((job.trial, job.stop))
            running.append(job)
        if not running:
            return order
        job = running.pop(0)
        scheduler.on_result(Result(job.trial, job.stop, loss(job.trial, job.stop)))
    raise AssertionError("did not end")


def test_the_first_cut_sits_at_max_resource_over_eta_squared() -> None:
    assert Bloom(1, 52, 3).brackets[0].levels == [6, 17, 52]
    assert Bloom(1, 27, 3).brackets[0].levels == [3, 9, 27]
    assert Bloom(1, 27, 3, promotions=3).brackets[0].levels == [1, 3, 9, 27]
    assert Bloom(9, 27, 3).brackets[0].levels == [9, 27]  # not below min_resource
    assert Bloom(1, 27, 3, promotions=0).brackets[0].levels == [27]  # random search
    two = Bloom(1, 52, 3, brackets=2)
    assert [b.levels for b in two.brackets] == [[6, 17, 52], [17, 52]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"eta": 1}, "eta must be >= 2, got 1"),
        ({"min_resource": 0}, "need 0 < min_resource"),
        ({"max_trials": 0}, "max_trials must be >= 1 or None, got 0"),
        ({"promotions": -1}, "promotions must be >= 0, got -1"),
        ({"brackets": 4}, "brackets must lie in 1..3"),
        ({"slope_weight": -0.5}, "slope_weight must be a finite number >= 0, got -0.5"),
        ({"slope_weight": math.nan}, "slope_weight must be a finite number >= 0, got nan"),
    ],
)
def test_bad_arguments_are_named(kwargs, message) -> None:
    args = {"min_resource": 1, "max_resource": 27, **kwargs}
    with pytest.raises(ValueError, match=message):
        Bloom(**args)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 6))
def test_without_slope_or_revival_it_is_asha_with_a_late_first_cut(seed, workers) -> None:
    rng = random.Random(seed)
    base = {t: rng.random() for t in range(40)}

    def loss(trial: int, stop: float) -> float:
        return base[trial] / stop

    bloom = Bloom(1, 27, 3, max_trials=40, slope_weight=0, revive=False)
    asha = Asha(3, 27, 3, max_trials=40)  # rungs 3, 9, 27
    assert drive(bloom, loss, workers) == drive(asha, loss, workers)


def test_the_slope_promotes_a_late_bloomer_over_a_flat_curve() -> None:
    def curve(trial: int, r: int) -> float:
        # trial 0 flattened at 0.30; trial 1 is at 0.33 but falling fast; trial 2 is poor.
        return {0: 0.30, 1: 0.33 + 0.2 * (3 - r) / 3, 2: 0.6}[trial]

    for weight, first in ((0.25, 1), (0.0, 0)):
        bloom = Bloom(1, 27, 3, max_trials=3, slope_weight=weight)
        for job in [bloom.next_segment() for _ in range(3)]:
            history = tuple((e, curve(job.trial, e)) for e in range(1, 3))
            bloom.on_result(Result(job.trial, job.stop, curve(job.trial, 3), history=history))
        assert bloom.next_segment().trial == first


def test_idle_workers_revive_the_best_paused_trial_while_regular_work_runs() -> None:
    bloom = Bloom(1, 9, 3, max_trials=3, promotions=1)  # rungs 3 and 9
    jobs = [bloom.next_segment() for _ in range(3)]
    assert bloom.next_segment() is None  # no results yet: nothing to promote or revive
    bloom.on_result(Result(0, 3, 0.2))
    bloom.on_result(Result(1, 3, 0.5))
    # One result in the top third (floor(2/3) = 0): no regular promotion; trial 2 still
    # runs, so an idle worker revives the best paused trial.
    revived = bloom.next_segment()
    assert (revived.trial, revived.start, revived.stop) == (0, 3, 9)
    assert bloom.next_segment().trial == 1  # the next best, while trial 2 still runs
    assert bloom.next_segment() is None  # nothing paused any more
    assert jobs[2].trial == 2
    assert bloom.on_result(Result(2, 3, 0.4))[0].action is Action.PAUSE
    # Rung 3 now holds 3 results: its top third is trial 0, already promoted; only
    # revivals run, so trial 2 is not revived and the job can end with it paused.
    assert bloom.next_segment() is None
    assert bloom.on_result(Result(0, 9, 0.1))[0].action is Action.COMPLETE
    assert bloom.on_result(Result(1, 9, 0.3))[0].action is Action.COMPLETE
    assert bloom.next_segment() is None
    assert {d.trial: d.action for d in bloom.finish()} == {2: Action.STOP}


def test_without_revival_the_idle_worker_waits() -> None:
    bloom = Bloom(1, 9, 3, max_trials=3, promotions=1, revive=False)
    for _ in range(3):
        bloom.next_segment()
    bloom.on_result(Result(0, 3, 0.2))
    assert bloom.next_segment() is None


def test_while_new_trials_may_start_an_idle_worker_starts_one_instead_of_reviving() -> None:
    # max_trials None (the LCBench benchmark's setting): revival never acts.
    bloom = Bloom(1, 9, 3, max_trials=None, promotions=1)  # rungs 3 and 9
    for _ in range(3):
        bloom.next_segment()
    bloom.on_result(Result(0, 3, 0.2))
    bloom.on_result(Result(1, 3, 0.5))
    job = bloom.next_segment()
    assert (job.trial, job.start, job.stop) == (3, 0, 3)


def test_the_slope_at_a_higher_rung_reads_the_previous_rungs_value() -> None:
    bloom = Bloom(1, 27, 3, max_trials=3, slope_weight=1.0)  # rungs 3, 9, 27
    for job in [bloom.next_segment() for _ in range(3)]:
        bloom.on_result(Result(job.trial, 3, 0.5 + job.trial / 10))
    job = bloom.next_segment()  # trial 0 to rung 9; its segment reports epochs 4..8
    history = tuple((e, 0.5) for e in range(4, 9))
    bloom.on_result(Result(job.trial, 9, 0.2, history=history))
    # Half of 9 is 4.5: the slope runs from the last report at or below it (epoch 4).
    expected = 0.2 + (0.2 - 0.5) / math.log(9 / 4) * math.log(27 / 9)
    assert bloom.brackets[0].rungs[1].keys[job.trial][1] == pytest.approx(expected)


def test_a_failed_segment_fails_its_trial_and_never_enters_a_rung() -> None:
    bloom = Bloom(1, 9, 3, max_trials=4, promotions=1)
    jobs = [bloom.next_segment() for _ in range(4)]
    assert bloom.on_result(Result(jobs[0].trial, 3, math.nan, failed=True))[0].action is Action.FAIL
    for job, value in zip(jobs[1:], (0.3, 0.2, 0.4), strict=True):
        bloom.on_result(Result(job.trial, 3, value))
    assert bloom.next_segment().trial == jobs[2].trial  # the best of the three that finished


def test_every_trial_ends_complete_or_stopped() -> None:
    rng = random.Random(4)
    base = {t: rng.random() for t in range(30)}
    bloom = Bloom(1, 27, 3, max_trials=30, brackets=2, seed=1)
    order = drive(bloom, lambda t, r: base[t] + 1 / r, workers=4)
    ended = {d.trial for d in bloom.finish()}
    complete = {t for t, stop in order if stop == 27}
    assert complete and ended | complete == set(range(30)) and not ended & complete


# --- stopping-type ASHA (the Ray / Syne Tune baseline) ------------------------------------


def test_stopping_asha_rungs_are_anchored_at_the_bottom() -> None:
    assert StoppingAsha(1, 52, 3).levels == [1, 3, 9, 27, 52]
    assert StoppingAsha(1, 27, 3).levels == [1, 3, 9, 27]


def test_stopping_asha_keeps_the_top_third_of_what_came_before() -> None:
    asha = StoppingAsha(1, 9, 3)
    losses = [0.5, 0.4, 0.45, 0.9, 0.1]
    jobs = [asha.next_segment() for _ in losses]
    actions = [
        asha.on_result(Result(j.trial, j.stop, loss))[0].action
        for j, loss in zip(jobs, losses, strict=True)
    ]
    # 0.5 first: continues. 0.4 <= 0.5. 0.45 > percentile 33 of (0.5, 0.4) = 0.433.
    # 0.9 > everything. 0.1 beats everything.
    assert actions == [Action.PROMOTE, Action.PROMOTE, Action.STOP, Action.STOP, Action.PROMOTE]
    # Survivors continue before new trials, in the order they were kept.
    assert [asha.next_segment().trial for _ in range(3)] == [0, 1, 4]


def test_stopping_asha_completes_at_max_resource_and_stops_nan() -> None:
    asha = StoppingAsha(1, 3, 3, max_trials=2)
    a, b = asha.next_segment(), asha.next_segment()
    assert asha.next_segment() is None
    asha.on_result(Result(a.trial, 1, 0.5))
    assert asha.on_result(Result(b.trial, 1, math.inf))[0].action is Action.STOP
    job = asha.next_segment()
    assert (job.start, job.stop) == (1, 3)
    assert asha.on_result(Result(job.trial, 3, 0.2))[0].action is Action.COMPLETE


def test_stopping_asha_names_bad_arguments() -> None:
    with pytest.raises(ValueError, match="eta must be >= 2, got 1"):
        StoppingAsha(1, 9, 1)
    with pytest.raises(ValueError, match="max_trials must be >= 1 or None, got 0"):
        StoppingAsha(1, 9, 3, max_trials=0)


def test_the_docstring_examples_run() -> None:
    import doctest

    import benchmarks.baselines.stopping_asha
    import elastune.planners.samplers.mftpe
    import elastune.planners.search.schedulers.bloom

    bloom, stopping_asha = (
        elastune.planners.search.schedulers.bloom,
        benchmarks.baselines.stopping_asha,
    )
    for module in (bloom, stopping_asha, elastune.planners.samplers.mftpe):
        assert doctest.testmod(module).failed == 0
