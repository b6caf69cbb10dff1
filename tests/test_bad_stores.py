"""Bad stores: a store URI that cannot be opened is bad input naming its field or flag,
exit code 2, with nothing created or changed: no folder, database or lock file, and no
schema written into a file that is there."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest
import yaml

from elastune.flows.cli import main
from elastune.planners.spec import SpecError
from elastune.tasks.stores import check_sqlite_file, sqlite_tables
from tests.helpers.jobs import GOOD


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp_path`` as the working directory, holding the job file: relative stores (and
    the default ones) land there, where :func:`snapshot` sees them."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(GOOD))
    return tmp_path


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` with a file's bytes (None for a folder)."""
    return {
        str(path.relative_to(folder)): None if path.is_dir() else path.read_bytes()
        for path in sorted(folder.rglob("*"))
    }


def assert_rejected(capsys, args: list[str], field: str, folder: Path) -> str:
    """``elastune ARGS`` is bad input naming ``field`` and leaves ``folder`` as it was."""
    before = snapshot(folder)
    code = main(args)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith(f"error: {field}"), err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert snapshot(folder) == before
    return err


def run_with(folder: Path, key: str, uri: str) -> list[str]:
    """``elastune run`` with tracking ``key`` set to ``uri``, the other store in ``folder``."""
    stores = {
        "mlflow_uri": f"sqlite:///{folder}/mlflow.db",
        "optuna_storage": f"sqlite:///{folder}/optuna.db",
        key: uri,
    }
    sets = [arg for k, v in stores.items() for arg in ("--set", f"tracking.{k}={v}")]
    return ["run", str(folder / "job.yaml"), *sets]


@pytest.mark.parametrize(
    "storage", [None, "sqlite:///sub/deeper/x.db"], ids=["default storage", "relative path"]
)
def test_resume_unknown_job_makes_no_folder(storage, folder, capsys) -> None:
    args = ["resume", "nosuchjob"] + ([] if storage is None else ["--storage", storage])
    err = assert_rejected(capsys, args, "job id", folder)
    assert "no such database" in err
    assert sorted(p.name for p in folder.iterdir()) == ["job.yaml"]


def test_resume_in_a_database_without_optuna_writes_nothing(folder, capsys) -> None:
    """An empty file (an empty SQLite database) and another program's database hold no
    job; Optuna would write its schema into them."""
    (folder / "empty.db").touch()
    with sqlite3.connect(folder / "other.db") as other:
        other.execute("CREATE TABLE notes (text TEXT)")
    other.close()
    for name, field, said in [
        ("empty.db", "job id", "no job 'nosuchjob'"),
        ("other.db", "--storage", "other.db is another program's database (tables notes;"),
    ]:
        args = ["resume", "nosuchjob", "--storage", f"sqlite:///{folder}/{name}"]
        err = assert_rejected(capsys, args, field, folder)
        assert said in err
    assert (folder / "empty.db").stat().st_size == 0


def not_a_database(folder: Path) -> Path:
    path = folder / "notdb.db"
    path.write_text("hello\n")
    return path


def test_resume_from_a_file_that_is_not_a_database(folder, capsys) -> None:
    path = not_a_database(folder)
    err = assert_rejected(
        capsys, ["resume", "x", "--storage", f"sqlite:///{path}"], "--storage", folder
    )
    assert str(path) in err and "not a SQLite database" in err


@pytest.mark.parametrize("key", ["optuna_storage", "mlflow_uri"])
@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
def test_run_with_a_store_that_is_not_a_database(key, relative, folder, capsys) -> None:
    path = not_a_database(folder)
    uri = "sqlite:///notdb.db" if relative else f"sqlite:///{path}"
    err = assert_rejected(capsys, run_with(folder, key, uri), f"tracking.{key}", folder)
    assert "notdb.db is not a SQLite database" in err


