"""Work-pool mode: segments run on a pool's workers, and the pool is sized stage by stage
through an infra backend (:class:`PoolSizer`).

The pool's type picks how (docs/prefect-server.md, "A job in work-pool mode"): on a warm
pool (type ``elastune-warm``, :class:`WarmPool`) each segment is a background task run
sent to the warm worker of the node it is placed on; on a process or ECS pool
(:class:`FlowRunPool`) it is a flow run of the pool's ``train-segment`` deployment, a
fresh process per segment.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect import task
from prefect.blocks.core import Block
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowFilter,
    WorkPoolFilter,
)
from prefect.context import EngineContext, TaskRunContext
from prefect.deployments import run_deployment
from prefect.futures import PrefectDistributedFuture, PrefectFuture
from prefect.runtime import task_run
from prefect.states import Cancelling, Crashed
from prefect.tasks import Task

from flows.segment import (
    FLOW_NAME,
    HEARTBEAT_SECONDS,
    WARM_TYPE,
    Node,
    WorkerLost,
    flow_parameters,
    keyed,
    node_key,
    train_segment_flow,
    warm_segment,
)
from flows.warm_runs import draining_nodes, unfinished_runs
from infra.backends import make_backend
from infra.pools import read_pool, wait_for_worker
from infra.sizing import InfraError, PoolBackend, SizingRecord
from infra.template import gpu_job_variables
from planners.execution import ExecutionPlan
from planners.search.schedulers.base import Segment
from planners.spec import JobSpec, SpecError
from planners.staging.placement import best_fit
from tasks.tracking import Tracker
from tasks.train import JobRef, SegmentReport, report_name

ROOT = Path(__file__).resolve().parent.parent
# Seconds to wait for a worker polling the pool (or a node with room) before giving up.
WORKER_TIMEOUT = float(os.environ.get("ELASTUNE_WORKER_TIMEOUT", "30"))
# A node whose last heartbeat is older is dead: Prefect's 3 missed beats, plus slack for a
# busy machine.
LIVE_SECONDS = 3 * HEARTBEAT_SECONDS + 2.0
# How often a driver waiting for a warm segment checks that its node still lives.
POLL_SECONDS = 0.5


class PoolTarget:
    """The pool a job's segments go to, with its sizing backend."""

    name: str
    backend: PoolBackend

    def submit(
        self,
        job: JobRef,
        segment: Segment,
        config: dict[str, Any],
        run_id: str,
        instance_type: str | None,
        timeout: float | None,
    ) -> PrefectFuture[SegmentReport]:
        """Start ``segment`` on the pool; its report, once it ends."""
        raise NotImplementedError


@dataclass(frozen=True)
class FlowRunPool(PoolTarget):
    """A process or ECS pool: its ``train-segment`` deployment and GPU variables."""

    name: str
    deployment: UUID
    gpu_variables: bool
    backend: PoolBackend

    def job_variables(self, gpus_per_trial: float, instance_type: str | None) -> dict[str, str]:
        return gpu_job_variables(gpus_per_trial, instance_type) if self.gpu_variables else {}

    def submit(
        self,
        job: JobRef,
        segment: Segment,
        config: dict[str, Any],
        run_id: str,
        instance_type: str | None,
        timeout: float | None,
    ) -> PrefectFuture[SegmentReport]:
        variables = self.job_variables(segment.gpus, instance_type)
        return launch_segment.submit(
            self.deployment, job, segment, config, run_id, variables, timeout
        )


def open_pool(spec: JobSpec) -> PoolTarget:
    """Check the pool and wait for a worker; on a process or ECS pool, find (or register)
    its ``train-segment`` deployment. Every mistake surfaces here, before anything is
    created. Prints the mode the pool resolved to."""
    pool = spec.compute.pool
    work_pool = read_pool(pool)
    if work_pool.type == WARM_TYPE:
        target = open_warm_pool(pool, work_pool.base_job_template)
        print(f"pool: {pool}, warm workers on {len(target.placer.live())} node(s)", file=sys.stderr)
        return target
    if work_pool.type not in ("process", "ecs"):
        raise InfraError(
            f"compute.pool: pool {pool!r} has type {work_pool.type!r}; "
            f"elastune drives {WARM_TYPE}, process and ecs pools"
        )
    if work_pool.type == "ecs":
        if spec.compute.ecs is None:
            raise SpecError(f"compute.ecs: pool {pool!r} is an ecs pool; name its cluster")
        backend = make_backend("ecs", pool, **spec.compute.ecs.model_dump())
    else:
        backend = make_backend("local", pool)
    backend.check()
    wait_for_worker(pool, WORKER_TIMEOUT)
    variables = set(work_pool.base_job_template.get("variables", {}).get("properties", {}))
    print(f"pool: {pool}, a flow run per segment ({work_pool.type} workers)", file=sys.stderr)
    return FlowRunPool(
        pool, segment_deployment(pool, work_pool.type), "gpu_count" in variables, backend
    )


