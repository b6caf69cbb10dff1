"""A job as its driver holds it: the prepared job, its Optuna study and scheduler loop, its
MLflow runs (:class:`elastune.flows.trial_runs.TrialRuns`) and the tally of what it has done.

Every segment is journaled in the study when it is handed out, and every result as it
arrives; the study also holds the spec and the parent run. So :meth:`Job.resume` rebuilds
a job whose driver died from the study alone and replays its journal.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import optuna

from elastune.flows.prepare import PreparedJob
from elastune.flows.stored_job import FINISHED_ATTR, RUN_ATTR, SPEC_ATTR, StoredJob
from elastune.flows.trial_runs import TrialRuns
from elastune.planners.execution import Execution
from elastune.planners.search import StudyJournal, TuningLoop
from elastune.planners.search.schedulers.base import Action, Decision, Segment
from elastune.planners.spec import JobSpec, SpecError, make_sampler
from elastune.tasks.contract import JobRef, SegmentReport
from elastune.tasks.stores import first_use, local_uri
from elastune.tasks.study_storage import driver_storage
from elastune.tasks.tracking import Tracker


class MetricNotReported(SpecError):
    """The trainable finished a segment without ever reporting the job's metric."""


def new_job_id(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}".lower()


@dataclass
class Tally:
    """What a job has done so far, from live results and replayed ones alike."""

    segments: int = 0
    rungs: dict[int, int] = field(default_factory=dict)  # trial -> rung it last ran
    errors: dict[int, str] = field(default_factory=dict)  # trial -> why it failed
    stage_results: dict[tuple[int, int], int] = field(default_factory=dict)
    metric_seen: bool = False
    cut: int = 0  # segments the job's deadline stopped short

    def count(self, trial: int, note: dict[str, Any], metric: str) -> None:
        self.segments += 1
        self.cut += bool(note.get("cut"))
        if note.get("error"):
            self.errors[trial] = note["error"]
        if metric in note.get("metrics_seen", ()):
            self.metric_seen = True
        self.rungs[trial] = note.get("rung", 0)
        key = (note.get("bracket", 0), note.get("rung", 0))
        self.stage_results[key] = self.stage_results.get(key, 0) + 1


