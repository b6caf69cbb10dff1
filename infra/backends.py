"""The two pool backends, by name: ``local`` (limit only) and ``ecs`` (limit and EC2 capacity:
one ECS task per segment, or on a warm pool, warm workers drained before a scale-down).

Example (needs a Prefect server with a process pool ``local-proc`` and a worker)::

    from elastune.infra.backends import make_backend
    from elastune.infra.sizing import publish_sizing

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

from typing import TYPE_CHECKING, Any

from elastune.infra.prefect_pools import WorkPoolLimit
from elastune.infra.sizing import PoolBackend
from elastune.infra.warm_nodes import WARM_TYPE

if TYPE_CHECKING:
    from prefect_aws import AwsCredentials

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
    pool_type: str = "ecs",
) -> PoolBackend:
    """Sizes the EC2 capacity of ``cluster`` and the limit of ``pool``: an ``ecs`` pool (an
    ECS task per segment), or a warm pool whose workers run on the cluster's instances."""
    # boto3 and prefect-aws take 0.4 s to import: a job without ECS never does.
    from elastune.infra.ecs import EcsCapacity
    from elastune.infra.ecs_warm import WarmCapacity

    capacity = EcsCapacity(cluster, capacity_providers, credentials, region)
    if pool_type == WARM_TYPE:
        return PoolBackend("ecs", [WarmCapacity(capacity, pool), WorkPoolLimit(pool, WARM_TYPE)])
    return PoolBackend("ecs", [capacity, WorkPoolLimit(pool, "ecs")])


def make_backend(kind: str, pool: str, **options: Any) -> PoolBackend:
    """``local_backend`` or ``ecs_backend`` by name; ``options`` go to that function."""
    if kind == "local":
        return local_backend(pool, **options)
    if kind == "ecs":
        return ecs_backend(pool, **options)
    raise ValueError(f"backend must be one of {BACKENDS}, got {kind!r}")
