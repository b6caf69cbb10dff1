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
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy
from filelock import FileLock

from planners.spec import SpecError


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI; None for other stores."""
    prefix = "sqlite:///"
    return Path(uri.removeprefix(prefix)) if uri.startswith(prefix) else None


def local_uri(uri: str) -> str:
    """Make a relative ``sqlite:///path`` absolute (and its folder exist), so that every
    worker process resolves the same file whatever its working directory."""
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
        url = sqlalchemy.engine.make_url(uri)
        url.get_dialect()
    except (sqlalchemy.exc.ArgumentError, sqlalchemy.exc.NoSuchModuleError):
        raise SpecError(
            f"{field}: {uri!r} is not a database URL (e.g. sqlite:///.elastune/optuna.db)"
        ) from None
    check_folder(uri, field)


def check_folder(uri: str, field: str) -> None:
    """Bad input when an absolute SQLite path's folder does not exist: a typo (a relative
    path gets its folder made, :func:`local_uri`)."""
    path = sqlite_path(uri)
    if path is not None and path.is_absolute() and not path.parent.is_dir():
        raise SpecError(f"{field}: folder {path.parent} does not exist")


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