class Job:
    """One job's state: its study and scheduler loop, its MLflow runs and its tally."""

    def __init__(self, prepared: PreparedJob, job_id: str, study: optuna.Study, runs: TrialRuns):
        self.prepared = prepared
        self.job_id = job_id
        self.runs = runs
        self.began = time.monotonic()
        self.last_report: float | None = None  # when the last segment's report came
        self.storage = local_uri(self.spec.tracking.optuna_storage)
        self.journal = StudyJournal(study)
        self.loop = TuningLoop(self.spec, study, journal=self.journal)
        self.ref = JobRef.of(self.spec, job_id, runs.tracker.uri)
        self.tally = Tally()

    @property
    def spec(self) -> JobSpec:
        return self.prepared.spec

    @property
    def execution(self) -> Execution:
        return self.prepared.execution

    @classmethod
    def create(cls, prepared: PreparedJob, job_id: str, warm_start: list[dict[str, Any]]) -> Job:
        """A new job: its study, its parent run, and ``warm_start`` configs tried first."""
        spec = prepared.spec
        tracker = Tracker(spec.tracking.mlflow_uri, spec.experiment)
        storage = local_uri(spec.tracking.optuna_storage)
        with first_use(storage):
            study = optuna.create_study(
                study_name=job_id,
                storage=driver_storage(storage),
                direction="maximize" if spec.mode == "max" else "minimize",
                sampler=make_sampler(spec),
            )
        runs = TrialRuns.start_job(spec, tracker, job_id)
        for config in warm_start:  # tried first, before the sampler proposes anything
            study.enqueue_trial(config, skip_if_exists=True)
        # The spec last: a study that has it has everything resume needs.
        study.set_user_attr(RUN_ATTR, runs.parent)
        study.set_user_attr(SPEC_ATTR, spec.model_dump(mode="json"))
        return cls(prepared, job_id, study, runs)

    @classmethod
    def resume(cls, prepared: PreparedJob, stored: StoredJob) -> Job:
        """The job :func:`stored_job` found, prepared: its runs taken up, its journal
        replayed."""
        spec, study = prepared.spec, stored.study
        named = {
            t.user_attrs["elastune.trial"]: t.user_attrs[RUN_ATTR]
            for t in study.get_trials(deepcopy=False)
            if RUN_ATTR in t.user_attrs
        }
        tracker = Tracker(spec.tracking.mlflow_uri, spec.experiment)
        runs = TrialRuns.take_up(tracker, study.study_name, stored.parent, named)
        job = cls(prepared, study.study_name, study, runs)
        last: dict[int, Decision] = {}  # each trial's latest decision: what its run shows
        for result, note, decisions in job.loop.replay(*job.journal.fold()):
            job.tally.count(result.trial, note or {}, spec.metric)
            last.update((decision.trial, decision) for decision in decisions)
        for decision in last.values():
            job.runs.settle(decision, job.tally.errors.get(decision.trial))
        return job

    # --- one segment ---------------------------------------------------------------------

    def trial_run(self, segment: Segment) -> str:
        """The MLflow run ``segment`` trains in, started with the trial's first segment; a
        clone (PBT) starts from its donor's checkpoint."""
        if segment.trial not in self.runs:
            run_id = self.runs.start(segment.trial, self.loop.configs[segment.trial])
            self.loop.optuna_trial(segment.trial).set_user_attr(RUN_ATTR, run_id)
        run_id = self.runs[segment.trial]
        if segment.clone_from is not None:
            self.runs.tracker.copy_checkpoint(self.runs[segment.clone_from], run_id)
        return run_id

    def record(self, segment: Segment, report: SegmentReport) -> list[Decision]:
        """A segment's result: journaled, decided by the scheduler and tallied. Optuna and
        the trials' MLflow runs learn of it at :meth:`flush`."""
        self.last_report = time.monotonic()
        error = report.error
        if self.spec.metric in report.metrics_seen:
            self.tally.metric_seen = True
        elif error is None:
            seen = ", ".join(report.metrics_seen) or "nothing"
            if report.metrics_seen and not self.tally.metric_seen:  # a name mistaken
                raise MetricNotReported(
                    f"metric: {self.spec.trainable} never reported {self.spec.metric!r} "
                    f"(it reported: {seen})"
                )
            error = f"the segment reported no {self.spec.metric!r} (it reported: {seen})"
        note = _note(segment, report, error)
        decisions = self.loop.decide(report.result, note)
        self.tally.count(segment.trial, note, self.spec.metric)
        return decisions

    def cut(self, segment: Segment, report: SegmentReport) -> None:
        """A segment the deadline stopped short (``report.cut``): its trial is ranked where
        it got to and stopped at the job's end (``TuningLoop.cut``), journaled and tallied
        as :meth:`record` does."""
        self.last_report = time.monotonic()
        note = _note(segment, report, None) | {"cut": True}
        self.loop.cut(report.result, note)
        self.tally.count(segment.trial, note, self.spec.metric)

    def past_deadline(self) -> bool:
        """Has the job's ``budget.deadline`` passed? Then nothing new starts."""
        at = self.ref.deadline_at
        return at is not None and time.time() >= at

    def flush(self) -> None:
        """Write what :meth:`record` left to Optuna and to the trials' runs. The driver
        calls it once the segments a result freed have started: the writes (a transaction
        per reported epoch, a run's tags) then overlap training instead of delaying it."""
        for decision in self.loop.tell_optuna():
            self.runs.track(decision, self.tally.errors.get(decision.trial))

    def stage_done(self, segment: Segment, decisions: list[Decision]) -> bool:
        """Time for a leaderboard: a stage finished, or (asynchronous schedulers, which have
        no stages) a trial completed."""
        stage = self.execution.stage(segment)
        if stage is None:
            return any(d.action is Action.COMPLETE for d in decisions)
        return self.tally.stage_results.get((segment.bracket, segment.rung), 0) == stage.trials

    def best_metric(self) -> float | None:
        best = self.loop.best()
        return None if best is None else best.metric

    def mark_finished(self, summary: dict[str, Any]) -> None:
        """Store the summary on the study: resuming a finished job only reports it."""
        at = datetime.now(UTC).isoformat(timespec="seconds")
        self.journal.study.set_user_attr(FINISHED_ATTR, {"at": at, "summary": summary})

    def abort(self, bad_input: bool) -> None:
        """A failed job keeps what it finished; bad input leaves nothing behind."""
        self.runs.abort(purge=bad_input)
        if bad_input:
            optuna.delete_study(study_name=self.job_id, storage=self.storage)


def _note(segment: Segment, report: SegmentReport, error: str | None) -> dict[str, Any]:
    """What the journal keeps beside a segment's result, for the tally a resume rebuilds."""
    return {
        "metrics_seen": list(report.metrics_seen),
        "error": error,
        "rung": segment.rung,
        "bracket": segment.bracket,
    }
