"""Where elastune keeps what it makes once per machine and reuses: ``$ELASTUNE_CACHE``, else
``~/.cache/elastune`` (LCBench tables made from the surrogate, an empty MLflow store, an
empty Optuna database), and how a file there is made once (:func:`made_once`).

Example:
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> made_once(folder / "answer.txt", lambda tmp: tmp.write_text("42")).read_text()
    '42'
    >>> made_once(folder / "answer.txt", lambda tmp: tmp.write_text("43")).read_text()
    '42'
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

__all__ = ["CACHE_ENV", "cache_dir", "made_once"]

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
