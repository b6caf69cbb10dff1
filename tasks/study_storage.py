"""A job's Optuna study as its driver keeps it: every write goes to the database at once,
and the study's trials are read back from memory.

Why: Optuna's cached database storage reads every unfinished trial back from the
database each time a study's trials are read, since another process may have written it,
and ``study.ask`` reads them two or three times. A trial paused at a rung stays RUNNING,
so a new trial cost the driver time in proportion to the trials paused (0.15 s beside
100 of them on SQLite, 0.93 s beside 1000: docs/benchmarks.md). Only a job's driver
writes its study (a resumed job's driver takes over from one that died), so what the
driver wrote is what the database holds, and its trials need not be read back.

Example:
    >>> import optuna
    >>> storage = driver_storage("sqlite://")
    >>> study = optuna.create_study(storage=storage)
    >>> trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    >>> trial.report(0.5, step=1)
    >>> stored = storage.get_all_trials(study._study_id)[0]
    >>> stored.intermediate_values, stored.state.name
    ({1: 0.5}, 'RUNNING')
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Container, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.storages import BaseStorage, RDBStorage
from optuna.study import StudyDirection
from optuna.study._frozen import FrozenStudy
from optuna.trial import FrozenTrial, TrialState

from elastune.planners.spec.cache import copy_of_empty
from elastune.tasks.stores import sqlite_path


def driver_storage(url: str) -> SoleWriterStorage:
    """The database at ``url`` (a SQLAlchemy URL) as a job's driver uses it; a new SQLite
    file starts as a copy of an empty one Optuna made on this machine (``copy_of_empty``;
    in a job's command, on a slow day here: 0.23-0.28 s for Optuna to make one, 0.03-0.06 s
    to open the copy)."""
    database = sqlite_path(url)
    if database is not None:
        copy_of_empty(database, f"optuna-{optuna.__version__}-empty.db", _make_empty)
    return SoleWriterStorage(RDBStorage(url))


def _make_empty(database: Path) -> None:
    """An Optuna database with its schema and no study, at ``database``."""
    RDBStorage(f"sqlite:///{database}").engine.dispose()  # closed before it is renamed


class SoleWriterStorage(BaseStorage):
    """``backend`` (e.g. an ``RDBStorage``), its studies' trials held in memory as this
    process writes them (module docstring). A study's trials are read from ``backend``
    once, when first asked for; trials another process writes afterwards are not seen.
    """

    def __init__(self, backend: BaseStorage):
        self.backend = backend
        self._lock = threading.Lock()
        self._trials: dict[int, dict[int, FrozenTrial]] = {}  # study -> number -> trial
        self._where: dict[int, tuple[int, int]] = {}  # trial id -> (study, number)
        self._directions: dict[int, list[StudyDirection]] = {}

    # --- studies: the backend's ----------------------------------------------------------

    def create_new_study(
        self, directions: Sequence[StudyDirection], study_name: str | None = None
    ) -> int:
        return self.backend.create_new_study(directions, study_name)

    def delete_study(self, study_id: int) -> None:
        self.backend.delete_study(study_id)
        with self._lock:
            for trial in self._trials.pop(study_id, {}).values():
                self._where.pop(trial._trial_id, None)
            self._directions.pop(study_id, None)

    def set_study_user_attr(self, study_id: int, key: str, value: Any) -> None:
        self.backend.set_study_user_attr(study_id, key, value)

    def set_study_system_attr(self, study_id: int, key: str, value: Any) -> None:
        self.backend.set_study_system_attr(study_id, key, value)

    def get_study_id_from_name(self, study_name: str) -> int:
        return self.backend.get_study_id_from_name(study_name)

    def get_study_name_from_id(self, study_id: int) -> str:
        return self.backend.get_study_name_from_id(study_id)

    def get_study_directions(self, study_id: int) -> list[StudyDirection]:
        # Fixed when the study is made; samplers read them at every trial.
        if study_id not in self._directions:
            self._directions[study_id] = self.backend.get_study_directions(study_id)
        return self._directions[study_id]

    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        return self.backend.get_study_user_attrs(study_id)

    def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
        return self.backend.get_study_system_attrs(study_id)

    def get_all_studies(self) -> list[FrozenStudy]:
        return self.backend.get_all_studies()

    # --- trials: written through, read from memory ---------------------------------------

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        trial_id = self.backend.create_new_trial(study_id, template_trial)
        self._load(study_id)
        trial = self.backend.get_trial(trial_id)
        with self._lock:
            self._keep(study_id, trial)
        return trial_id

    def set_trial_param(
        self,
        trial_id: int,
        param_name: str,
        param_value_internal: float,
        distribution: BaseDistribution,
    ) -> None:
        self.backend.set_trial_param(trial_id, param_name, param_value_internal, distribution)
        trial = self._copy(trial_id)
        value = distribution.to_external_repr(param_value_internal)
        trial.params = {**trial.params, param_name: value}
        trial.distributions = {**trial.distributions, param_name: distribution}
        self._put(trial)

    def set_trial_state_values(
        self, trial_id: int, state: TrialState, values: Sequence[float] | None = None
    ) -> bool:
        changed = self.backend.set_trial_state_values(trial_id, state, values)
        # Read back: the database stamps the start and end times.
        self._put(self.backend.get_trial(trial_id))
        return changed

    def set_trial_intermediate_value(
        self, trial_id: int, step: int, intermediate_value: float
    ) -> None:
        self.backend.set_trial_intermediate_value(trial_id, step, intermediate_value)
        trial = self._copy(trial_id)
        trial.intermediate_values = {**trial.intermediate_values, step: intermediate_value}
        self._put(trial)

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        self.backend.set_trial_user_attr(trial_id, key, value)
        trial = self._copy(trial_id)
        trial.user_attrs = {**trial.user_attrs, key: value}
        self._put(trial)

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        self.backend.set_trial_system_attr(trial_id, key, value)
        trial = self._copy(trial_id)
        trial.system_attrs = {**trial.system_attrs, key: value}
        self._put(trial)

    def get_trial(self, trial_id: int) -> FrozenTrial:
        with self._lock:
            where = self._where.get(trial_id)
            if where is not None:
                return self._trials[where[0]][where[1]]
        return self.backend.get_trial(trial_id)

    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        self._load(study_id)
        with self._lock:
            trial = self._trials[study_id].get(trial_number)
        if trial is None:
            return self.backend.get_trial_id_from_study_id_trial_number(study_id, trial_number)
        return trial._trial_id

    def get_all_trials(
        self,
        study_id: int,
        deepcopy: bool = True,
        states: Container[TrialState] | None = None,
    ) -> list[FrozenTrial]:
        self._load(study_id)
        with self._lock:
            trials = [
                trial
                for _, trial in sorted(self._trials[study_id].items())
                if states is None or trial.state in states
            ]
        return copy.deepcopy(trials) if deepcopy else trials

    # --- the cache -----------------------------------------------------------------------

    def _load(self, study_id: int) -> None:
        """Read ``study_id``'s trials from the backend, the first time only."""
        if study_id in self._trials:
            return
        trials = self.backend.get_all_trials(study_id, deepcopy=False)
        with self._lock:
            if study_id not in self._trials:
                self._trials[study_id] = {}
                for trial in trials:
                    self._keep(study_id, trial)

    def _keep(self, study_id: int, trial: FrozenTrial) -> None:
        """Hold ``trial`` (the caller holds the lock)."""
        self._trials[study_id][trial.number] = trial
        self._where[trial._trial_id] = (study_id, trial.number)

    def _copy(self, trial_id: int) -> FrozenTrial:
        """A shallow copy to change: lists already handed out keep the trial as it was."""
        return copy.copy(self.get_trial(trial_id))

    def _put(self, trial: FrozenTrial) -> None:
        with self._lock:
            where = self._where.get(trial._trial_id)
            if where is not None:
                self._trials[where[0]][where[1]] = trial
