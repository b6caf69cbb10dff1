"""A job's log: its story in the Prefect UI, one line per event on the flow run's logger,
so that it reaches the run's Logs tab (docs/prefect-server.md, "Where to look"), and the rounding of
the numbers a person reads there and in the artifacts.

The events: the job id and mode at start, each stage's start and end, every scheduler
decision with what it was based on, the best so far when it changes, each pool sizing
action, the deadline's passing and each segment it cut short, and the job's end or failure.
A job of 50 trials writes a few hundred lines at most (about two per segment). The lines are
INFO: the CLI keeps its terminal to warnings (docs/cli.md, Environment) while the run's Logs
tab gets them all.

Example:
    >>> significant(0.003547349691008137), significant(12345.678), significant(-0.0)
    (0.003547, 12350.0, -0.0)
    >>> readable({"lr": 0.003547349691008137, "width": 54, "opt": "adam", "p": float("nan")})
    {'lr': 0.003547, 'width': 54, 'opt': 'adam', 'p': nan}
    >>> seconds(12.3456)
    12.3
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from prefect import get_run_logger

from elastune.flows.job import Job
from elastune.infra.sizing import SizingRecord
from elastune.planners.cost.inflight.replanner import Decision as ReplanDecision
from elastune.planners.cost.reports.plan_report import format_duration
from elastune.planners.search.schedulers.base import Action, Decision, Segment

DIGITS = 4  # significant digits of a metric or a configuration value
PAST = {
    Action.PROMOTE: "promoted",
    Action.PAUSE: "paused",
    Action.STOP: "stopped",
    Action.COMPLETE: "completed",
    Action.FAIL: "failed",
}


def significant(value: float, digits: int = DIGITS) -> float:
    """``value`` to ``digits`` significant digits; zero, NaN and inf as they are."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))


def seconds(value: float) -> float:
    return round(value, 1)


def readable(row: Mapping[str, Any]) -> dict[str, Any]:
    """The row with every float to :data:`DIGITS` significant digits (ints, text kept)."""
    return {k: significant(v) if isinstance(v, float) else v for k, v in row.items()}


def _trials(count: int) -> str:
    return f"{count} trial" if count == 1 else f"{count} trials"


def _config(config: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in readable(config).items())


