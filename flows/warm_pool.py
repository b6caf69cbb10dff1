"""Warm pools (type ``elastune-warm``): each segment is a background task run sent to the
warm worker of the node it is placed on (docs/prefect-server.md, "A job in work-pool
mode"; the node's side is :mod:`elastune.flows.segment`).

The driver places a segment, best fit, on a live node with room for its GPUs, or when no
node has room, in the queue of one (a node holds as many GPUs' worth again, and trains them
as the segments ahead end: the next segment starts without the driver's round trip)
(:class:`Placer`), sends it under the node's task key, waits for the run's end event and
reads the report from MLflow, in a thread of its own (:meth:`WarmPool.submit`). That warm
run is the segment's only task run. A node is live while its heartbeats are fresh; a
segment whose node died is marked Crashed and launched again on a live node (at most
:data:`RELAUNCHES` times), from its trial's last checkpoint.
"""

from __future__ import annotations

import contextvars
import functools
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar, NamedTuple
from uuid import UUID

from prefect.blocks.core import Block
from prefect.client.orchestration import get_client
from prefect.context import AsyncClientContext, EngineContext, SettingsContext, TaskRunContext
from prefect.futures import PrefectDistributedFuture
from prefect.settings import PREFECT_API_URL
from prefect.states import Crashed, State
from prefect.tasks import Task
from prefect.utilities.asyncutils import run_coro_as_sync

from elastune.flows.outages import Outage, Silence, give_up, now_ms, unreachable
from elastune.flows.segment import (
    WorkerLost,
    keyed,
    node_key,
    warm_segment,
)
from elastune.infra.backends import make_backend
from elastune.infra.sizing import InfraError, PoolBackend
from elastune.infra.warm_nodes import (
    HEARTBEAT_SECONDS,
    LIVE_SECONDS,
    WARM_TYPE,
    Node,
    draining_nodes,
    live_nodes,
    unfinished_runs,
)
from elastune.planners.search.schedulers.base import Segment
from elastune.planners.spec import MAX_WORKERS, EcsSpec
from elastune.planners.staging.placement import best_fit
from elastune.tasks.contract import JobRef, SegmentReport, report_name
from elastune.tasks.fence import token
from elastune.tasks.tracking import shared_tracker

# How often a driver waiting for room on a node looks again.
POLL_SECONDS = 0.5
# How long a driver waits on a warm run's end event before it checks the run's node again.
WAIT_SECONDS = 2.0
# A segment whose node died is launched again on a live one at most this many times.
RELAUNCHES = 2
# How often a driver waiting on a warm run looks for its report in MLflow.
REPORT_SECONDS = 10.0
# How long a node's new incarnation has to take a run waiting in the server's queue for it.
TAKE_SECONDS = 3 * LIVE_SECONDS


class Placement(NamedTuple):
    """The node a segment goes to, and whether it waits there for segments ahead of it."""

    node: str
    queued: bool


class Placer:
    """Places segments on the live nodes of a warm pool, best fit (the rule of
    planners/staging/placement.py), counting the GPUs this driver's segments hold."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self.held: dict[str, float] = {}
        self.lock = threading.Lock()
        self._live: tuple[float, list[Node], set[str]] = (-math.inf, [], set())

    def alive(self) -> list[Node]:
        """Every live node, draining or not, as read at most a heartbeat ago: one call to
        the server per segment is a good part of what a segment costs."""
        return self._read(fresh=False)[0]

    def live(self, fresh: bool = False) -> list[Node]:
        """The live nodes that are not draining (a draining node still lives and finishes
        its runs, but takes no new segment)."""
        nodes, draining = self._read(fresh)
        return [node for node in nodes if node.name not in draining]

    def _read(self, fresh: bool) -> tuple[list[Node], set[str]]:
        read_at, nodes, draining = self._live
        if fresh or time.monotonic() - read_at > HEARTBEAT_SECONDS:
            nodes, draining = live_nodes(self.pool), draining_nodes(self.pool)
            self._live = (time.monotonic(), nodes, draining)
        return nodes, draining

    def take(self, gpus: float, timeout: float) -> Placement:
        """Where ``gpus`` GPUs go, now held: a node with that many free trains the segment
        at once; else one whose queue has room (as many GPUs again as the node has) holds it
        until the segments ahead of it end. :class:`WorkerLost` when no live node has room
        within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        fresh = False
        while True:
            capacity = {node.name: node.gpus for node in self.live(fresh)}
            names = sorted(capacity)
            with self.lock:
                for queued, depth in ((False, 1), (True, 2)):
                    free = [
                        depth * capacity[name] - self.held.get(name, 0.0)
                        if capacity[name] >= gpus  # a node never trains wider than itself
                        else 0.0
                        for name in names
                    ]
                    index = best_fit(free, gpus)
                    if index is not None:
                        self.hold(names[index], gpus)
                        return Placement(names[index], queued)
            if time.monotonic() > deadline:
                raise WorkerLost(
                    f"no live node of warm pool {self.pool!r} had {gpus:g} free GPUs "
                    f"within {timeout:g} s"
                )
            time.sleep(POLL_SECONDS)
            fresh = True

    def hold(self, node: str, gpus: float) -> None:
        self.held[node] = self.held.get(node, 0.0) + gpus

    def give(self, node: str, gpus: float) -> None:
        with self.lock:
            self.held[node] -= gpus


