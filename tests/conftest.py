"""Test isolation: Prefect, MLflow, Optuna and LCBench never touch the user's own stores."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Prefect reads its settings at import, so isolate its home before anything imports it
# (cache records in $PREFECT_HOME outlive databases: docs/stack.md §2).
_HOME = tempfile.mkdtemp(prefix="elastune-prefect-")
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)
os.environ["PREFECT_HOME"] = _HOME
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "120"
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
os.environ.pop("PREFECT_API_URL", None)
# LCBench: the shipped surrogate, not a folder the user named; its tables are made once per
# session into a temporary cache (one task takes about half a second).
os.environ.pop("ELASTUNE_BENCHMARKS", None)
os.environ["ELASTUNE_CACHE"] = tempfile.mkdtemp(prefix="elastune-cache-")
atexit.register(shutil.rmtree, os.environ["ELASTUNE_CACHE"], ignore_errors=True)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# One real `prefect server` for the whole session, shared by every module that asks for it;
# AWS under moto for the modules that ask for it.
pytest_plugins = ["tests.helpers.prefect_server", "tests.helpers.aws"]


@pytest.fixture(scope="session", autouse=True)
def fork_server() -> None:
    """Local jobs' workers fork from a fork server (tasks/worker_processes.py), which this process
    starts once, importing torch and elastune: started here, its seconds never fall inside a
    test's job (a short deadline would pass in them)."""
    from elastune.tasks.worker_processes import warm_fork_server

    warm_fork_server()


@pytest.fixture
def stores(tmp_path: Path) -> list[str]:
    """``--set`` arguments that put MLflow and Optuna under ``tmp_path``."""
    return [
        "--set",
        f"tracking.mlflow_uri=sqlite:///{tmp_path}/mlflow.db",
        "--set",
        f"tracking.optuna_storage=sqlite:///{tmp_path}/optuna.db",
    ]


def store_listing(folder: Path) -> set[str]:
    """MLflow experiments (active and deleted) and Optuna studies in the SQLite stores
    under ``folder``; a store that does not exist lists nothing (and is not created)."""
    import optuna
    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    listing: set[str] = set()
    for database in sorted(folder.rglob("*.db")):
        uri = f"sqlite:///{database}"
        if database.name.startswith("mlflow"):
            found = MlflowClient(uri).search_experiments(view_type=ViewType.ALL)
            listing |= {f"{database}: experiment {e.name} ({e.lifecycle_stage})" for e in found}
        else:
            listing |= {f"{database}: study {name}" for name in optuna.get_all_study_names(uri)}
    return listing


class StoreListing:
    """What the stores under a test's folder held when :meth:`take` was last called."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.take()

    def take(self) -> None:
        self.before = store_listing(self.folder)


@pytest.fixture
def unchanged_stores(tmp_path: Path) -> Iterator[StoreListing]:
    """Asserts the test leaves nothing new in MLflow or Optuna under ``tmp_path``; a test
    that fills a store itself first calls ``take()`` after doing so."""
    listing = StoreListing(tmp_path)
    yield listing
    new = store_listing(tmp_path) - listing.before
    assert not new, f"left behind: {sorted(new)}"