class JobLog:
    """Tells the flow run's logger what happens to ``job``; call inside its flow run."""

    def __init__(self, job: Job):
        self.job = job
        self.log = get_run_logger()
        self._started: set[tuple[int, int]] = set()  # (bracket, rung) of the stages begun
        self._best: tuple[int, float] | None = None  # (trial, metric) last told
        self._deadline_told = False
        self._cut_trials: set[int] = set()  # trials told stopped by the deadline

    def begin(self, recovered: int) -> None:
        job = self.job
        self.log.info(
            "job %s: %s on %s, metric %s (%s); %s",
            job.job_id, job.spec.scheduler.name, job.spec.compute.pool, job.spec.metric,
            job.spec.mode, job.execution.mode,
        )  # fmt: skip
        if recovered:
            self.log.info("resumed: %d segments its previous driver left to run", recovered)

    def starting(self, segments: Sequence[Segment]) -> None:
        """A line for each stage whose first segment starts now."""
        for segment in segments:
            key = (segment.bracket, segment.rung)
            if key in self._started:
                continue
            self._started.add(key)
            stage = self.job.execution.stage(segment)
            if stage is None:  # an asynchronous scheduler: its rungs fill as trials climb
                self.log.info("rung %d started: resource up to %g", segment.rung, segment.stop)
            else:
                self.log.info(
                    "stage %s started: %s, resource %g → %g",
                    stage.name, _trials(stage.trials), stage.start, stage.stop,
                )  # fmt: skip

    def decided(self, decisions: Sequence[Decision], ended: bool = False) -> None:
        """One line per decision, with the metric it rests on or the failure's reason
        (``ended``: the job's end settled them, those the deadline cut already told); then
        the best so far, if it changed."""
        for decision in decisions:
            if not (ended and decision.trial in self._cut_trials):
                self.log.info("%s", self._decision(decision, ended))
        self._best_so_far()

    def deadline_passed(self) -> None:
        """The job's deadline passed: from now on nothing starts. Told once."""
        if self._deadline_told:
            return
        self._deadline_told = True
        self.log.info(
            "deadline %s passed: no segment starts from now, those running stop at their "
            "next step", format_duration(self.job.spec.budget.deadline or 0),
        )  # fmt: skip

    def cut(self, segment: Segment, resource: float) -> None:
        """A segment the deadline stopped short; its trial stops where it got to (the job's
        end stops it: ``TuningLoop.cut``)."""
        self.deadline_passed()  # a segment may see it before the driver does
        self._cut_trials.add(segment.trial)
        self.log.info(
            "trial %d stopped by the deadline at resource %g (its segment %g → %g)",
            segment.trial, resource, segment.start, segment.stop,
        )  # fmt: skip
        self._best_so_far()

    def _best_so_far(self) -> None:
        best = self.job.loop.best()
        if best is not None and (best.trial, best.metric) != self._best:
            self._best = (best.trial, best.metric)
            self.log.info(
                "best so far: %s %s, trial %d at resource %g (%s)",
                self.job.spec.metric, significant(best.metric), best.trial, best.resource,
                _config(best.config),
            )  # fmt: skip

    def _decision(self, decision: Decision, ended: bool) -> str:
        trial = decision.trial
        # A trial the job's end stopped with no rung (-1) is at the rung it last ran.
        rung = decision.rung if decision.rung >= 0 else self.job.tally.rungs.get(trial, 0)
        if decision.action is Action.FAIL:
            error = self.job.tally.errors.get(trial) or "no reason given"
            return f"trial {trial} failed at rung {rung}: {error.splitlines()[0]}"
        resource, loss = self.job.loop.reached.get(trial, (0, math.nan))
        basis = f"{self.job.spec.metric} {significant(self.job.spec.loss(loss))} at {resource:g}"
        if ended:
            return f"trial {trial} {PAST[decision.action]} at rung {rung}: {basis}, the job ended"
        because = {
            Action.PROMOTE: f"promoted from rung {rung}: {basis}, among the best of its rung",
            Action.PAUSE: f"paused at rung {rung}: {basis}, waiting for the rest of the rung",
            Action.STOP: f"stopped at rung {rung}: {basis}, not among the best of its rung",
            Action.COMPLETE: f"completed: {basis}, the maximum resource",
        }
        return f"trial {trial} {because[decision.action]}"

    def stage_done(self, segment: Segment) -> None:
        """The end of a planned stage (an asynchronous job's completions are decisions)."""
        stage = self.job.execution.stage(segment)
        if stage is None:
            return
        best = self.job.loop.best()
        told = "none yet" if best is None else f"{significant(best.metric)} (trial {best.trial})"
        self.log.info(
            "stage %s done: %s, best %s %s", stage.name, _trials(stage.trials),
            self.job.spec.metric, told,
        )  # fmt: skip

    def replanned(self, decision: ReplanDecision) -> None:
        """A re-planning decision of a planned job (flows/replanning.py), with its reason."""
        if decision.deadline_at_risk:
            self.log.warning("deadline at risk: %s", decision.describe())
        else:
            self.log.info("re-plan %s", decision.describe())

    def replan_failed(self, exc: Exception) -> None:
        self.log.warning("re-planning failed, the job goes on at its plan: %r", exc)

    def sized(self, records: Sequence[SizingRecord]) -> None:
        for r in records:
            self.log.info(
                "pool sizing %s: %s %s %s → %s (%s)",
                r.stage, r.target, r.setting, r.before, r.after, r.detail,
            )  # fmt: skip

    def end(self, summary: Mapping[str, Any]) -> None:
        best = summary["best"]
        stopped = summary.get("deadline", {}).get("passed", False)
        self.log.info(
            "job %s done%s: %s, %d segments in %s s; best %s",
            self.job.job_id, " at its deadline" if stopped else "", _trials(summary["trials"]),
            summary["segments"], seconds(summary["wall_seconds"]),
            "none" if best is None else f"{significant(best['metric'])} (trial {best['trial']})",
        )  # fmt: skip

    def failed(self, exc: BaseException) -> None:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        self.log.info("job %s failed: %s", self.job.job_id, reason)