@dataclass(frozen=True)
class WarmPool:
    """A pool of warm node workers: where segment parameters are stored, placement, the
    runs a dead driver left unfinished, by job (read once per job), and the driver's
    threads that launch segments and wait for them."""

    name: str
    storage: Block
    backend: PoolBackend
    placer: Placer
    worker_timeout: float  # seconds a segment waits for a live node with room
    queues: ClassVar[bool] = True  # a node holds a segment until the ones ahead of it end
    left: dict[str, dict[str, tuple[UUID, str]]] = field(default_factory=dict)
    threads: ThreadPoolExecutor = field(
        # A thread per segment in flight (threads start as needed): the default, a few per
        # core, would queue launches on a big pool.
        default_factory=lambda: ThreadPoolExecutor(
            max_workers=MAX_WORKERS, thread_name_prefix="warm-launch"
        )
    )

    def left_by(self, job_id: str) -> dict[str, tuple[UUID, str]]:
        """The unfinished warm runs of job ``job_id`` its predecessor left, by segment name;
        a launch takes its own out."""
        with self.placer.lock:
            if job_id not in self.left:
                self.left[job_id] = unfinished(job_id)
            return self.left[job_id]

    def submit(
        self,
        job: JobRef,
        segment: Segment,
        config: dict[str, Any],
        run_id: str,
        instance_type: str | None,
        timeout: float | None,
    ) -> Future[SegmentReport]:
        # No task run of its own: the warm run is the segment's one task run (a second
        # doubled the server's writes per segment, measured in docs/prefect-server.md).
        launch = functools.partial(launch_on_node, self, job, segment, config, run_id, timeout)
        given_up = functools.partial(give_up, job, segment, run_id)
        return self.threads.submit(
            contextvars.copy_context().run, relaunched, self, job.job_id, launch, given_up
        )

    def close(self) -> None:
        return None  # the nodes' workers outlive the job, warm for the next


def open_warm_pool(
    pool: str, template: dict[str, Any], worker_timeout: float, ecs: EcsSpec | None = None
) -> WarmPool:
    """The warm pool ``pool``; its storage block is in its template. With ``ecs``, the
    cluster its workers run on is sized stage by stage (it may be at zero now); without, it
    is open once a node lives (within ``worker_timeout`` s)."""
    storage = template.get("variables", {}).get("properties", {}).get("storage", {})
    if "default" not in storage:
        raise InfraError(
            f"compute.pool: warm pool {pool!r} names no parameter storage "
            "(create it with `python -m elastune.infra.local_cluster` or docs/ecs.md)"
        )
    options = {"pool_type": WARM_TYPE} | (ecs.model_dump() if ecs else {})
    backend = make_backend("ecs" if ecs else "local", pool, **options)
    block = Block.load(storage["default"])
    backend.check()
    placer = Placer(pool)
    deadline = time.monotonic() + worker_timeout
    while ecs is None and not placer.live():
        if time.monotonic() > deadline:
            raise InfraError(
                f"compute.pool: no warm worker of pool {pool!r} alive within "
                f"{worker_timeout:g} s; start one with "
                f"`python -m elastune.flows.segment --pool {pool}`"
            )
        time.sleep(POLL_SECONDS)
    return WarmPool(pool, block, backend, placer, worker_timeout)


