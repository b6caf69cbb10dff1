"""The job file: what a tuning job asks for, validated before anything runs.

The modules, from the bottom up: ``geometry`` (rung ladders and brackets of successive
halving, which the scheduler sections are checked against), ``model`` (the pydantic model:
search space, sampler, scheduler, budget, compute, tracking, profile), ``space`` (the search
space as Optuna distributions, and Optuna samplers by name) and ``load`` (YAML and ``--set``
overrides in, a validated :class:`JobSpec` out).

Example:
    >>> spec = parse_job({"name": "demo", "trainable": "examples.digits:train",
    ...     "metric": "val_accuracy",
    ...     "space": {"width": {"type": "int", "low": 8, "high": 128, "log": True}}})
    >>> spec.scheduler.name, spec.sampler.name, spec.mode
    ('bloom', 'mf-tpe', 'max')
    >>> distributions(spec)["width"]
    IntDistribution(high=128, log=True, low=8, step=1)
    >>> parse_job({"name": "demo"})
    Traceback (most recent call last):
    ...
    elastune.planners.spec.model.SpecError: job: trainable: Field required
"""

from elastune.planners.spec.load import apply_override, load_job, parse_job
from elastune.planners.spec.model import LOCAL_POOL, MAX_WORKERS, EcsSpec, JobSpec, SpecError
from elastune.planners.spec.space import contains, distributions, make_sampler

__all__ = [
    "LOCAL_POOL",
    "MAX_WORKERS",
    "EcsSpec",
    "JobSpec",
    "SpecError",
    "apply_override",
    "contains",
    "distributions",
    "load_job",
    "make_sampler",
    "parse_job",
]
