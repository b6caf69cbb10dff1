"""The two pool backends, by name: ``local`` (limit only) and ``ecs`` (limit and EC2 capacity).

Example (needs a Prefect server with a process pool ``local-proc`` and a worker)::

    from infra.backends import make_backend
    from infra.sizing import publish_sizing

    backend = make_backend("local", "local-proc")
    try:
        with backend:  # releases on any exit
            for stage in plan.stages:
                backend.size(stage.name, slots=stage.trials, gpus_per_trial=stage.gpus_per_trial)
                backend.wait_ready()
                ...  # run the stage's segments
    finally:
        publish_sizing(backend.records)
"""

from __future__ import annotations

from typing import Any

from prefect_aws import AwsCredentials

from infra.ecs import EcsCapacity
from infra.pools import WorkPoolLimit
from infra.sizing import PoolBackend

BACKENDS = ("local", "ecs")


def local_backend(pool: str, pool_type: str = "process") -> PoolBackend:
    """Sizes only the Prefect limit of ``pool``, which must have type ``pool_type``."""
    return PoolBackend("local", [WorkPoolLimit(pool, pool_type)])


def ecs_backend(
    pool: str,
    cluster: str,
    capacity_providers: list[str] | None = None,
    credentials: AwsCredentials | str | None = None,
    region: str | None = None,
) -> PoolBackend:
    """Sizes the EC2 capacity of ``cluster`` and the limit of the ``ecs`` pool ``pool``."""
    capacity = EcsCapacity(cluster, capacity_providers, credentials, region)
    return PoolBackend("ecs", [capacity, WorkPoolLimit(pool, "ecs")])


def make_backend(kind: str, pool: str, **options: Any) -> PoolBackend:
    """``local_backend`` or ``ecs_backend`` by name; ``options`` go to that function."""
    if kind == "local":
        return local_backend(pool, **options)
    if kind == "ecs":
        return ecs_backend(pool, **options)
    raise ValueError(f"backend must be one of {BACKENDS}, got {kind!r}")
