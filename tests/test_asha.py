"""ASHA (docs/algorithms.md §3): the worked trace, the promotion rule against a plain reading of
§3.1, its quota, brackets, failures and determinism."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastune.planners.search import Action, Result, make_scheduler
from elastune.planners.search.schedulers import Asha
from elastune.planners.search.schedulers.base import ranked
from elastune.planners.spec import SpecError, parse_job
from elastune.planners.spec.geometry import rung_levels

JOB = {
    "name": "t",
    "trainable": "m:f",
    "metric": "acc",
    "space": {"x": {"type": "float", "low": 0, "high": 1}},
}

# §3.3: c1..c9 arrive with these rung-0 losses; each rung higher lowers a loss by .02.
TRACE_LOSSES = [0.50, 0.40, 0.60, 0.30, 0.55, 0.45, 0.35, 0.70, 0.20]
TRACE = [  # (configuration, from, to) for steps 1..15 of the table in §3.3
    ("c1", 0, 1), ("c2", 0, 1), ("c3", 0, 1),
    ("c2", 1, 3),
    ("c4", 0, 1), ("c4", 1, 3),
    ("c5", 0, 1), ("c6", 0, 1), ("c7", 0, 1),
    ("c7", 1, 3),
    ("c4", 3, 9),
    ("c8", 0, 1), ("c9", 0, 1),
    ("c9", 1, 3), ("c9", 3, 9),
]  # fmt: skip


def test_worked_trace_of_section_3_3():
    asha = Asha(1, 9, 3)
    steps, actions = [], {}
    for _ in TRACE:
        job = asha.next_segment()
        steps.append((f"c{job.trial + 1}", job.start, job.stop))
        loss = TRACE_LOSSES[job.trial] - 0.02 * job.rung
        for decision in asha.on_result(Result(job.trial, job.stop, loss)):
            actions[decision.trial] = decision.action
    assert steps == TRACE
    # c4 and c9 reached R = 9; c1 (first arrival, .50) never moved past rung 0.
    assert {t for t, a in actions.items() if a is Action.COMPLETE} == {3, 8}
    assert all(stop == 1 for c, _, stop in steps if c == "c1")
    # The job ends: every trial still waiting at a rung is stopped.
    finished = {d.trial: d.action for d in asha.finish()}
    assert finished == {t: Action.STOP for t, a in actions.items() if a is Action.PAUSE}


class NaiveAsha:
    """§3.1 read literally: sort each rung on every call."""

    def __init__(self, levels: list[float], eta: int):
        self.levels, self.eta = levels, eta
        self.results: list[dict[int, float]] = [{} for _ in levels[:-1]]
        self.promoted: list[set[int]] = [set() for _ in levels[:-1]]
        self.rung: dict[int, int] = {}
        self.next_id = 0

    def next_segment(self) -> tuple[int, float, float]:
        for k in range(len(self.levels) - 2, -1, -1):
            done = ranked(self.results[k])
            for trial in done[: len(done) // self.eta]:
                if trial not in self.promoted[k]:
                    self.promoted[k].add(trial)
                    self.rung[trial] = k + 1
                    return trial, self.levels[k], self.levels[k + 1]
        trial, self.next_id = self.next_id, self.next_id + 1
        self.rung[trial] = 0
        return trial, 0, self.levels[0]

    def on_result(self, trial: int, loss: float, failed: bool) -> None:
        k = self.rung[trial]
        if not failed and k < len(self.levels) - 1:
            self.results[k][trial] = loss


LOSSES = st.sampled_from([0.1, 0.2, 0.2, 0.3, 0.5, 0.5, 0.9, math.inf, math.nan])
EVENTS = st.lists(
    st.tuples(st.booleans(), st.integers(0, 10**6), LOSSES, st.integers(0, 19)),
    min_size=1,
    max_size=150,
)


def _drive(asha: Asha, events, reference: NaiveAsha | None = None) -> list[tuple]:
    """Start jobs (True) or deliver a random running job's result (False); a result whose
    last draw is 0 fails. Returns every job handed out."""
    running, jobs = [], []
    for start, pick, loss, fail in events:
        if start or not running:
            job = asha.next_segment()
            if job is None:
                continue
            jobs.append(job)
            running.append(job)
            if reference is not None:
                assert (job.trial, job.start, job.stop) == reference.next_segment()
        else:
            job = running.pop(pick % len(running))
            failed = fail == 0
            asha.on_result(Result(job.trial, job.stop, loss, failed=failed))
            if reference is not None:
                reference.on_result(job.trial, loss, failed)
    return jobs


@settings(max_examples=150, deadline=None)
@given(EVENTS, st.sampled_from([(1, 9, 3), (1, 27, 3), (1, 16, 2), (2, 52, 3), (1, 64, 4)]))
def test_promotions_match_a_literal_reading_of_section_3_1(events, ladder):
    low, high, eta = ladder
    asha = Asha(low, high, eta)
    _drive(asha, events, NaiveAsha(rung_levels(low, high, eta), eta))


@settings(max_examples=150, deadline=None)
@given(EVENTS, st.integers(1, 4), st.integers(0, 4), st.integers(0, 3))
def test_promotions_come_from_the_top_floor_n_over_eta_of_a_rung(events, brackets, boot, seed):
    eta = 3
    asha = Asha(1, 27, eta, brackets=brackets, bootstrap_count=boot, seed=seed)
    rungs: dict[tuple[int, int], dict[int, float]] = {}  # (bracket, rung) -> results so far
    promoted: dict[tuple[int, int], set[int]] = {}
    running = []
    for start, pick, loss, fail in events:
        if start or not running:
            job = asha.next_segment()
            if job is None:
                continue
            running.append(job)
            if job.rung > 0:
                key = (job.bracket, job.rung - 1)
                results = rungs.get(key, {})
                top = ranked(results)[: len(results) // eta]
                assert job.trial in top and len(results) >= boot
                promoted.setdefault(key, set()).add(job.trial)
                # The quota: promoted trials still in the top set never exceed floor(n/eta).
                assert len(promoted[key] & set(top)) <= len(results) // eta
        else:
            job = running.pop(pick % len(running))
            decisions = asha.on_result(Result(job.trial, job.stop, loss, failed=fail == 0))
            if decisions[0].action is Action.PAUSE:
                rungs.setdefault((job.bracket, job.rung), {})[job.trial] = loss


def test_the_worked_trace_promotes_more_than_floor_n_over_eta_in_total():
    """§3.1's rule counts the current top set, not past promotions: after step 6 of §3.3,
    rung 0 holds 4 results and has promoted 2 (c2, then c4 that overtook it), above
    floor(4/3) = 1. A cap on total promotions would contradict the worked example."""
    asha = Asha(1, 9, 3)
    promoted, results = 0, 0
    for _ in range(6):
        job = asha.next_segment()
        promoted += job.rung == 1
        results += job.rung == 0
        asha.on_result(Result(job.trial, job.stop, TRACE_LOSSES[job.trial] - 0.02 * job.rung))
    assert (results, promoted) == (4, 2)


@settings(max_examples=50, deadline=None)
@given(EVENTS, st.integers(0, 1000))
def test_equal_seeds_give_equal_runs(events, seed):
    first = _drive(Asha(1, 81, 3, brackets=5, seed=seed), events)
    again = _drive(Asha(1, 81, 3, brackets=5, seed=seed), events)
    assert first == again


def test_failed_trial_is_never_promoted():
    asha = Asha(1, 9, 3)
    jobs = [asha.next_segment() for _ in range(3)]
    decision = asha.on_result(Result(jobs[0].trial, 1, 0.0, failed=True))
    assert decision[0].action is Action.FAIL
    for job in jobs[1:]:
        asha.on_result(Result(job.trial, 1, 0.5))
    more = [asha.next_segment() for _ in range(2)]
    asha.on_result(Result(more[0].trial, 1, 0.4))
    promoted = asha.next_segment()  # rung 0 now holds 3 results: the best, trial 3, goes up
    assert (promoted.trial, promoted.rung) == (more[0].trial, 1)
    assert jobs[0].trial not in {d.trial for d in asha.finish()}


def test_top_rung_completes_and_max_trials_stops_new_trials():
    asha = Asha(1, 3, 3, max_trials=3)
    jobs = [asha.next_segment() for _ in range(3)]
    assert asha.next_segment() is None
    for job, loss in zip(jobs, [0.3, 0.1, 0.2], strict=False):
        assert asha.on_result(Result(job.trial, 1, loss))[0].action is Action.PAUSE
    top = asha.next_segment()
    assert (top.trial, top.start, top.stop) == (jobs[1].trial, 1, 3)
    assert asha.on_result(Result(top.trial, 3, 0.05))[0].action is Action.COMPLETE
    assert asha.next_segment() is None


def test_brackets_follow_optuna_weights_and_their_own_rungs():
    asha = Asha(1, 81, 3, brackets=5, seed=0)
    jobs = [asha.next_segment() for _ in range(4000)]
    share = Counter(job.bracket for job in jobs)
    # Optuna's HyperbandPruner weights 81, 34, 15, 8, 5 out of 143 (§3.4).
    for s, weight in enumerate([81, 34, 15, 8, 5]):
        assert share[s] / len(jobs) == pytest.approx(weight / 143, abs=0.02)
    assert {job.bracket: job.stop for job in jobs} == {0: 1, 1: 3, 2: 9, 3: 27, 4: 81}
    # The s = 4 bracket has one rung: its trials train straight to R and complete.
    last = next(job for job in jobs if job.bracket == 4)
    assert asha.on_result(Result(last.trial, 81, 0.1))[0].action is Action.COMPLETE


def test_promotion_to_the_highest_resource_goes_first_across_brackets():
    asha = Asha(1, 9, 3, brackets=2, seed=3)
    by_bracket: dict[int, list] = {0: [], 1: []}
    while min(len(v) for v in by_bracket.values()) < 3:
        job = asha.next_segment()
        by_bracket[job.bracket].append(job)
    for bracket in by_bracket.values():
        for job in bracket:
            asha.on_result(Result(job.trial, job.stop, 0.1 * job.trial))
    first = asha.next_segment()
    assert (first.bracket, first.start, first.stop) == (1, 3, 9)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"eta": 1}, "eta must be >= 2"),
        ({"brackets": 4}, "brackets must lie in 1..3"),
        ({"brackets": 0}, "brackets must lie in 1..3"),
        ({"max_trials": 0}, "max_trials must be >= 1"),
        ({"bootstrap_count": -1}, "bootstrap_count must be >= 0"),
    ],
)
def test_constructor_rejects_bad_options(kwargs, message):
    options = {"eta": 3, **kwargs}
    with pytest.raises(ValueError, match=message):
        Asha(1, 9, **options)


@pytest.mark.parametrize(
    ("scheduler", "field"),
    [
        ({"name": "asha", "eta": 1}, "scheduler.eta"),
        ({"name": "asha", "max_resource": 27, "brackets": 5}, "scheduler.brackets"),
        ({"name": "asha", "min_resource": 9, "max_resource": 3}, "scheduler.max_resource"),
        ({"name": "asha", "min_resource": 30}, "scheduler.max_resource: .* below min_resource"),
    ],
)
def test_job_file_errors_name_the_field(scheduler, field):
    with pytest.raises(SpecError, match=field):
        parse_job({**JOB, "scheduler": scheduler})


def test_make_scheduler_builds_asha_from_the_job_file():
    spec = parse_job({**JOB, "scheduler": {"name": "asha", "max_resource": 27, "brackets": 2}})
    asha = make_scheduler(spec, seed=1)
    assert isinstance(asha, Asha)
    assert [b.levels for b in asha.brackets] == [[1, 3, 9, 27], [3, 9, 27]]
