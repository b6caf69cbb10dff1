"""The driver's Optuna storage: writes reach the database at once, and the study's trials
are read from memory, so a new trial costs the same beside 10 or 1000 paused trials."""

from __future__ import annotations

import contextlib
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState

from elastune.tasks.study_storage import SoleWriterStorage, driver_storage

SPACE = {
    "lr": FloatDistribution(1e-4, 0.3, log=True),
    "width": IntDistribution(4, 32),
    "act": CategoricalDistribution(["relu", "tanh"]),
}
FIELDS = (
    "number",
    "state",
    "values",
    "params",
    "distributions",
    "intermediate_values",
    "user_attrs",
    "system_attrs",
    "datetime_start",
    "datetime_complete",
)


def _job(study: optuna.Study, trials: int) -> None:
    """What a job's driver writes: trials asked, tagged, reported, some paused (left
    running), some told, a queued one, the journal on the study. Some writes go to the
    storage directly: an Optuna trial also changes the copy it holds, which may be the
    storage's."""
    study.enqueue_trial({"lr": 0.01, "width": 8, "act": "tanh"})
    for i in range(trials):
        trial = study.ask(SPACE)
        trial.set_user_attr("elastune.trial", i)
        study._storage.set_trial_system_attr(trial._trial_id, "note", [i])
        trial.report(0.1 * i, 1)
        study._storage.set_trial_intermediate_value(trial._trial_id, 2, 0.2 * i)  # not mirrored
        study.set_user_attr(f"journal.{i}", {"trial": i})
        if i % 3 == 0:
            study.tell(trial, 0.5 * i)
        elif i % 3 == 1:
            study.tell(trial, state=TrialState.PRUNED)


def _fields(trial: optuna.trial.FrozenTrial) -> dict[str, object]:
    return {name: getattr(trial, name) for name in FIELDS}


def test_the_trials_in_memory_are_the_trials_in_the_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/optuna.db"
    study = optuna.create_study(study_name="job", storage=driver_storage(url), direction="maximize")
    _job(study, 12)
    held = study.get_trials()
    stored = optuna.load_study(study_name="job", storage=url).get_trials()
    assert [_fields(t) for t in held] == [_fields(t) for t in stored]
    assert {t.state for t in held} == {TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING}
    assert study.best_trial.number == stored[-3].number  # 0.5 * 9: the best told value


def test_a_new_trial_reads_no_other_trial_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paused trials stay RUNNING; Optuna's own cached storage reads every one of them back
    at each ask. The driver's storage reads the study's trials once, then only the trial it
    has just created or ended."""
    backend = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/optuna.db")
    study = optuna.create_study(study_name="job", storage=SoleWriterStorage(backend))
    _job(study, 30)
    listed, read = [], []
    monkeypatch.setattr(backend, "get_all_trials", lambda *a, **k: listed.append(a) or [])
    real_get_trial = backend.get_trial
    monkeypatch.setattr(backend, "get_trial", lambda i: read.append(i) or real_get_trial(i))
    for _ in range(5):
        trial = study.ask(SPACE)
        trial.report(1.0, 1)
        study.tell(trial, 1.0)
    assert listed == []
    assert len(set(read)) == 5  # each new trial once when made, once when told
    assert len(study.trials) == 35  # the queued trial was the first asked


def test_a_resumed_driver_reads_what_its_predecessor_wrote(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/optuna.db"
    _job(optuna.create_study(study_name="job", storage=driver_storage(url)), 6)
    resumed = optuna.load_study(study_name="job", storage=driver_storage(url))
    running = resumed.get_trials(states=(TrialState.RUNNING,))
    assert [t.user_attrs["elastune.trial"] for t in running] == [2, 5]
    resumed.tell(running[0].number, 3.0)
    fresh = optuna.load_study(study_name="job", storage=url)
    assert fresh.trials[running[0].number].value == 3.0
    with pytest.raises(ValueError, match="Cannot tell a COMPLETE trial"):
        resumed.tell(running[0].number, 4.0)  # Optuna's own check, on the state held


def test_a_new_study_database_is_optunas_empty_schema_made_once_per_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new SQLite study database starts from the cache's empty copy: Optuna makes its
    schema once, not per job; the copy has the schema Optuna makes itself and no study, and
    a job's study works in it."""
    import sqlite3

    from elastune.tasks import study_storage

    monkeypatch.setenv("ELASTUNE_CACHE", str(tmp_path / "cache"))
    made = []
    make = study_storage._make_empty
    monkeypatch.setattr(study_storage, "_make_empty", lambda d: made.append(make(d)))

    def schema(database: Path) -> list[tuple[str, str]]:
        """Every table and index as SQLite records the statement that made it."""
        with contextlib.closing(sqlite3.connect(database)) as connection:
            return sorted(connection.execute("select name, sql from sqlite_master"))

    first, second = (driver_storage(f"sqlite:///{tmp_path}/{n}.db") for n in "ab")
    assert len(made) == 1  # the cache's copy; both databases are copies of it
    optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/own.db")  # Optuna's own
    assert schema(tmp_path / "b.db") == schema(tmp_path / "own.db")
    assert optuna.get_all_study_names(second) == []
    study = optuna.create_study(study_name="job", storage=first, direction="maximize")
    study.tell(study.ask(SPACE), 0.5)
    reread = optuna.load_study(study_name="job", storage=f"sqlite:///{tmp_path}/a.db")
    assert [t.value for t in reread.trials] == [0.5]