@pytest.mark.parametrize("key", ["optuna_storage", "mlflow_uri"])
def test_run_with_a_folder_for_a_store(key, folder, capsys) -> None:
    (folder / "d.db").mkdir()
    err = assert_rejected(
        capsys, run_with(folder, key, "sqlite:///d.db"), f"tracking.{key}", folder
    )
    assert "is a folder" in err


POSTGRES = "postgresql://localhost:1/x"


@pytest.fixture
def no_psycopg2(monkeypatch) -> None:
    """PostgreSQL's driver as if it were not installed (the cluster extra installs it)."""
    for name in [m for m in sys.modules if m == "psycopg2" or m.startswith("psycopg2.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "psycopg2", None)  # its import now fails


@pytest.mark.usefixtures("no_psycopg2")
@pytest.mark.parametrize("key", ["optuna_storage", "mlflow_uri"])
def test_run_with_a_database_driver_not_installed(key, folder, capsys) -> None:
    err = assert_rejected(capsys, run_with(folder, key, POSTGRES), f"tracking.{key}", folder)
    assert err.endswith(
        "postgresql needs a database driver that is not installed (psycopg2): "
        "pip install psycopg2-binary"
    ), err


@pytest.mark.usefixtures("no_psycopg2")
def test_resume_with_a_database_driver_not_installed(folder, capsys) -> None:
    err = assert_rejected(capsys, ["resume", "x", "--storage", POSTGRES], "--storage", folder)
    assert "(psycopg2)" in err


def test_a_journal_left_to_roll_back_is_no_bad_input(tmp_path) -> None:
    """A driver killed mid-write leaves a journal that a read-only connection cannot roll
    back: the check must pass such a database on to Optuna, whose connection rolls it back,
    since resuming after such a kill is what ``resume`` is for."""
    import optuna

    from elastune.flows.stored_job import stored_job

    storage = f"sqlite:///{tmp_path}/optuna.db"
    optuna.create_study(study_name="x", storage=storage)
    db = sqlite3.connect(tmp_path / "optuna.db", isolation_level=None)
    db.execute("PRAGMA cache_size = 1")  # a large write spills to the file mid-transaction
    db.execute("BEGIN")
    db.execute("UPDATE studies SET study_name = 'renamed'")
    db.execute(
        "CREATE TABLE spill AS WITH RECURSIVE n(i) AS "
        "(SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5000) SELECT randomblob(500) FROM n"
    )
    killed = tmp_path / "killed"
    killed.mkdir()
    for name in ("optuna.db", "optuna.db-journal"):  # the files as the kill left them
        shutil.copy(tmp_path / name, killed / name)
    db.execute("ROLLBACK")
    db.close()
    assert sqlite_tables(killed / "optuna.db") is None  # read-only, SQLite cannot tell
    with pytest.raises(SpecError, match="not made by elastune"):  # found study 'x'
        stored_job("x", f"sqlite:///{killed}/optuna.db", "--storage")


@pytest.mark.parametrize("key", ["optuna_storage", "mlflow_uri"])
def test_run_with_another_programs_database_for_a_store(key, folder, capsys) -> None:
    with contextlib.closing(sqlite3.connect(folder / "notes.db")) as other:
        other.execute("CREATE TABLE notes (text)")
        other.commit()
    uri = f"sqlite:///{folder}/notes.db"
    err = assert_rejected(capsys, run_with(folder, key, uri), f"tracking.{key}", folder)
    assert "notes.db is another program's database (tables notes;" in err


@pytest.mark.parametrize("table", ["experiments", "studies"])
def test_a_database_the_other_store_made_may_hold_this_one_too(table, tmp_path) -> None:
    with contextlib.closing(sqlite3.connect(tmp_path / "shared.db")) as shared:
        shared.execute(f"CREATE TABLE {table} (id)")
        shared.commit()
    for field in ("tracking.optuna_storage", "tracking.mlflow_uri"):
        check_sqlite_file(f"sqlite:///{tmp_path}/shared.db", field)
