"""elastune: elastic, cost-aware hyperparameter tuning for deep learning, on Prefect.

The names a user touches, from a script or a notebook::

    import elastune

    summary = elastune.run("job.yaml", ["scheduler.name=asha"])   # as `elastune run --json`
    plan = elastune.plan("job.yaml")                               # as `elastune plan --json`
    spec = elastune.load_job("job.yaml")                           # the validated job file

    def train(config: dict, ctx: elastune.TrialContext) -> None: ...

Bad input raises :class:`SpecError`, its message naming the field. Each name is imported
when first used, so ``import elastune`` costs no Prefect, MLflow or torch import.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from elastune.flows.api import plan, resume, run, simulate
    from elastune.planners.spec import JobSpec, SpecError, load_job, parse_job
    from elastune.tasks.context import TrialContext

__all__ = [
    "JobSpec",
    "SpecError",
    "TrialContext",
    "load_job",
    "parse_job",
    "plan",
    "resume",
    "run",
    "simulate",
]

# The repository's top-level folders, installed as elastune's subpackages.
SUBPACKAGES = ("flows", "tasks", "planners", "infra")

_HOME = {
    "JobSpec": "elastune.planners.spec",
    "SpecError": "elastune.planners.spec",
    "load_job": "elastune.planners.spec",
    "parse_job": "elastune.planners.spec",
    "TrialContext": "elastune.tasks.context",
    "plan": "elastune.flows.api",
    "resume": "elastune.flows.api",
    "run": "elastune.flows.api",
    "simulate": "elastune.flows.api",
}

try:
    __version__ = version("elastune")
except PackageNotFoundError:  # a checkout that was never installed
    __version__ = "0+unknown"


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'elastune' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
