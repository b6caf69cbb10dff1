import optuna
import pytest
from optuna.trial import TrialState

from planners.loop import TuningLoop
from planners.schedulers.base import Result
from planners.spec import parse_job

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
