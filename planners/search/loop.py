"""The tuning loop shared by every executor: scheduler decisions in, Optuna kept informed.

A scheduler speaks in trial ids and segments; this loop samples a configuration from the
Optuna study the first time a trial id appears, reports every intermediate value with the
resource as its step, and tells Optuna how each trial ended: COMPLETE when it reached the
maximum resource, PRUNED when the scheduler stopped it, FAIL when it failed. The Prefect
flow and the simulator both drive this one class, so they cannot drift apart.

Durability: with a :class:`~elastune.planners.search.journal.Journal`, every segment is appended
when it is handed out (before the executor submits it) and every result when it is
recorded: one record per event. :meth:`TuningLoop.replay` feeds those records to a fresh
scheduler, which rebuilds its exact state (rungs, promotions, trials in flight, including
segments handed out after the last result) without re-running or re-telling anything;
Optuna trials are matched to trial ids through their ``elastune.trial`` attribute, and a
trial asked but never tagged (a driver killed in between) is adopted by the next trial id
instead of asked again. With a sampler seed, each trial's configuration is drawn by a
sampler seeded from (seed, trial id), so a resumed job samples what an uninterrupted one
would have.

Example:
    >>> import optuna
    >>> from elastune.planners.spec import parse_job
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
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from elastune.planners.search.journal import Journal
from elastune.planners.search.schedulers.base import Action, Decision, Result, Scheduler, Segment
from elastune.planners.search.schedulers.factory import make_scheduler
from elastune.planners.spec import JobSpec, distributions, make_sampler


@dataclass(frozen=True)
class Best:
    trial: int
    config: dict[str, Any]
    metric: float
    resource: float


TRIAL_ATTR = "elastune.trial"


class TuningLoop:
    """Couples a scheduler with an Optuna study (ask/tell, define-and-run).

    Args:
        spec: The validated job.
        study: Where configurations come from and results go; its direction must match
            the job's mode. Trials it already holds (a resumed job) are reused.
        scheduler: Defaults to the one the job file names.
        journal: Where segments and results are recorded as they happen, for :meth:`replay`.
    """

    def __init__(
        self,
        spec: JobSpec,
        study: optuna.Study,
        scheduler: Scheduler | None = None,
        journal: Journal | None = None,
    ):
        expected = "maximize" if spec.mode == "max" else "minimize"
        if study.direction.name.lower() != expected:
            raise ValueError(f"study direction must be {expected} for mode {spec.mode}")
        self.spec = spec
        self.study = study
        self.scheduler = scheduler or make_scheduler(spec, seed=spec.sampler.seed or 0)
        self.journal = journal
        self.configs: dict[int, dict[str, Any]] = {}
        self.states: dict[int, Action] = {}
        self.reached: dict[int, tuple[float, float]] = {}  # trial -> (resource, loss)
        self.running = 0
        self._distributions = distributions(spec)
        self._trials: dict[int, optuna.trial.Trial] = {}
        self._reported: dict[int, set[int]] = {}
        self._finished: set[int] = set()
        self._in_flight: dict[int, Segment] = {}  # a trial runs one segment at a time
        self._untold: list[tuple[Result, list[Decision]]] = []  # decided, not yet in the study
        self._seeded_for: int | None = None  # the trial id the study's sampler is seeded for
        self._stored: dict[int, optuna.trial.FrozenTrial] = {}
        # Asked but never tagged with a trial id: a driver died between the two writes.
        self._orphans: list[optuna.trial.FrozenTrial] = []
        for t in study.get_trials(deepcopy=False):
            if TRIAL_ATTR in t.user_attrs:
                self._stored[t.user_attrs[TRIAL_ATTR]] = t
            elif t.state is TrialState.RUNNING:
                self._orphans.append(t)

    # --- executor side -------------------------------------------------------------------

    def next_segment(self) -> Segment | None:
        """The next segment to run; samples a configuration for a trial seen for the first time.

        The segment is journaled before it is returned, so it is durable before the executor
        submits it: a resumed driver knows every segment in flight when its predecessor died.
        """
        job = self._hand_out()
        if job is not None and self.journal is not None:
            self.journal.append({"handed_out": [asdict(job)]})
        return job

    def _hand_out(self) -> Segment | None:
        job = self.scheduler.next_segment()
        if job is None:
            return None
        if job.trial not in self._trials:
            self._open(job.trial)
        if job.config is not None:
            self.configs[job.trial] = dict(job.config)
        self.running += 1
        self._in_flight[job.trial] = job
        return job

    def _open(self, trial_id: int) -> None:
        stored = self._stored.get(trial_id)
        if stored is not None:  # asked before a crash: reuse it, never ask twice
            trial = optuna.trial.Trial(self.study, stored._trial_id)
            params = stored.params
            self._reported[trial_id] = set(stored.intermediate_values)
            if stored.state.is_finished():
                self._finished.add(trial_id)
        else:
            self._seed(trial_id)
            if self._orphans:
                # Asking again would leave the orphan RUNNING for ever (TPE's constant liar
                # counts it) and shift every later draw. Its parameters are what the ask drew;
                # any it had not drawn yet are suggested as study.ask does for a new trial.
                trial = optuna.trial.Trial(self.study, self._orphans.pop(0)._trial_id)
                for name, distribution in self._distributions.items():
                    trial._suggest(name, distribution)
            else:
                trial = self.study.ask(self._distributions)
            trial.set_user_attr(TRIAL_ATTR, trial_id)
            params = trial.params
            # Seeded for the next trial now, not at its ask: whatever asks next (this loop,
            # or a driver killed before its tag) draws from a sampler fresh and seeded for
            # that trial, so an orphan holds the configuration the next trial would have.
            self._seed(trial_id + 1)
        self._trials[trial_id] = trial
        self.configs[trial_id] = dict(params)

    def _seed(self, trial_id: int) -> None:
        """Give the study a sampler of its own for ``trial_id``, seeded by (seed, trial):
        sampling does not depend on how many draws came before, so a resumed job draws the
        same configurations."""
        seed = self.spec.sampler.seed
        if seed is None or self.spec.sampler.name == "qmc" or self._seeded_for == trial_id:
            return
        # Modulo 2**32: numpy rejects larger seeds (sampler.seed >= 4295 did).
        self.study.sampler = make_sampler(self.spec, seed=(seed * 1_000_003 + trial_id) % 2**32)
        self._seeded_for = trial_id

    def record(self, result: Result, note: dict[str, Any] | None = None) -> list[Decision]:
        """Feed one finished segment to the scheduler and Optuna; returns the decisions.

        ``note`` is journaled with the result, for the executor's own replay needs.
        """
        decisions = self.decide(result, note)
        self.tell_optuna()
        return decisions

    def decide(self, result: Result, note: dict[str, Any] | None = None) -> list[Decision]:
        """:meth:`record` without Optuna's writes, which wait for :meth:`tell_optuna`: the
        Prefect flow starts the segments the decisions free before it writes them, so that
        no worker waits on the study's transactions (one per reported epoch). Until then
        the study lacks this result, and a new trial is sampled without it; a driver that
        dies in between loses nothing, the journal has the result and replay tells Optuna.
        """
        return self._journaled(*self._decide(result), note)

    def cut(self, result: Result, note: dict[str, Any] | None = None) -> None:
        """A segment the job's deadline stopped short (``result`` holds what it trained):
        its trial is ranked where it got to, at the resource its segment began from, and
        stopped by the job's end (:meth:`finish`), not now. The scheduler is not asked,
        since it judges whole segments only; Optuna learns of the values at
        :meth:`tell_optuna`, as for :meth:`decide`. A replay runs the segment again: a
        driver that dies before the job's end leaves its resumed successor a deadline of
        its own, and the trial open in Optuna and MLflow."""
        self.running -= 1
        segment = self._in_flight.pop(result.trial)
        if result.history and math.isfinite(result.loss):  # it trained before the cut
            # Ranked where its segment began (the rung it had finished), by its newest
            # value: a few epochs past a rung do not outrank a trial that finished a higher
            # one (best(), the leaderboard).
            self.reached[result.trial] = (segment.start, result.loss)
        self._journaled(result, [], note, cut=True)

    def _journaled(
        self,
        result: Result,
        decisions: list[Decision],
        note: dict[str, Any] | None,
        cut: bool = False,
    ) -> list[Decision]:
        """``decisions`` kept for :meth:`tell_optuna`, and ``result`` journaled."""
        self._untold.append((result, decisions))
        if self.journal is not None:
            record = {"result": asdict(result), "note": note}
            self.journal.append((record | {"cut": True}) if cut else record)
        return decisions

    def tell_optuna(self) -> list[Decision]:
        """Write to the study what :meth:`decide` left: intermediate values and trial ends.
        Returns the decisions it wrote, for the executor's own records."""
        told = []
        for result, decisions in self._untold:
            self._inform(result, decisions)
            told += decisions
        self._untold.clear()
        return told

    def _apply(self, result: Result) -> list[Decision]:
        result, decisions = self._decide(result)
        self._inform(result, decisions)
        return decisions

    def _decide(self, result: Result) -> tuple[Result, list[Decision]]:
        self.running -= 1
        self._in_flight.pop(result.trial, None)  # O(1): 500 workers x 100,000 trials
        if not result.failed and not math.isfinite(result.loss):
            result = Result(result.trial, result.resource, result.loss, True, result.history)
        if not result.failed:
            self.reached[result.trial] = (result.resource, result.loss)
        decisions = self.scheduler.on_result(result)
        self.states.update((decision.trial, decision.action) for decision in decisions)
        return result, decisions

    def _inform(self, result: Result, decisions: list[Decision]) -> None:
        """Report a result's intermediate values to its Optuna trial, then the trials the
        decisions ended."""
        if result.trial not in self._finished:
            trial, done = self._trials[result.trial], self._reported.setdefault(result.trial, set())
            for resource, loss in (*result.history, (result.resource, result.loss)):
                step = round(resource)
                if math.isfinite(loss) and step not in done:
                    done.add(step)
                    trial.report(self.spec.loss(loss), step)
        self._tell_ends(decisions)

    def replay(
        self, records: list[dict[str, Any]], handed_out: list[dict[str, Any]] | None = None
    ) -> Iterator[tuple[Result, dict[str, Any] | None, list[Decision]]]:
        """Rebuild the state of a job from its journal, yielding what each record decided.

        ``handed_out``: segments journaled after the last result (``StudyJournal.handed_out``);
        they are handed out again without a result, so :meth:`in_flight` lists them, as it
        lists the segments a deadline cut (:meth:`cut`).
        """
        for record in records:
            for logged in record["handed_out"]:
                self._hand_out_again(logged)
            if record.get("cut", False):  # in flight again: this driver's deadline is its own
                continue
            result = _result(record["result"])
            yield result, record.get("note"), self._apply(result)
        for logged in handed_out or ():
            self._hand_out_again(logged)

    def _hand_out_again(self, logged: dict[str, Any]) -> None:
        job, expected = self._hand_out(), _segment(logged)
        if job != expected:
            raise RuntimeError(
                f"replay diverged: scheduler handed out {job}, journal has {expected}"
            )

    def optuna_trial(self, trial_id: int) -> optuna.trial.Trial:
        return self._trials[trial_id]

    def in_flight(self) -> list[Segment]:
        """Segments handed out without a result yet (after a replay: those to run again)."""
        return list(self._in_flight.values())

    def finish(self) -> list[Decision]:
        """The job is over: stop whatever still waits, and close every Optuna trial."""
        self.tell_optuna()  # a trial's values before its end
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
        self.states.update((decision.trial, decision.action) for decision in decisions)
        self._tell_ends(decisions)

    def _tell_ends(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            if decision.action is Action.COMPLETE:
                value = self.spec.loss(self.reached[decision.trial][1])
                self._tell(decision.trial, TrialState.COMPLETE, value)
            elif decision.action is Action.STOP:
                self._tell(decision.trial, TrialState.PRUNED)
            elif decision.action is Action.FAIL:
                self._tell(decision.trial, TrialState.FAIL)

    def _tell(self, trial_id: int, state: TrialState, value: float | None = None) -> None:
        if trial_id in self._finished:  # told before a crash
            return
        self._finished.add(trial_id)
        # GridSampler stops the study from inside tell once the grid is exhausted; the
        # trial is stored all the same (docs/stack.md §5).
        with contextlib.suppress(RuntimeError):
            self.study.tell(self._trials[trial_id], value, state=state)

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


def _segment(data: dict[str, Any]) -> Segment:
    return Segment(**data)


def _result(data: dict[str, Any]) -> Result:
    return Result(**{**data, "history": tuple(tuple(p) for p in data["history"])})