def segment_name(job: JobRef, segment: Segment) -> str:
    """The name of every warm run of ``segment``: how a resumed driver finds one in flight.
    A name, not a tag: Prefect's task engine checks a run's tags for concurrency limits,
    and remembers that a set of tags has none, so runs that share their tags skip a call to
    the server that a tag unique to each segment would cost every run (about 2 s a segment
    under load, measured)."""
    return f"warm-segment {job.job_id}/trial-{segment.trial}/{report_name(segment)}"


def job_tag(job_id: str) -> str:
    """The tag of every warm run of job ``job_id``."""
    return f"elastune-job:{job_id}"


def unfinished(job_id: str) -> dict[str, tuple[UUID, str]]:
    """The unfinished warm runs of job ``job_id`` and their nodes, by segment name."""
    with get_client(sync_client=True) as client:
        runs = unfinished_runs(client, job_tag(job_id))
    found = {}
    for run in runs:
        node = next(t for t in run.tags if t.startswith("node:"))
        found[run.name] = (run.id, node.removeprefix("node:"))
    return found


_clients: dict[str, AsyncClientContext] = {}
_clients_lock = threading.Lock()


def launch_client() -> AsyncClientContext:
    """The async Prefect client this process's warm launches share, one per API (tests run
    jobs on several servers), opened on Prefect's run-sync loop, where ``Task.delay``
    creates its run and a future waits for it. Without it each delay builds two clients
    (the run's and its parameter storage's) and each wait one, each loading the CA bundle
    into a new SSL context: about 90 ms a segment (docs/prefect-server.md, "What a
    Prefect server costs")."""
    api = PREFECT_API_URL.value()
    with _clients_lock:
        if api not in _clients:
            context = AsyncClientContext()
            run_coro_as_sync(context.__aenter__())
            _clients[api] = context
        return _clients[api]


class _Unshipped(SettingsContext):
    """The driver's settings, kept out of a delayed run's parameters: a node runs its
    segments under its own settings (its folders, its credentials), and the parameters,
    stored where every host reads them, would otherwise hold the driver's secrets (Prefect
    ships the whole settings context, secrets revealed, with each delayed run)."""

    def serialize(self, include_secrets: bool = True) -> dict[str, Any]:
        return {}


def detached_delay(send: Task[..., Any], arguments: tuple[Any, ...]) -> UUID:
    """``send.delay(*arguments)`` outside the driver's flow and task runs (call it in a copied
    context): a delayed run ships its parent's context to the worker, and the driver's holds
    objects (this pool's lock, the flow's task runner) that do not pickle, and its settings
    (:class:`_Unshipped`)."""
    EngineContext.__var__.set(None)
    TaskRunContext.__var__.set(None)
    current = SettingsContext.get()
    SettingsContext.__var__.set(_Unshipped(profile=current.profile, settings=current.settings))
    return send.delay(*arguments).task_run_id


def await_warm(
    pool: WarmPool, run: UUID, node: str, timeout: float | None, saved: Callable[[], bool]
) -> bool:
    """Wait for warm run ``run`` on ``node``: True once it ends (or ``saved()``: its report
    is in MLflow, should its end's event have been lost with the server), False past
    ``timeout`` (with a grace period for the node's own limit to end it).
    :class:`WorkerLost` when the node dies first: a dead incarnation, or a restarted one,
    never finishes a run. While the Prefect server does not answer, it waits for it
    (flows/outages.py)."""
    deadline = None if timeout is None else time.monotonic() + timeout + 10 * POLL_SECONDS
    future: PrefectDistributedFuture[None] = PrefectDistributedFuture(run)
    outage, looked, silent = Outage(), time.monotonic(), Silence()
    while True:
        began = time.monotonic()
        try:
            state = run_state(future)
            nodes = [n for n in pool.placer.alive() if n.name == node]
        except Exception as exc:
            if not unreachable(exc):
                raise
            outage.wait(exc, POLL_SECONDS)
            continue
        # A read the client retried for seconds met a server that was away, as one that
        # failed did.
        outage.answered(slow=time.monotonic() - began > LIVE_SECONDS)
        if state is None or outage.settling():
            continue
        if state.is_final():
            return True
        if state.is_scheduled() and outage.lost_queue():
            raise WorkerLost(f"its run on node {node} was lost with the server's queue")
        if silent.dead(bool(holding_it(nodes, state, datetime.now(UTC)))):
            with get_client(sync_client=True) as client:
                client.set_task_run_state(run, Crashed(message=f"node {node} died"), force=True)
            raise WorkerLost(f"node {node} of warm pool {pool.name!r} died under the segment")
        if time.monotonic() - looked > REPORT_SECONDS:
            looked = time.monotonic()
            if saved():
                return True
        if deadline is not None and time.monotonic() > deadline:
            return False


