"""Any Optuna pruner as a stopping-type scheduler (docs/algorithms.md §3.5), for side-by-side runs.

Optuna's ``SuccessiveHalvingPruner`` and ``HyperbandPruner`` are asynchronous and
stopping-type: a trial keeps training and is compared at each rung as it crosses it. This
adapter reproduces that inside elastune's interface: each trial trains in short segments,
every report goes into a private in-memory study that holds the pruner, and after each
segment ``trial.should_prune()`` decides between the next segment (PROMOTE) and STOP. The
private study keeps the pruner's view independent of the job's own study, whose sampler
chooses the configurations as usual.

Checking only at ``steps`` is exact for pruners that decide only at those steps (the rungs
of ``SuccessiveHalvingPruner``/``HyperbandPruner`` return "keep going" in between and record
nothing), and saves the per-epoch events.

Example:
    >>> import optuna
    >>> sha = PrunerScheduler(optuna.pruners.SuccessiveHalvingPruner(1, 3), 9, steps=[1, 3, 9])
    >>> jobs = [sha.next_segment() for _ in range(2)]
    >>> [sha.on_result(Result(j.trial, j.stop, loss))[0].action.value
    ...  for j, loss in zip(jobs, [0.2, 0.5])]                # worse than the first: pruned
    ['promote', 'stop']
    >>> sha.next_segment()
    Segment(trial=0, start=1, stop=3, rung=1, bracket=0, gpus=1.0, config=None, clone_from=None)
"""

from __future__ import annotations

from collections.abc import Sequence

import optuna
from optuna.trial import TrialState

from elastune.planners.search.schedulers.base import (
    Action,
    Decision,
    Result,
    Stopping,
)


class PrunerScheduler(Stopping):
    """Trials train segment by segment; an Optuna pruner stops the ones it would prune.

    Args:
        pruner: Any ``optuna.pruners.BasePruner``.
        max_resource: Resource a trial the pruner never stops is trained to.
        steps: Segment ends, ascending; ``max_resource`` is added if missing. Default:
            every whole unit of resource (1, 2, ..., max_resource).
        max_trials: How many configurations to start; None runs until the executor's
            deadline or budget ends the job.
        study_name: Name of the private study (``HyperbandPruner`` hashes it, with the
            trial number, to pick each trial's bracket).
    """

    def __init__(
        self,
        pruner: optuna.pruners.BasePruner,
        max_resource: float,
        steps: Sequence[float] | None = None,
        max_trials: int | None = None,
        study_name: str = "elastune-pruner",
    ):
        if max_resource <= 0:
            raise ValueError(f"max_resource must be > 0, got {max_resource}")
        levels = sorted({*(steps or range(1, int(max_resource) + 1)), max_resource})
        if levels[0] <= 0 or levels[-1] > max_resource:
            raise ValueError(f"steps must lie in (0, max_resource={max_resource}], got {steps}")
        super().__init__(levels, max_trials)
        self._study = optuna.create_study(
            study_name=study_name, direction="minimize", pruner=pruner
        )
        self._trials: dict[int, optuna.Trial] = {}
        self._reported: dict[int, set[int]] = {}

    def _started(self, trial: int) -> None:
        self._trials[trial] = self._study.ask()

    def on_result(self, result: Result) -> list[Decision]:
        trial, k = result.trial, self._level[result.trial]
        shadow = self._trials[trial]
        if result.failed:
            self._study.tell(shadow, state=TrialState.FAIL)
            return [Decision(trial, Action.FAIL, k)]
        reported = self._reported.setdefault(trial, set())
        for resource, loss in (*result.history, (result.resource, result.loss)):
            if round(resource) not in reported:  # Optuna keeps the first value of a step
                reported.add(round(resource))
                shadow.report(loss, round(resource))
        if k == len(self.levels) - 1:
            self._study.tell(shadow, result.loss)
            return [Decision(trial, Action.COMPLETE, k)]
        if shadow.should_prune():
            self._study.tell(shadow, state=TrialState.PRUNED)
            return [Decision(trial, Action.STOP, k)]
        return self._continue(trial, k)
