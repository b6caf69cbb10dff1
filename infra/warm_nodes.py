"""The nodes of a warm pool as Prefect's server sees them: which live (their heartbeats as
Prefect workers are fresh), which are busy (a warm run tagged with the node is unfinished)
and which are draining (they finish their runs but get no new segment, because their
instances are to go: ``elastune.infra.ecs_warm``'s drain). The draining nodes are a Prefect variable
per pool, so every driver using the pool sees them. The node's own side is
:mod:`elastune.flows.segment`.

Example (a node's worker name, and back):
    >>> node = Node("node-0", 2.0, 4242)
    >>> node.worker_name, Node.parse(node.worker_name) == node
    ('node-0/2/4242', True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.filters import (
    TaskRunFilter,
    TaskRunFilterState,
    TaskRunFilterStateType,
    TaskRunFilterTags,
)
from prefect.client.schemas.objects import StateType, TaskRun
from prefect.variables import Variable

WARM_TYPE = "elastune-warm"  # work-pool type of a cluster of warm node workers
HEARTBEAT_SECONDS = 1  # a node is dead once 3 heartbeats are missed (Prefect's own rule)
# A node whose last heartbeat is older is dead: Prefect's 3 missed beats, plus slack for a
# busy machine.
LIVE_SECONDS = 3 * HEARTBEAT_SECONDS + 2.0


@dataclass(frozen=True)
class Node:
    """A warm worker: its node's name, the GPUs (CPU slots) it offers, its process id (a
    restarted worker is a new incarnation: what the dead one ran is lost) and, as the
    server tells it, when it first beat (no run that began earlier can be its)."""

    name: str
    gpus: float
    pid: int
    since: datetime | None = field(default=None, compare=False)

    @property
    def worker_name(self) -> str:
        return f"{self.name}/{self.gpus:g}/{self.pid}"

    @classmethod
    def parse(cls, worker_name: str, since: datetime | None = None) -> Node:
        name, gpus, pid = worker_name.rsplit("/", 2)
        return cls(name, float(gpus), int(pid), since)


def live_nodes(pool: str) -> list[Node]:
    """The warm workers of ``pool`` whose heartbeats are fresh (a restarted node may
    briefly show two incarnations)."""
    with get_client(sync_client=True) as client:
        workers = client.read_workers_for_work_pool(pool)
    now = datetime.now(UTC)
    return [
        Node.parse(w.name, w.created)
        for w in workers
        if w.last_heartbeat_time is not None
        and (now - w.last_heartbeat_time).total_seconds() < LIVE_SECONDS
        and w.name.count("/") >= 2
    ]


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
    """Add ``nodes`` to (or take them off) the draining nodes of ``pool``. Adding forgets the
    nodes marked before that no longer live: their instances are gone."""
    now = draining_nodes(pool)
    if draining:
        live = {node.name for node in live_nodes(pool)}
        marked = (now & live) | nodes
    else:
        marked = now - nodes
    Variable.set(draining_variable(pool), sorted(marked), overwrite=True)


def busy_nodes(nodes: set[str]) -> set[str]:
    """Those of ``nodes`` with a warm run not yet finished (each run is tagged with its node)."""
    with get_client(sync_client=True) as client:
        return {node for node in nodes if unfinished_runs(client, f"node:{node}", limit=1)}
