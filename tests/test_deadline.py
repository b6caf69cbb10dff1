"""A real run stops at ``budget.deadline``: nothing starts after it, the segments running stop
at their next step with what they trained kept, and the job ends with its best so far
(flows/drive.py, ``TrialContext.range``, ``TuningLoop.cut``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from elastune.flows.cli import _print_run, main
from elastune.flows.drive import recover
from elastune.flows.job import Job
from elastune.flows.prepare import prepare
from elastune.flows.stored_job import stored_job
from elastune.planners.search import TuningLoop
from elastune.planners.search.journal import StudyJournal
from elastune.planners.search.schedulers.base import Action, Result, Segment
from elastune.planners.spec import parse_job
from elastune.tasks.context import TrialContext
from elastune.tasks.contract import JobRef, SegmentReport, report_name
from elastune.tasks.tracking import Tracker
from elastune.tasks.train import run_segment
from tests.helpers.jobs import run_cli

JOB = {
    "name": "deadline",
    "trainable": "tests.trainables:logged_quadratic",  # 0.3 s an epoch
    "metric": "val_accuracy",
    "mode": "max",
    "space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    "sampler": {"name": "random", "seed": 0},
    # One segment of 40 epochs per trial: 12 s each, far past the deadline. The deadline
    # counts from the flow's start: 5 s leave a loaded CI run time to start both trials.
    "scheduler": {"name": "random", "max_resource": 40, "max_trials": 4},
    "compute": {"workers": 2},
    "budget": {"deadline": 5},
}


def context(deadline_at: float | None) -> TrialContext:
    return TrialContext(
        trial=0, start=0, stop=5, max_resource=5, run_id="", tracker=None, deadline_at=deadline_at
    )


def test_range_ends_at_its_first_step_past_the_deadline() -> None:
    assert list(context(None).range(0)) == [1, 2, 3, 4, 5]
    ahead = context(time.time() + 3600)
    assert list(ahead.range(0)) == [1, 2, 3, 4, 5] and not ahead.cut
    passed = context(time.time() - 1)
    assert list(passed.range(0)) == [] and passed.cut and passed.resource == 0
    ctx, trained = context(time.time() + 3600), []
    for epoch in ctx.range(0):
        trained.append(epoch)
        if epoch == 2:
            ctx.deadline_at = time.time() - 1  # the deadline passes during epoch 2
    assert trained == [1, 2] and ctx.cut and ctx.resource == 2


def loop_of(study: optuna.Study, journal: StudyJournal) -> TuningLoop:
    spec = parse_job({**JOB, "budget": {}})
    return TuningLoop(spec, study, journal=journal)


def test_a_cut_ranks_its_trial_where_it_got_to_and_the_end_stops_it() -> None:
    study = optuna.create_study(direction="maximize")
    loop = loop_of(study, StudyJournal(study))
    first, second = loop.next_segment(), loop.next_segment()
    history = ((1.0, -0.5), (2.0, -0.6))
    loop.cut(Result(first.trial, 2, -0.6, history=history), {"cut": True})
    # Ranked where its segment began, by its newest value.
    assert loop.reached[first.trial] == (0, -0.6) and first.trial not in loop.states
    # Cut before its first step: nothing reached.
    loop.cut(Result(second.trial, 0, float("inf"), failed=True), {"cut": True})
    assert second.trial not in loop.reached and loop.in_flight() == [] and loop.idle
    loop.tell_optuna()
    trials = study.get_trials(deepcopy=False)
    # Its values in Optuna; the trial open until the job's end, which stops it.
    assert [t.state for t in trials] == [TrialState.RUNNING, TrialState.RUNNING]
    assert trials[0].intermediate_values == {1: 0.5, 2: 0.6}
    assert loop.best().trial == first.trial and loop.best().metric == pytest.approx(0.6)
    ended = loop.finish()
    assert sorted((d.trial, d.action) for d in ended) == [
        (first.trial, Action.STOP),
        (second.trial, Action.STOP),
    ]
    assert [t.state for t in study.get_trials()] == [TrialState.PRUNED, TrialState.PRUNED]


def test_a_replay_runs_the_segments_a_deadline_cut_again() -> None:
    """A driver that died after recording cuts, before the job's end: its successor's
    deadline counts anew, so what the old one cut is in flight again, and a synchronous
    stage waiting on it completes once it has run (not stuck at a barrier for ever)."""
    spec = parse_job({**JOB, "budget": {}, "scheduler": {"name": "sha", "max_resource": 9}})
    study = optuna.create_study(direction="maximize")
    loop = TuningLoop(spec, study, journal=StudyJournal(study))
    rung0 = [loop.next_segment() for _ in range(9)]  # resource 0 -> 1
    for segment in rung0[:8]:
        loop.record(Result(segment.trial, 1, -segment.trial / 10))
    cut = rung0[8]
    loop.cut(Result(cut.trial, 0, float("inf"), failed=True), {"cut": True})
    loop.tell_optuna()
    assert loop.next_segment() is None  # the stage waits on the trial it never heard of

    again = TuningLoop(spec, study, journal=StudyJournal(study))
    decided = [result.trial for result, _, _ in again.replay(*again.journal.fold())]
    assert decided == [s.trial for s in rung0[:8]] and again.in_flight() == [cut]
    again.record(Result(cut.trial, 1, -0.95))
    top = [again.next_segment() for _ in range(3)]  # the stage done: its top third goes on
    assert [(s.trial, s.start, s.stop) for s in top] == [(8, 1, 3), (7, 1, 3), (6, 1, 3)]


def test_a_trial_cut_past_a_rung_ranks_at_that_rung_by_its_newest_value() -> None:
    spec = parse_job({**JOB, "budget": {}, "scheduler": {"name": "sha", "max_resource": 9}})
    loop = TuningLoop(spec, optuna.create_study(direction="maximize"))
    for segment in [loop.next_segment() for _ in range(9)]:  # rung 0: resource 1
        loop.record(Result(segment.trial, 1, segment.trial / 10))
    for segment in [loop.next_segment() for _ in range(3)]:  # trials 0-2 to resource 3
        loop.record(Result(segment.trial, 3, {0: 0.05, 1: 0.3, 2: 0.2}[segment.trial]))
    top = loop.next_segment()
    assert (top.trial, top.start, top.stop) == (0, 3, 9)
    loop.cut(Result(0, 5, 0.25, history=((4.0, 0.1), (5.0, 0.25))))
    # At resource 5 it would outrank every trial; at its rung (3) trial 2 is better.
    assert loop.reached[0] == (3, 0.25) and loop.best().trial == 2


@pytest.mark.slow
def test_a_run_stops_at_its_deadline_keeping_what_it_trained(
    tmp_path, stores, capsys, monkeypatch, prefect_api
) -> None:
    log = tmp_path / "epochs.log"
    monkeypatch.setenv("ELASTUNE_TEST_LOG", str(log))
    summary, err, lines = run_cli(tmp_path, stores, prefect_api, JOB)
    assert "stops after 5s, workers = segments" in err
    assert summary["deadline"] == {"seconds": 5.0, "passed": True, "segments_cut": 2}
    _print_run(summary)  # the table `elastune run` prints without --json
    assert "5 s: passed, 2 segments cut short" in capsys.readouterr().out
    # The two trials running at the deadline stopped there; the next two never started.
    assert summary["trials"] == 2 and summary["segments"] == 2
    assert summary["wall_seconds"] < 40 * 0.3  # one segment to its end takes 12 s
    story = "\n".join(lines)
    cut = [line for line in lines if " stopped by the deadline at resource " in line]
    assert len(cut) == 2 and all(line.endswith("(its segment 0 → 40)") for line in cut), story
    told = "deadline 5s passed: no segment starts from now, those running stop at their next step"
    assert lines.count(told) == 1 and lines.index(told) < lines.index(cut[0]), story
    assert any(
        line.startswith(f"job {summary['job_id']} done at its deadline: 2 trials") for line in lines
    )
    trained: dict[int, list[int]] = {}
    for line in log.read_text().splitlines():
        trial, epoch = map(int, line.split())
        trained.setdefault(trial, []).append(epoch)
    assert sorted(trained) == [0, 1]
    assert all(1 <= len(epochs) < 40 for epochs in trained.values())

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    for trial, epochs in trained.items():
        (run,) = client.search_runs(
            [client.get_experiment_by_name("deadline").experiment_id],
            f"tags.`elastune.trial` = '{trial}'",
        )
        assert run.info.status == "FINISHED" and run.data.tags["elastune.status"] == "stop"
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "val_accuracy")]
        assert steps == list(range(1, max(epochs) + 1))  # every epoch it trained, no more
        saved = [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")]
        assert saved == [f"checkpoints/resource-{max(epochs)}.pt"]  # its last one kept
    study = optuna.load_study(study_name=summary["job_id"], storage=summary["optuna_storage"])
    assert [t.state for t in study.trials] == [TrialState.PRUNED] * 2
    assert summary["best"] is not None
    from prefect.artifacts import Artifact

    board = json.loads(Artifact.get(f"{summary['job_id']}-leaderboard").data)
    assert sorted((row["trial"], row["status"]) for row in board) == [(0, "stop"), (1, "stop")]

    code = main(["resume", summary["job_id"], "--json", "--storage", summary["optuna_storage"]])
    again = json.loads(capsys.readouterr().out)
    assert code == 0 and again["already_finished"]


def test_a_segment_its_deadline_cut_runs_again_when_its_job_resumes(tmp_path: Path) -> None:
    """A driver that died after a cut, whether it recorded the cut or not: the resumed
    driver's deadline counts anew, so the segment runs on from its checkpoint."""
    spec = parse_job(
        {
            **JOB,
            "budget": {},
            "tracking": {
                "mlflow_uri": f"sqlite:///{tmp_path}/mlflow.db",
                "optuna_storage": f"sqlite:///{tmp_path}/optuna.db",
            },
        }
    )
    job = Job.create(prepare(spec), "deadline-resumed", [])
    segment, other = job.loop.next_segment(), job.loop.next_segment()
    run_id = job.trial_run(segment)
    result = Result(segment.trial, 4, -0.5, history=((4.0, -0.5),))
    saved = SegmentReport(result, ("val_accuracy",), cut=True)
    job.runs.tracker.save_report(run_id, report_name(segment), saved.to_dict())
    assert recover(job) == [segment, other]  # unrecorded: to run again
    job.cut(segment, saved)  # recorded, and the driver dies before the job's end
    job.flush()
    stored = stored_job(job.job_id, spec.tracking.optuna_storage)
    again = Job.resume(prepare(stored.spec), stored)
    assert again.tally.segments == 0 and recover(again) == [segment, other]
    result = Result(segment.trial, 40, -0.5, history=((40.0, -0.5),))
    whole = SegmentReport(result, ("val_accuracy",))
    again.runs.tracker.save_report(run_id, report_name(segment), whole.to_dict())
    assert recover(again) == [other] and again.loop.states[segment.trial] is Action.COMPLETE


@pytest.mark.slow
def test_data_parallel_ranks_stop_at_the_same_step(tmp_path: Path) -> None:
    """Ranks that look at the clock at different moments still stop together: none is left
    waiting in its epoch's all-reduce for a peer that stopped (flows hang there)."""
    store = f"sqlite:///{tmp_path}/mlflow.db"
    job = JobRef(
        "job", "tests.trainables:slow_wide_quadratic", "val_accuracy", "max", 100, store,
        # The ranks start in about 4 s on a quiet machine, past 10 s under a loaded CI run;
        # at 0.5 s an epoch the 100 take 50 s, so the deadline still cuts them.
        "deadline", deadline_at=time.time() + 25,
        segment_timeout=120,  # ranks that disagree hang: a failed segment, not a hung test
    )  # fmt: skip
    tracker = Tracker(job.mlflow_uri, job.experiment)
    run_id = tracker.start_trial(job.job_id, tracker.start_job(job.job_id, {}, {}), 0, {})
    report = run_segment(job, Segment(0, 0, 100, rung=0, gpus=2), {"x": 0.5}, run_id)
    assert report.error is None and report.cut
    assert 1 <= report.result.resource < 100
    assert [r for r, _ in report.result.history] == list(range(1, int(report.result.resource) + 1))
