from dataclasses import asdict

import optuna
import pytest
from optuna.trial import TrialState

from elastune.planners.search import Result, StudyJournal, TuningLoop
from elastune.planners.spec import parse_job

JOB = {
    "name": "t",
    "trainable": "tests.trainables:quadratic",
    "metric": "acc",
    "space": {"x": {"type": "float", "low": 0, "high": 1}},
    "sampler": {"name": "random", "seed": 3},
    "scheduler": {"name": "sha", "min_resource": 1, "max_resource": 9},
}


def run(loop: TuningLoop, fail: set[int] = frozenset()) -> None:
    while (job := loop.next_segment()) is not None:
        x = loop.configs[job.trial]["x"]
        history = tuple((r, -x * r) for r in range(int(job.start) + 1, int(job.stop)))
        loop.record(Result(job.trial, job.stop, -x * job.stop, job.trial in fail, history))
    loop.finish()


def test_optuna_is_told_complete_pruned_and_fail_with_resource_steps() -> None:
    spec = parse_job(JOB)
    study = optuna.create_study(direction="maximize")
    loop = TuningLoop(spec, study)
    run(loop, fail={4})
    states = [t.state for t in study.trials]
    assert states.count(TrialState.COMPLETE) == 1
    assert states.count(TrialState.FAIL) == 1
    assert states.count(TrialState.PRUNED) == 7
    best = loop.best()
    winner = study.trials[best.trial]
    assert winner.state is TrialState.COMPLETE
    assert sorted(winner.intermediate_values) == list(range(1, 10))  # step = resource
    assert winner.value == pytest.approx(best.metric)
    assert best.resource == 9


def test_equal_seeds_give_equal_runs() -> None:
    spec = parse_job(JOB)
    picks = []
    for _ in range(2):
        loop = TuningLoop(
            spec,
            optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(7)),
        )
        run(loop)
        picks.append((loop.best(), loop.configs))
    assert picks[0] == picks[1]


def test_direction_must_match_mode() -> None:
    with pytest.raises(ValueError, match="direction must be maximize"):
        TuningLoop(parse_job(JOB), optuna.create_study(direction="minimize"))


def test_segments_handed_out_after_the_last_result_are_in_flight_after_replay() -> None:
    spec = parse_job(JOB)
    study = optuna.create_study(direction="maximize")
    loop = TuningLoop(spec, study, journal=StudyJournal(study))
    first = loop.next_segment()
    loop.record(Result(first.trial, first.stop, -0.5 * first.stop))
    running = [loop.next_segment(), loop.next_segment()]  # the driver dies here

    journal = StudyJournal(study)
    events = [k for k in study.user_attrs if k.startswith(StudyJournal.PREFIX)]
    assert len(events) == 4  # one write per hand-out and per result
    assert [r["handed_out"] for r in journal.records()] == [[asdict(first)]]
    assert journal.handed_out() == [asdict(s) for s in running]

    resumed = TuningLoop(spec, study, journal=StudyJournal(study))
    replayed = list(resumed.replay(journal.records(), journal.handed_out()))
    assert len(replayed) == 1
    assert resumed.in_flight() == running
    assert resumed.configs == loop.configs
    assert len(study.trials) == 3  # nothing asked twice

    # The resumed loop appends after what is there, never over it.
    done = running[0]
    resumed.record(Result(done.trial, done.stop, -0.5 * done.stop))
    records = StudyJournal(study).records()
    assert [r["handed_out"] for r in records] == [[asdict(first)], [asdict(s) for s in running]]
    assert StudyJournal(study).handed_out() == []


@pytest.mark.parametrize("driver", ["lives", "dies"])
def test_decide_leaves_optuna_for_later_and_replay_writes_what_a_dead_driver_left(
    driver: str,
) -> None:
    """The driver starts the next segments between decide and tell_optuna; if it dies
    there, the journal holds the results and replay writes Optuna's part."""
    spec = parse_job({**JOB, "scheduler": {"name": "sha", "min_resource": 1, "max_resource": 3}})
    study = optuna.create_study(direction="maximize")
    loop = TuningLoop(spec, study, journal=StudyJournal(study))
    segments = []
    while (segment := loop.next_segment()) is not None:
        segments.append(segment)
    for s in segments:  # the barrier's last result promotes one trial and stops the others
        loop.decide(Result(s.trial, s.stop, -(s.trial + 1) / 4))
    assert all(not t.intermediate_values for t in study.trials)  # nothing written yet
    assert all(t.state is TrialState.RUNNING for t in study.trials)

    if driver == "lives":
        loop.tell_optuna()
    else:
        journal = StudyJournal(study)
        resumed = TuningLoop(spec, study, journal=StudyJournal(study))
        list(resumed.replay(journal.records(), journal.handed_out()))

    expected = [(TrialState.PRUNED, {1: (s.trial + 1) / 4}) for s in segments]
    expected[-1] = (TrialState.RUNNING, expected[-1][1])  # the best goes on to rung 3
    assert [(t.state, t.intermediate_values) for t in study.trials] == expected
