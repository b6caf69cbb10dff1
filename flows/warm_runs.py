"""Warm runs on a warm pool's nodes: which are unfinished, which nodes are busy, and which
nodes are draining (they finish their runs but get no new segment, because their instances
are to go: ``infra.ecs_warm``'s drain). The draining nodes are a Prefect variable per pool,
so every driver using the pool sees them.
"""

from __future__ import annotations

from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.filters import (
    TaskRunFilter,
    TaskRunFilterState,
    TaskRunFilterStateType,
    TaskRunFilterTags,
)
from prefect.client.schemas.objects import StateType, TaskRun
from prefect.variables import Variable


def unfinished_runs(client: SyncPrefectClient, tag: str, limit: int | None = None) -> list[TaskRun]:
    """The task runs tagged ``tag`` that are scheduled, pending or running."""
    states = [StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING]
    return client.read_task_runs(
        task_run_filter=TaskRunFilter(
            tags=TaskRunFilterTags(all_=[tag]),
            state=TaskRunFilterState(type=TaskRunFilterStateType(any_=states)),
        ),
        limit=limit,
    )


def draining_variable(pool: str) -> str:
    """The Prefect variable that lists the nodes of ``pool`` being drained."""
    return f"elastune-draining-{pool}"


def draining_nodes(pool: str) -> set[str]:
    """The nodes of ``pool`` that get no new segment: their instances are to go."""
    return set(Variable.get(draining_variable(pool), default=None) or [])


def mark_draining(pool: str, nodes: set[str], draining: bool) -> None:
    """Add ``nodes`` to (or take them off) the draining nodes of ``pool``."""
    now = draining_nodes(pool)
    now = now | nodes if draining else now - nodes
    Variable.set(draining_variable(pool), sorted(now), overwrite=True)


def busy_nodes(nodes: set[str]) -> set[str]:
    """Those of ``nodes`` with a warm run not yet finished (each run is tagged with its node)."""
    with get_client(sync_client=True) as client:
        return {node for node in nodes if unfinished_runs(client, f"node:{node}", limit=1)}
