"""Where a simulated job's configurations come from.

- A benchmark without a table (e.g. the LCBench surrogate) answers for any configuration,
  so the job's own Optuna sampler proposes them, seeded per run.
- A benchmark with a finite ``table`` bypasses the sampler cleanly: the in-memory study gets
  a :class:`TableSampler` that hands trial number ``i`` the ``i``-th row of a permutation
  drawn from the run's seed (without replacement; ``replace=True`` draws rows with
  replacement). Schedulers with ``max_trials`` are capped at the table's size
  (:func:`fit_to_table`). The one exception is the model-based ``mf-tpe`` sampler: it
  chooses among the rows not tried yet (:func:`table_sampler`).
- The fast path (``use_optuna=False``): a stand-in for the Optuna study that draws
  configurations directly (table rows, or uniform draws from the space) and drops reports,
  for runs of 100,000 trials where Optuna's bookkeeping would dominate.

Example (a table of three rows, drawn in a seeded order without replacement):
    >>> rows = RowDraw(3, seed=0)
    >>> sorted(rows(n) for n in range(3))
    [0, 1, 2]
    >>> rows(3)
    Traceback (most recent call last):
    ...
    ValueError: the table has only 3 configurations to draw
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.study import StudyDirection

from elastune.planners.samplers import MultiFidelityTpeSampler
from elastune.planners.search.explore import draw
from elastune.planners.sim.benchmark import Benchmark
from elastune.planners.spec import JobSpec, SpecError, distributions, make_sampler
from elastune.planners.spec.model import AshaSpec, BloomSpec, FifoSpec, MedianSpec, PbtSpec, ShaSpec


class RowDraw:
    """Row indices of a table for trial numbers 0, 1, 2, ...: a seeded permutation, or
    independent draws with ``replace=True``."""

    def __init__(self, size: int, seed: int, replace: bool = False):
        self.size = size
        self.replace = replace
        self._rng = np.random.default_rng(seed)
        self._rows: list[int] = [] if replace else self._rng.permutation(size).tolist()

    def __call__(self, number: int) -> int:
        if self.replace:
            while len(self._rows) <= number:
                self._rows.extend(self._rng.integers(self.size, size=1024).tolist())
        elif number >= self.size:
            raise ValueError(f"the table has only {self.size} configurations to draw")
        return self._rows[number]


class TableSampler(optuna.samplers.BaseSampler):
    """An Optuna sampler that hands out whole rows of a finite table (no search at all)."""

    def __init__(self, table: Sequence[Mapping[str, Any]], rows: RowDraw):
        self.table = table
        self.rows = rows

    def infer_relative_search_space(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        search_space: dict[str, BaseDistribution],
    ) -> dict[str, Any]:
        return {}

    def sample_independent(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self.table[self.rows(trial.number)][param_name]


class _LightTrial:
    __slots__ = ("number", "params")

    def __init__(self, number: int, params: dict[str, Any]):
        self.number, self.params = number, params

    def report(self, value: float, step: int) -> None:
        """The fast path keeps no intermediate values."""

    def set_user_attr(self, key: str, value: Any) -> None:
        """Nor attributes."""


class _LightStudy:
    """The part of ``optuna.Study`` that TuningLoop uses, without storage (fast path)."""

    def __init__(self, direction: StudyDirection, propose: Callable[[int], dict[str, Any]]):
        self.direction = direction
        self._propose = propose
        self._asked = 0

    def get_trials(self, deepcopy: bool = True) -> list[Any]:
        return []  # a fresh run: nothing to resume

    def ask(self, fixed_distributions: Mapping[str, BaseDistribution]) -> _LightTrial:
        trial = _LightTrial(self._asked, self._propose(self._asked))
        self._asked += 1
        return trial

    def tell(self, trial: _LightTrial, value: float | None = None, state: Any = None) -> None:
        """Nothing to learn from: the fast path has no model-based sampler."""


def study_for(
    spec: JobSpec,
    benchmark: Benchmark,
    seed: int,
    use_optuna: bool,
    replace: bool,
    sampler: optuna.samplers.BaseSampler | None,
) -> Any:
    """The study a run asks for configurations: Optuna's (the job's sampler, the table's, or
    ``sampler``), or without ``use_optuna`` and ``sampler`` the fast path's stand-in."""
    direction = StudyDirection.MAXIMIZE if spec.mode == "max" else StudyDirection.MINIMIZE
    table = benchmark.table
    rows = RowDraw(len(table), seed, replace) if table is not None else None
    if sampler is not None or use_optuna:
        if sampler is None:
            sampler = table_sampler(spec, table, rows, seed) if rows else make_sampler(spec, seed)
        return optuna.create_study(direction=direction, sampler=sampler)
    if rows is not None:
        names = list(spec.space)

        def row(number: int) -> dict[str, Any]:
            values = table[rows(number)]
            return {k: values[k] for k in names}

        return _LightStudy(direction, row)
    space, rng = distributions(spec), np.random.default_rng(seed)
    return _LightStudy(direction, lambda n: {k: draw(d, rng) for k, d in space.items()})


def table_sampler(
    spec: JobSpec, table: Sequence[Mapping[str, Any]], rows: RowDraw, seed: int
) -> optuna.samplers.BaseSampler:
    """Where a table's rows come from: the seeded permutation (:class:`TableSampler`); for
    the ``mf-tpe`` sampler (rows drawn without replacement), the model's choice among the
    rows not tried yet. It scores rows by their hyperparameters only; the curves of rows
    not tried are never read, so it learns what random search would see."""
    if spec.sampler.name == "mf-tpe" and not rows.replace:
        options = {k: v for k, v in spec.sampler.options.items() if k != "candidates"}
        return MultiFidelityTpeSampler(seed=seed, candidates=table, **options)
    return TableSampler(table, rows)


def fit_to_table(spec: JobSpec, size: int) -> JobSpec:
    """The job with ``max_trials`` capped at the table's size, or a SpecError if it needs more."""
    s = spec.scheduler
    if isinstance(s, PbtSpec):
        raise SpecError(
            "scheduler: pbt perturbs configurations, which a finite table cannot look up; "
            "use the surrogate (lcbench:TASK_ID)"
        )
    if isinstance(s, ShaSpec):
        if s.max_trials is not None and s.max_trials > size:
            raise SpecError(
                f"scheduler.max_trials: {s.max_trials} exceeds the table's {size} configurations"
            )
        return spec
    if isinstance(s, AshaSpec | BloomSpec | FifoSpec | MedianSpec) and (
        s.max_trials is None or s.max_trials > size
    ):
        return spec.model_copy(update={"scheduler": s.model_copy(update={"max_trials": size})})
    return spec