def segment_deployment(pool: str, pool_type: str) -> UUID:
    """The pool's ``train-segment`` deployment. A process pool on this machine gets one
    registered from the project's source; any other pool must have one deployed."""
    with get_client(sync_client=True) as client:
        found = client.read_deployments(
            flow_filter=FlowFilter(name={"any_": [FLOW_NAME]}),
            work_pool_filter=WorkPoolFilter(name={"any_": [pool]}),
        )
    if found:
        return found[0].id
    if pool_type != "process":
        raise InfraError(
            f"compute.pool: no {FLOW_NAME} deployment on {pool_type} pool {pool!r}; "
            "deploy one with `prefect deploy --all` (see prefect.yaml)"
        )
    source = train_segment_flow.from_source(str(ROOT), "flows/segment.py:train_segment_flow")
    # deploy() prints a table on stdout, which belongs to --json alone.
    with contextlib.redirect_stdout(sys.stderr):
        return source.deploy(
            name=pool, work_pool_name=pool, print_next_steps=False, ignore_warnings=True
        )


class PoolSizer:
    """Before segments of a new stage start, size the pool for the stages then active, as
    the job's admission policy demands (:meth:`planners.admission.Admission.demand`). An
    asynchronous job has no stages: its pool is sized once, for the whole job.

    Args:
        backend: The pool's sizing backend.
        execution: The job's execution plan.
        scheduler: The scheduler's name, the sizing action's name for an asynchronous job.
    """

    def __init__(self, backend: PoolBackend, execution: ExecutionPlan, scheduler: str):
        self.backend = backend
        self.execution = execution
        self.scheduler = scheduler
        self._active: set[tuple[int, int]] = set()  # (bracket, rung) of the stages running
        self._sized = ""

    def size(self, starting: list[Segment]) -> list[SizingRecord]:
        """Size the pool for the stages active once ``starting`` starts; the actions taken."""
        plan = self.execution.plan
        if plan is None:
            stages, name = [], self.scheduler
        else:
            self._active |= {(s.bracket, s.rung) for s in starting}
            stages = [plan.stage(*key) for key in sorted(self._active)]
            if not stages:  # between stages with nothing to start: keep the pool as it is
                return []
            name = "+".join(s.name for s in stages)
        if name == self._sized:  # every change of the active stages is a sizing action
            return []
        slots, gpus = self.execution.admission.demand(stages)
        done = self.backend.size(name, slots, gpus, stages[-1].instance_type if stages else None)
        self.backend.wait_ready(timeout=600)
        self._sized = name
        return done

    def stage_done(self, segment: Segment) -> None:
        """The stage of ``segment`` has all its results: it no longer holds the pool."""
        self._active.discard((segment.bracket, segment.rung))


@task(
    name="launch-segment",
    task_run_name="trial-{segment.trial} {segment.start:g}→{segment.stop:g}",
    cache_policy=NO_CACHE,
    retries=2,  # a lost worker is retried; the new run resumes from the last checkpoint
    retry_delay_seconds=1,
)
def launch_segment(
    deployment: UUID,
    job: JobRef,
    segment: Segment,
    config: dict[str, Any],
    run_id: str,
    job_variables: dict[str, Any],
    timeout: float | None = None,
) -> SegmentReport:
    # One flow run per attempt: a driver resumed while its predecessor's segment still runs
    # on the pool gets that flow run back and waits for it instead of starting a twin.
    attempt = task_run.run_count
    run = run_deployment(
        deployment,
        parameters=flow_parameters(job, segment, config, run_id),
        job_variables=job_variables,
        poll_interval=1,
        timeout=timeout,
        idempotency_key=f"{job.job_id}/trial-{segment.trial}/{report_name(segment)}/{attempt}",
    )
    if not run.state or not run.state.is_final():
        # Hung: cancelling makes the worker kill the process, which frees its GPUs.
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(run.id, Cancelling(), force=True)
        return SegmentReport.failure(segment, f"timeout: segment ran over {timeout:g} s")
    report = Tracker(job.mlflow_uri, job.experiment).load_report(run_id, report_name(segment))
    if report is None:
        raise WorkerLost(f"flow run {run.name} ended {run.state_name} without a report")
    return SegmentReport.from_dict(report)


