"""A job's MLflow runs: one parent run, one nested run per trial.

A trial's run is started when its first segment is handed out (or taken up, when a driver
died after starting it and before the study named it), its tags follow the scheduler's
decisions, and it ends when the trial stops, completes or fails. Those decisions reach
MLflow from a thread of their own, in order, so that the driver's next segment does not
wait on them (two requests a decision: docs/cluster.md, "What a segment costs across
hosts"); a driver that dies with some unwritten, its resumed successor writes them again
(:meth:`TrialRuns.settle`).
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from elastune.planners.search.schedulers.base import Action, Decision, Segment
from elastune.planners.spec import JobSpec
from elastune.tasks.contract import report_name
from elastune.tasks.tracking import Tracker, flatten

# The status a trial's run ends with when the scheduler ends the trial.
ENDS = {Action.STOP: "FINISHED", Action.COMPLETE: "FINISHED", Action.FAIL: "FAILED"}


class TrialRuns:
    """The parent run of a job and its trial runs, by trial id.

    Args:
        tracker: The job's MLflow store and experiment.
        job_id: The job.
        parent: The parent run's id.
        runs: Trial id -> run id of the trials the study names a run for.
        untagged: Trial runs MLflow holds that the study does not name (a driver died in
            between): a resumed job takes them up instead of starting a second run.
    """

    def __init__(
        self,
        tracker: Tracker,
        job_id: str,
        parent: str,
        runs: dict[int, str],
        untagged: dict[int, str] | None = None,
    ):
        self.tracker = tracker
        self.job_id = job_id
        self.parent = parent
        self.runs = runs
        self.untagged = untagged or {}
        self._writer: ThreadPoolExecutor | None = None  # the decisions' writes, in order
        self._writes: list[Future[None]] = []

    @classmethod
    def start_job(cls, spec: JobSpec, tracker: Tracker, job_id: str) -> TrialRuns:
        """Start the job's parent run, with the spec as its parameters."""
        parent = tracker.start_job(
            job_id,
            flatten(spec.model_dump(mode="json")),
            {"elastune.scheduler": spec.scheduler.name, "elastune.sampler": spec.sampler.name},
        )
        return cls(tracker, job_id, parent, {})

    @classmethod
    def take_up(cls, tracker: Tracker, job_id: str, parent: str, runs: dict[int, str]) -> TrialRuns:
        """The runs of a job whose driver died, with the ones the study does not name."""
        found = tracker.trial_runs(parent)
        return cls(tracker, job_id, parent, runs, {t: r for t, r in found.items() if t not in runs})

    def __contains__(self, trial: int) -> bool:
        return trial in self.runs

    def __getitem__(self, trial: int) -> str:
        return self.runs[trial]

    def start(self, trial: int, config: dict[str, Any]) -> str:
        """The trial's run: one left untagged by a killed driver, or a new one."""
        run_id = self.untagged.pop(trial, None) or self.tracker.start_trial(
            self.job_id, self.parent, trial, config
        )
        self.runs[trial] = run_id
        return run_id

    def saved_report(self, segment: Segment) -> dict[str, Any] | None:
        """The report a finished segment kept in its trial's run; None if it did not finish
        (or its trial has no run yet: a segment is journaled before it is submitted)."""
        run_id = self.runs.get(segment.trial)
        return None if run_id is None else self.tracker.load_report(run_id, report_name(segment))

    def track(self, decision: Decision, error: str | None) -> None:
        """Tag the trial's run with the scheduler's decision and end it when the trial
        ends, in the background (:meth:`drain` waits; a write that failed raises here, at
        the next decision). A trial whose first segment never started (the deadline passed)
        has no run."""
        run_id = self.runs.get(decision.trial)
        if run_id is None:
            return
        for write in [w for w in self._writes if w.done()]:
            self._writes.remove(write)
            write.result()
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trial-runs")
        self._writes.append(self._writer.submit(self._write, run_id, decision, error))

    def drain(self) -> None:
        """Wait for the decisions under way to reach MLflow; raise the first that failed."""
        writes, self._writes = self._writes, []
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
        for write in writes:
            write.result()

    def _write(self, run_id: str, decision: Decision, error: str | None) -> None:
        tags: dict[str, Any] = {"elastune.status": decision.action.value}
        if decision.rung >= 0:
            tags["elastune.rung"] = decision.rung
        if decision.action is Action.FAIL:
            tags["elastune.error"] = (error or "")[:5000]
        self.tracker.set_tags(run_id, tags)
        if decision.action in ENDS:
            self.tracker.end_run(run_id, ENDS[decision.action])

    def settle(self, decision: Decision, error: str | None) -> None:
        """Track a decision replayed on resume, unless its run already ended as it says:
        a finished run keeps its end time and tags."""
        ended = ENDS.get(decision.action)
        if ended is not None and self.tracker.status(self.runs[decision.trial]) == ended:
            return
        self.track(decision, error)

    def abort(self, purge: bool) -> None:
        """End every run as failed, or (``purge``: bad input) delete them all."""
        with contextlib.suppress(Exception):  # what failed is the job's error already
            self.drain()
        if purge:
            self.tracker.purge([self.parent, *self.runs.values()])
        else:
            for run_id in (*self.runs.values(), self.parent):
                self.tracker.end_run(run_id, "FAILED")
