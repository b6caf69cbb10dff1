"""The Prefect side of a pool: its type, its concurrency limit and its workers.

The limit is how a plan "sizes" a work pool (docs/stack.md §2): at most that many flow runs of
the pool run at once, so a stage of ``n`` concurrent segments sets it to ``n``. Every call
goes to the Prefect API named by ``PREFECT_API_URL`` through the synchronous client.
"""

from __future__ import annotations

import time

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolUpdate
from prefect.client.schemas.filters import WorkerFilter, WorkerFilterStatus
from prefect.client.schemas.objects import WorkPool
from prefect.exceptions import ObjectNotFound

from elastune.infra.sizing import (
    RELEASE_STAGE,
    Demand,
    NoWorker,
    PoolNotFound,
    PoolTypeMismatch,
    Sizer,
    SizingRecord,
)


def read_pool(name: str, pool_type: str | None = None) -> WorkPool:
    """The work pool ``name``; raises :class:`PoolNotFound` or :class:`PoolTypeMismatch`."""
    with get_client(sync_client=True) as client:
        try:
            pool = client.read_work_pool(name)
        except ObjectNotFound:
            raise PoolNotFound(
                f"work pool {name!r} not found on the Prefect server; create it with "
                f"`prefect work-pool create {name} --type {pool_type or 'process'}`"
            ) from None
    if pool_type is not None and pool.type != pool_type:
        raise PoolTypeMismatch(
            f"work pool {name!r} has type {pool.type!r}, but this backend needs {pool_type!r}"
        )
    return pool


def set_pool_limit(name: str, limit: int | None) -> None:
    """Set (``None``: remove) the concurrency limit of work pool ``name``."""
    with get_client(sync_client=True) as client:
        try:
            client.update_work_pool(name, WorkPoolUpdate(concurrency_limit=limit))
        except ObjectNotFound:
            raise PoolNotFound(f"work pool {name!r} not found on the Prefect server") from None


def wait_for_worker(pool: str, timeout: float = 30.0, poll: float = 1.0) -> str:
    """Name of an online worker polling ``pool``; :class:`NoWorker` after ``timeout`` s.

    A worker is ONLINE while its heartbeats reach the server, so this tells whether flow
    runs sent to the pool will be picked up at all.
    """
    if timeout < 0:
        raise ValueError(f"timeout must be >= 0, got {timeout}")
    deadline = time.monotonic() + timeout
    pool_type = read_pool(pool).type
    online = WorkerFilter(status=WorkerFilterStatus(any_=["ONLINE"]))
    with get_client(sync_client=True) as client:
        while True:
            workers = client.read_workers_for_work_pool(pool, worker_filter=online)
            if workers:
                return workers[0].name
            if time.monotonic() >= deadline:
                raise NoWorker(
                    f"no worker polled work pool {pool!r} within {timeout:g} s; start one with "
                    f"`prefect worker start --pool {pool} --type {pool_type}`"
                )
            time.sleep(min(poll, max(0.0, deadline - time.monotonic())))


class WorkPoolLimit(Sizer):
    """Sets the pool's concurrency limit to each stage's slots; restores the old one at release.

    The limit in place before the job is restored (not zeroed) at release: a local pool is
    usually shared with ad hoc runs, and capacity, the costly part, is released elsewhere.
    """

    def __init__(self, pool: str, pool_type: str | None = "process") -> None:
        self.pool = pool
        self.pool_type = pool_type
        self._original: int | None = None
        self._current: int | None = None
        self._touched = False

    def check(self) -> None:
        read_pool(self.pool, self.pool_type)

    def size(self, demand: Demand) -> list[SizingRecord]:
        before = read_pool(self.pool, self.pool_type).concurrency_limit
        if not self._touched:
            self._original, self._touched = before, True
        set_pool_limit(self.pool, demand.slots)
        self._current = demand.slots
        detail = f"{demand.slots} concurrent segments"
        if demand.gpus_per_trial:
            detail += f" x {demand.gpus_per_trial:g} GPUs"
        return [
            SizingRecord(
                demand.stage,
                f"work-pool {self.pool}",
                "concurrency_limit",
                before,
                demand.slots,
                detail,
            )
        ]

    def release(self) -> list[SizingRecord]:
        if not self._touched:
            return []
        set_pool_limit(self.pool, self._original)
        record = SizingRecord(
            RELEASE_STAGE,
            f"work-pool {self.pool}",
            "concurrency_limit",
            self._current,
            self._original,
            "restored the limit the pool had before the job",
        )
        self._touched = False
        return [record]
