"""A driver killed between asking Optuna for a trial and tagging it with its trial id.

``TuningLoop._open`` asks the study for a trial, then sets its ``elastune.trial``
attribute: two writes. ``benchmarks/chaos.py`` once killed a driver between them; the
study then holds a RUNNING trial that no trial id claims. This builds that state with the
same two calls (the first one made, the second not) and resumes from the journal.
"""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from elastune.planners.search import Result, StudyJournal, TuningLoop
from elastune.planners.spec import distributions, parse_job

JOB = {
    "name": "t",
    "trainable": "tests.trainables:quadratic",
    "metric": "acc",
    "space": {"x": {"type": "float", "low": 0, "high": 1}},
    "sampler": {"name": "tpe", "seed": 3},
    "scheduler": {"name": "sha", "min_resource": 1, "max_resource": 9},
}


def finish(loop: TuningLoop, results: int | None = None) -> None:
    """Feed results until the scheduler is done (or ``results`` were recorded)."""
    while results != 0 and (job := loop.next_segment()) is not None:
        x = loop.configs[job.trial]["x"]
        loop.record(Result(job.trial, job.stop, -x * job.stop))
        results = None if results is None else results - 1
    if results is None:
        loop.finish()


def board(study: optuna.Study) -> list:
    ordered = sorted(study.trials, key=lambda t: t.user_attrs.get("elastune.trial", -1))
    return [(t.user_attrs.get("elastune.trial"), t.params, t.state) for t in ordered]


def test_a_trial_asked_but_not_tagged_is_adopted_on_resume() -> None:
    spec = parse_job(JOB)
    clean = optuna.create_study(direction="maximize")
    finish(TuningLoop(spec, clean))

    study = optuna.create_study(direction="maximize")
    finish(TuningLoop(spec, study, journal=StudyJournal(study)), results=4)
    study.ask(distributions(spec))  # the next trial's ask landed; its tag did not
    resumed = TuningLoop(spec, study, journal=StudyJournal(study))
    for _ in resumed.replay(StudyJournal(study).records()):
        pass
    finish(resumed)

    assert [t.state for t in study.trials].count(TrialState.RUNNING) == 0
    assert board(study) == board(clean)