def holding_it(nodes: list[Node], state: State, now: datetime) -> set[int]:
    """The live incarnations of a node (``nodes``) that may hold a run in ``state``: those
    that beat before the state began (before the run began running, or was sent), and while
    it is not yet running, one started since, for :data:`TAKE_SECONDS` (time to take it
    from the server's queue). Any other never runs it: a restarted node's new incarnation
    does not run what the dead one began, nor what it had taken (Prefect's server hands a
    run to one worker, and forgets it once that worker acknowledged it). Counting it
    would keep the driver waiting for the run forever."""
    waiting = not state.is_running()
    return {
        n.pid
        for n in nodes
        if n.since is None
        or n.since <= state.timestamp
        or (waiting and (now - n.since).total_seconds() < TAKE_SECONDS)
    }


def run_state(future: PrefectDistributedFuture[None]) -> State | None:
    """The run's state after waiting :data:`WAIT_SECONDS` for its end; None while the server
    has the run, not yet its first state."""
    try:
        future.wait(WAIT_SECONDS)
    except RuntimeError as exc:
        if "has no state" not in str(exc):
            raise
        time.sleep(POLL_SECONDS / 10)
        return None
    return future.state


def relaunched(
    pool: WarmPool,
    job_id: str,
    launch: Callable[[int], SegmentReport],
    given_up: Callable[[], SegmentReport | None],
) -> SegmentReport:
    """``launch(attempt)``'s report; launched again while its node dies under it, at most
    :data:`RELAUNCHES` times (the segment resumes from its trial's last checkpoint), once
    the launch given up on is fenced off and unless it had finished (``given_up()``). A
    launch the Prefect server could not take is tried again once it answers, after looking
    for a run it may have created meanwhile."""
    attempt, outage = 1, Outage()
    while True:
        try:
            return launch(attempt)
        except WorkerLost:
            finished = given_up()
            if finished is not None:
                return finished
            if attempt > RELAUNCHES:
                raise
        except Exception as exc:
            if not unreachable(exc):
                raise
            with pool.placer.lock:
                pool.left.pop(job_id, None)  # a run created before the error is adopted
            outage.wait(exc, POLL_SECONDS)
            continue
        attempt += 1
        time.sleep(1.0)  # as Prefect's retry delay was: a moment for the cluster to settle


def launch_on_node(
    pool: WarmPool,
    job: JobRef,
    segment: Segment,
    config: dict[str, Any],
    run_id: str,
    timeout: float | None,
    attempt: int,
) -> SegmentReport:
    """One launch of ``segment``: a warm run on the node the placer picks, waited for."""
    AsyncClientContext.__var__.set(launch_client())  # this launch's context is its own copy
    name = segment_name(job, segment)
    tracker = shared_tracker(job.mlflow_uri, job.experiment)
    # A driver resumed while its predecessor's segment still runs waits for that run.
    found = pool.left_by(job.job_id).pop(name, None)
    if found is not None:
        run, node = found
        queued = True  # it may still wait behind another of the dead driver's
        with pool.placer.lock:
            pool.placer.hold(node, segment.gpus)
    else:
        run, (node, queued) = None, pool.placer.take(segment.gpus, pool.worker_timeout)
    # A queued segment starts once the one ahead of it ends, within that one's limit.
    limit = None if timeout is None else timeout * (2 if queued else 1)
    try:
        if run is None:
            tags = {job_tag(job.job_id), f"node:{node}"}
            send = warm_segment.with_options(name=name, result_storage=pool.storage, tags=tags)
            send = keyed(send, node_key(pool.name, node))
            fence = token(segment.start, now_ms(), attempt)
            arguments = (job, segment, config, run_id, fence, tracker.artifact_location(run_id))
            run = contextvars.copy_context().run(detached_delay, send, arguments)
        report_at = functools.partial(tracker.load_report, run_id, report_name(segment))
        ended = await_warm(pool, run, node, limit, lambda: report_at() is not None)
    finally:
        pool.placer.give(node, segment.gpus)
    if not ended:
        return SegmentReport.timed_out(segment, timeout)
    report = report_at()
    if report is None:
        raise WorkerLost(f"segment on node {node} ended without a report")
    return SegmentReport.from_dict(report)
