"""The tuning loop shared by every executor: scheduler decisions in, Optuna kept informed.

A scheduler speaks in trial ids and segments; this loop samples a configuration from the
Optuna study the first time a trial id appears, reports every intermediate value with the
resource as its step, and tells Optuna how each trial ended: COMPLETE when it reached the
maximum resource, PRUNED when the scheduler stopped it, FAIL when it failed. The Prefect
flow and the simulator both drive this one class, so they cannot drift apart.

Example:
    >>> import optuna
    >>> from planners.spec import parse_job
    >>> spec = parse_job({"name": "d", "trainable": "m:f", "metric": "acc",
    ...     "space": {"x": {"type": "float", "low": 0, "high": 1}},
    ...     "sampler": {"name": "random", "seed": 1},
    ...     "scheduler": {"name": "sha", "min_resource": 1, "max_resource": 3}})
    >>> loop = TuningLoop(spec, optuna.create_study(direction="maximize"))
    >>> while (job := loop.next_segment()) is not None:
    ...     acc = loop.configs[job.trial]["x"] * job.stop / 3
    ...     _ = loop.record(Result(job.trial, job.stop, spec.loss(acc)))
    >>> best = loop.best()
    >>> best.resource, best.config == max(loop.configs.values(), key=lambda c: c["x"])
    (3, True)
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from planners.schedulers import make_scheduler
from planners.schedulers.base import Action, Decision, Result, Scheduler, Segment
from planners.space import distributions
from planners.spec import JobSpec


@dataclass(frozen=True)
class Best:
    trial: int
    config: dict[str, Any]
    metric: float
    resource: float


class TuningLoop:
    """Couples a scheduler with an Optuna study (ask/tell, define-and-run).

    Args:
        spec: The validated job.
        study: Where configurations come from and results go; its direction must match
            the job's mode.
        scheduler: Defaults to the one the job file names.
    """

    def __init__(self, spec: JobSpec, study: optuna.Study, scheduler: Scheduler | None = None):
        expected = "maximize" if spec.mode == "max" else "minimize"
        if study.direction.name.lower() != expected:
            raise ValueError(f"study direction must be {expected} for mode {spec.mode}")
        self.spec = spec
        self.study = study
        self.scheduler = scheduler or make_scheduler(spec, seed=spec.sampler.seed or 0)
        self.configs: dict[int, dict[str, Any]] = {}
        self.states: dict[int, Action] = {}
        self.reached: dict[int, tuple[float, float]] = {}  # trial -> (resource, loss)
        self._distributions = distributions(spec)
        self._trials: dict[int, optuna.trial.Trial] = {}
        self._reported: dict[int, set[int]] = {}
        self.running = 0

    # --- executor side -------------------------------------------------------------------

    def next_segment(self) -> Segment | None:
        """The next segment to run; samples a configuration for a trial seen for the first time."""
        job = self.scheduler.next_job()
        if job is None:
            return None
        if job.trial not in self._trials:
            trial = self.study.ask(self._distributions)
            self._trials[job.trial] = trial
            self.configs[job.trial] = dict(trial.params)
        if job.config is not None:
            self.configs[job.trial] = dict(job.config)
        self.running += 1
        return job

    def record(self, result: Result) -> list[Decision]:
        """Feed one finished segment to the scheduler and Optuna; returns the decisions."""
        self.running -= 1
        if not result.failed and not math.isfinite(result.loss):
            result = Result(result.trial, result.resource, result.loss, True, result.history)
        trial = self._trials[result.trial]
        for resource, loss in (*result.history, (result.resource, result.loss)):
            step = round(resource)
            if math.isfinite(loss) and step not in self._reported.setdefault(result.trial, set()):
                self._reported[result.trial].add(step)
                trial.report(self.spec.loss(loss), step)
        if not result.failed:
            self.reached[result.trial] = (result.resource, result.loss)
        decisions = self.scheduler.on_result(result)
        self._settle(decisions)
        return decisions

    def finish(self) -> list[Decision]:
        """The job is over: stop whatever still waits, and close every Optuna trial."""
        decisions = self.scheduler.finish()
        settled = {d.trial for d in decisions}  # built once: O(n) at 100,000 trials, not O(n^2)
        leftover = [
            Decision(t, Action.STOP, -1)
            for t in self._trials
            if self.states.get(t) not in (Action.STOP, Action.COMPLETE, Action.FAIL)
            and t not in settled
        ]
        self._settle(decisions + leftover)
        return decisions + leftover

    # --- bookkeeping ---------------------------------------------------------------------

    def _settle(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            self.states[decision.trial] = decision.action
            trial = self._trials[decision.trial]
            if decision.action is Action.COMPLETE:
                self._tell(
                    trial, TrialState.COMPLETE, self.spec.loss(self.reached[decision.trial][1])
                )
            elif decision.action is Action.STOP:
                self._tell(trial, TrialState.PRUNED)
            elif decision.action is Action.FAIL:
                self._tell(trial, TrialState.FAIL)

    def _tell(
        self, trial: optuna.trial.Trial, state: TrialState, value: float | None = None
    ) -> None:
        # GridSampler stops the study from inside tell once the grid is exhausted; the
        # trial is stored all the same (STACK.md §5).
        with contextlib.suppress(RuntimeError):
            self.study.tell(trial, value, state=state)

    def best(self) -> Best | None:
        """The best trial among those that reached the highest resource any trial reached."""
        if not self.reached:
            return None
        top = max(resource for resource, _ in self.reached.values())
        finalists = {t: loss for t, (resource, loss) in self.reached.items() if resource == top}
        trial = min(finalists, key=lambda t: finalists[t])
        return Best(trial, self.configs[trial], self.spec.loss(finalists[trial]), top)

    @property
    def idle(self) -> bool:
        """Nothing running; together with ``next_segment() is None`` the job is done."""
        return self.running == 0
