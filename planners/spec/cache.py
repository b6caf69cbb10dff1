"""Where elastune keeps what it makes once per machine and reuses: ``$ELASTUNE_CACHE``, else
``~/.cache/elastune`` (LCBench tables made from the surrogate, an empty MLflow store).

Example:
    >>> cache_dir().is_absolute()
    True
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CACHE_ENV", "cache_dir"]

CACHE_ENV = "ELASTUNE_CACHE"


def cache_dir() -> Path:
    """``$ELASTUNE_CACHE``, else ``~/.cache/elastune``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "elastune")
