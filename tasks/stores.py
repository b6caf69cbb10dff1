"""The stores' addresses, without MLflow or Prefect (quick to import: the command line
checks them before anything slow starts). Any SQLAlchemy URL works; SQLite paths get
resolved and guarded.

Example:
    >>> sqlite_path("sqlite:///.elastune/optuna.db").name
    'optuna.db'
    >>> sqlite_path("postgresql://db/optuna") is None
    True
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy
from filelock import FileLock

from elastune.planners.spec import SpecError


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI; None for other stores."""
    prefix = "sqlite:///"
    return Path(uri.removeprefix(prefix)) if uri.startswith(prefix) else None


def local_uri(uri: str) -> str:
    """Make a relative ``sqlite:///path`` absolute (and its folder exist), so that every
    worker process resolves the same file whatever its working directory. Not for checks:
    bad input must leave no folder behind."""
    path = sqlite_path(uri)
    if path is None or path.is_absolute():
        return uri
    path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def check_storage(uri: str, field: str) -> None:
    """Bad input unless ``uri`` is a database URL Optuna can open: found before the job
    creates anything, so that a typo never leaves half a job in the other store."""
    try:
        sqlalchemy.engine.make_url(uri).get_dialect()
    except (sqlalchemy.exc.ArgumentError, sqlalchemy.exc.NoSuchModuleError):
        raise SpecError(
            f"{field}: {uri!r} is not a database URL (e.g. sqlite:///.elastune/optuna.db)"
        ) from None
    check_database(uri, field)


def check_database(uri: str, field: str) -> None:
    """Bad input unless the database at SQLAlchemy URL ``uri`` can be opened as far as can
    be told without a connection: its driver installed, and for SQLite its folder there and
    the file, if any, a database. Reads only, so a check creates and changes nothing."""
    check_driver(uri, field)
    check_folder(uri, field)
    check_sqlite_file(uri, field)


# The pip package of a database driver, where its module is named otherwise.
DRIVER_PACKAGES = {"psycopg2": "psycopg2-binary", "MySQLdb": "mysqlclient"}


def check_driver(uri: str, field: str) -> None:
    """Bad input when the DB-API module of ``uri``'s dialect is not installed: SQLAlchemy
    imports it only when the store first connects, inside the running job."""
    url = sqlalchemy.engine.make_url(uri)
    try:
        url.get_dialect().import_dbapi()
    except ImportError as exc:
        module = (exc.name or url.get_driver_name()).split(".")[0]
        package = DRIVER_PACKAGES.get(module, module)
        raise SpecError(
            f"{field}: {url.get_backend_name()} needs a database driver that is not "
            f"installed ({module}): pip install {package}"
        ) from None


def check_folder(uri: str, field: str) -> None:
    """Bad input when an absolute SQLite path's folder does not exist: a typo (a relative
    path gets its folder made, :func:`local_uri`)."""
    path = sqlite_path(uri)
    if path is not None and path.is_absolute() and not path.parent.is_dir():
        raise SpecError(f"{field}: folder {path.parent} does not exist")


# A table each store's schema has: a database with either is a store's (the two stores
# may share a file); one with tables but neither would get a store's schema written in.
MLFLOW_TABLE, OPTUNA_TABLE = "experiments", "studies"


def check_sqlite_file(uri: str, field: str) -> None:
    """Bad input when a SQLite URI names a file that is there but is not a database (or a
    folder): the store would fail inside the job, after the other store was written; or
    is another program's database, which the store would write its schema into."""
    path = sqlite_path(uri)
    if path is None or not path.exists():
        return
    if path.is_dir():
        raise SpecError(f"{field}: {path} is a folder, not a SQLite database")
    try:
        tables = sqlite_tables(path)
    except sqlite3.DatabaseError as exc:
        raise SpecError(f"{field}: {path} is not a SQLite database ({exc})") from None
    if tables and tables.isdisjoint({MLFLOW_TABLE, OPTUNA_TABLE}):
        shown = ", ".join(sorted(tables)[:3]) + (", ..." if len(tables) > 3 else "")
        raise SpecError(
            f"{field}: {path} is another program's database (tables {shown}; no MLflow or "
            "Optuna tables)"
        )


def sqlite_tables(path: Path) -> set[str] | None:
    """The tables of the SQLite database ``path``, opened read-only: it is neither created
    nor written, not even an empty file (which SQLite takes for an empty database, and
    Optuna or MLflow would write their schema into). None where a read-only connection
    cannot tell but the store's own can: a journal that a killed writer left to roll back,
    a lock held past the timeout. Raises ``sqlite3.DatabaseError`` for a file that is not
    a database or is damaged."""
    read_only = f"{path.resolve().as_uri()}?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(read_only, uri=True)) as connection:
            query = "SELECT name FROM sqlite_master WHERE type = 'table'"
            rows = connection.execute(query).fetchall()
    except sqlite3.DatabaseError as exc:
        if (exc.sqlite_errorname or "").startswith(("SQLITE_NOTADB", "SQLITE_CORRUPT")):
            raise
        return None
    return {name for (name,) in rows}


@contextlib.contextmanager
def first_use(uri: str) -> Iterator[None]:
    """Hold a lock beside a SQLite database while connecting to it: MLflow and Optuna
    create (and migrate) the schema on their first connection, and two jobs doing that at
    once on a new file fail ('table ... already exists')."""
    path = sqlite_path(uri)
    if path is None:
        yield
        return
    with FileLock(f"{path}.lock"):
        yield
