"""Where elastune keeps what it makes once per machine and reuses: ``$ELASTUNE_CACHE``, else
``~/.cache/elastune`` (LCBench tables made from the surrogate, an empty MLflow store, an
empty Optuna database, an empty Prefect server database), how a file there is made once
(:func:`made_once`), and a new database started as a copy of one (:func:`copy_of_empty`).

Example:
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> made_once(folder / "answer.txt", lambda tmp: tmp.write_text("42")).read_text()
    '42'
    >>> made_once(folder / "answer.txt", lambda tmp: tmp.write_text("43")).read_text()
    '42'
    >>> shutil.rmtree(folder)
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

__all__ = ["CACHE_ENV", "cache_dir", "copy_of_empty", "made_once"]

CACHE_ENV = "ELASTUNE_CACHE"


def cache_dir() -> Path:
    """``$ELASTUNE_CACHE``, else ``~/.cache/elastune``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "elastune")


def made_once(target: Path, make: Callable[[Path], None]) -> Path:
    """``target``, made by ``make`` the first time it is asked for: written beside it, then
    renamed, under a lock, so that a killed maker never leaves a partial file and two
    processes asking at once make it once (the second waits, then finds it)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{target}.lock"):
        if not target.exists():
            # Makers hold the lock, so the process id keeps the name to one of them.
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            try:
                make(tmp)
                tmp.replace(target)
            finally:
                tmp.unlink(missing_ok=True)
    return target


def copy_of_empty(database: Path, empty: str, make: Callable[[Path], None]) -> None:
    """Start the SQLite database ``database``, unless it exists, as a copy of ``empty``: a
    database that ``make`` writes once per machine in the cache, with a library's schema and
    nothing else.
    The libraries make a schema slowly (MLflow runs every migration since its first, about
    1 s; Optuna creates its tables and stamps them through Alembic, about 0.2 s; a Prefect
    server migrates a new database for ~12 s), each time a new one is started. Where the
    cache cannot be written, the library makes the database as it would."""
    if database.exists():
        return
    try:
        shutil.copyfile(made_once(cache_dir() / empty, make), database)
    except OSError:
        database.unlink(missing_ok=True)