def live_nodes(pool: str) -> list[Node]:
    """The warm workers of ``pool`` whose heartbeats are fresh (a restarted node may
    briefly show two incarnations)."""
    with get_client(sync_client=True) as client:
        workers = client.read_workers_for_work_pool(pool)
    now = datetime.now(UTC)
    return [
        Node.parse(w.name)
        for w in workers
        if w.last_heartbeat_time is not None
        and (now - w.last_heartbeat_time).total_seconds() < LIVE_SECONDS
        and w.name.count("/") >= 2
    ]


class Placer:
    """Places segments on the live nodes of a warm pool, best fit (the rule of
    planners/staging/placement.py), counting the GPUs this driver's segments hold."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self.held: dict[str, float] = {}
        self.lock = threading.Lock()
        self._live: tuple[float, list[Node]] = (-math.inf, [])

    def live(self, fresh: bool = False) -> list[Node]:
        """The live nodes that are not draining, as read at most a heartbeat ago unless
        ``fresh``: one call to the server per segment is a good part of what a segment
        costs."""
        read_at, nodes = self._live
        if fresh or time.monotonic() - read_at > HEARTBEAT_SECONDS:
            # A draining node still lives (its runs finish) but takes no new segment.
            draining = draining_nodes(self.pool)
            nodes = [node for node in live_nodes(self.pool) if node.name not in draining]
            self._live = (time.monotonic(), nodes)
        return nodes

    def take(self, gpus: float, timeout: float) -> str:
        """The node ``gpus`` GPUs go to, now held; :class:`WorkerLost` when no live node
        has room within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        fresh = False
        while True:
            capacity = {node.name: node.gpus for node in self.live(fresh)}
            names = sorted(capacity)
            with self.lock:
                free = [capacity[name] - self.held.get(name, 0.0) for name in names]
                index = best_fit(free, gpus)
                if index is not None:
                    self.hold(names[index], gpus)
                    return names[index]
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
class WarmPool(PoolTarget):
    """A pool of warm node workers: where segment parameters are stored, placement, and
    the runs a dead driver left unfinished, by job (read once per job)."""

    name: str
    storage: Block
    backend: PoolBackend
    placer: Placer
    left: dict[str, dict[str, tuple[UUID, str]]] = field(default_factory=dict)

    def left_by(self, job_id: str) -> dict[str, tuple[UUID, str]]:
        """The unfinished warm runs of job ``job_id`` its predecessor left, by segment tag;
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
    ) -> PrefectFuture[SegmentReport]:
        return launch_warm.submit(self, job, segment, config, run_id, timeout)


def open_warm_pool(pool: str, template: dict[str, Any]) -> WarmPool:
    """The warm pool ``pool`` once a node lives; its storage block is in its template."""
    storage = template.get("variables", {}).get("properties", {}).get("storage", {})
    if "default" not in storage:
        raise InfraError(
            f"compute.pool: warm pool {pool!r} names no parameter storage "
            "(create it with `python -m infra.local_cluster` or docs/ecs.md)"
        )
    backend = make_backend("local", pool, pool_type=WARM_TYPE)
    block = Block.load(storage["default"])
    backend.check()
    placer = Placer(pool)
    deadline = time.monotonic() + WORKER_TIMEOUT
    while not placer.live():
        if time.monotonic() > deadline:
            raise InfraError(
                f"compute.pool: no warm worker of pool {pool!r} alive within "
                f"{WORKER_TIMEOUT:g} s; start one with `python -m flows.segment --pool {pool}`"
            )
        time.sleep(POLL_SECONDS)
    return WarmPool(pool, block, backend, placer)


def segment_tag(job: JobRef, segment: Segment) -> str:
    """The tag of every launch of ``segment``: how a resumed driver finds one in flight."""
    return f"elastune-segment:{job.job_id}/trial-{segment.trial}/{report_name(segment)}"


def job_tag(job_id: str) -> str:
    """The tag of every warm run of job ``job_id``."""
    return f"elastune-job:{job_id}"


def unfinished(job_id: str) -> dict[str, tuple[UUID, str]]:
    """The unfinished warm runs of job ``job_id`` and their nodes, by segment tag."""
    with get_client(sync_client=True) as client:
        runs = unfinished_runs(client, job_tag(job_id))
    found = {}
    for run in runs:
        tags = {t.split(":", 1)[0]: t for t in run.tags}
        found[tags["elastune-segment"]] = (run.id, tags["node"].removeprefix("node:"))
    return found


def detached_delay(send: Task[..., Any], arguments: tuple[Any, ...]) -> UUID:
    """``send.delay(*arguments)`` outside the driver's flow and task runs (call it in a copied
    context): a delayed run ships its parent's context to the worker, and the driver's holds
    objects (this pool's lock, the flow's task runner) that do not pickle."""
    EngineContext.__var__.set(None)
    TaskRunContext.__var__.set(None)
    return send.delay(*arguments).task_run_id


def await_warm(pool: str, run: UUID, node: str, timeout: float | None) -> bool:
    """Wait for warm run ``run`` on ``node``: True once it ends, False past ``timeout``
    (with a grace period for the node's own limit to end it). :class:`WorkerLost` when the
    node dies first: a dead incarnation, or a restarted one, never finishes a run."""
    deadline = None if timeout is None else time.monotonic() + timeout + 10 * POLL_SECONDS
    future: PrefectDistributedFuture[None] = PrefectDistributedFuture(run)
    seen: set[int] | None = None  # the node's incarnations alive while the run ran
    while True:
        future.wait(POLL_SECONDS)
        state = future.state
        if state.is_final():
            return True
        alive = {n.pid for n in live_nodes(pool) if n.name == node}
        if seen is None and state.is_running():
            seen = alive
        if not (alive if seen is None else alive & seen):
            with get_client(sync_client=True) as client:
                client.set_task_run_state(run, Crashed(message=f"node {node} died"), force=True)
            raise WorkerLost(f"node {node} of warm pool {pool!r} died under the segment")
        if deadline is not None and time.monotonic() > deadline:
            return False


@task(
    name="launch-segment",
    task_run_name="trial-{segment.trial} {segment.start:g}→{segment.stop:g}",
    cache_policy=NO_CACHE,
    retries=2,  # a lost node is retried on a live one; it resumes from the last checkpoint
    retry_delay_seconds=1,
)
def launch_warm(
    pool: WarmPool,
    job: JobRef,
    segment: Segment,
    config: dict[str, Any],
    run_id: str,
    timeout: float | None,
) -> SegmentReport:
    tag = segment_tag(job, segment)
    # A driver resumed while its predecessor's segment still runs waits for that run.
    found = pool.left_by(job.job_id).pop(tag, None)
    if found is not None:
        run, node = found
        with pool.placer.lock:
            pool.placer.hold(node, segment.gpus)
    else:
        run, node = None, pool.placer.take(segment.gpus, WORKER_TIMEOUT)
    try:
        if run is None:
            tags = {tag, job_tag(job.job_id), f"node:{node}"}
            send = warm_segment.with_options(result_storage=pool.storage, tags=tags)
            send = keyed(send, node_key(pool.name, node))
            arguments = (job, segment, config, run_id, timeout, task_run.run_count)
            run = contextvars.copy_context().run(detached_delay, send, arguments)
        ended = await_warm(pool.name, run, node, timeout)
    finally:
        pool.placer.give(node, segment.gpus)
    if not ended:
        return SegmentReport.failure(segment, f"timeout: segment ran over {timeout:g} s")
    report = Tracker(job.mlflow_uri, job.experiment).load_report(run_id, report_name(segment))
    if report is None:
        raise WorkerLost(f"segment on node {node} ended without a report")
    return SegmentReport.from_dict(report)
