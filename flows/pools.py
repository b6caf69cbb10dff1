"""The pools a job's segments go to, each sized stage by stage through an infra backend
(:class:`PoolSizer`), and each with the same face (:class:`PoolTarget`).

``compute.pool`` names one (:func:`pool_of`): ``local``, this machine
(:class:`LocalPool`: each segment a task run of the driver's, training in one of its
worker processes, ``tasks/worker_processes.py``), or a Prefect work pool, whose type picks how
(docs/prefect-server.md, "A job in work-pool mode"): on a warm pool (type
``elastune-warm``, :class:`~elastune.flows.warm_pool.WarmPool`) each segment is a
background task run sent to the warm worker of the node it is placed on; on a process or
ECS pool (:class:`FlowRunPool`) it is a flow run of the pool's ``train-segment``
deployment, a fresh process per segment.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol
from uuid import UUID

import torch
from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    FlowFilter,
    WorkPoolFilter,
)
from prefect.deployments import run_deployment
from prefect.deployments.runner import EntrypointType
from prefect.futures import PrefectFuture
from prefect.runtime import task_run
from prefect.states import Cancelling

from elastune.flows.segment import (
    FLOW_NAME,
    WorkerLost,
    flow_parameters,
    train_segment_flow,
)
from elastune.flows.warm_pool import open_warm_pool
from elastune.infra.backends import make_backend
from elastune.infra.prefect_pools import read_pool, wait_for_worker
from elastune.infra.sizing import Demand, InfraError, PoolBackend, SizingRecord
from elastune.infra.template import gpu_job_variables
from elastune.infra.warm_nodes import WARM_TYPE
from elastune.planners.execution import Execution
from elastune.planners.search.schedulers.base import Segment
from elastune.planners.spec import LOCAL_POOL, JobSpec, SpecError
from elastune.planners.staging import Stage
from elastune.planners.staging.devices import LocalDevices
from elastune.tasks.contract import JobRef, SegmentReport, report_name
from elastune.tasks.gpus import cuda_devices
from elastune.tasks.tracking import Tracker
from elastune.tasks.train import train_segment
from elastune.tasks.worker_processes import WorkerProcesses, fork_server_here

# Seconds to wait for a worker polling the pool (or a node with room) before giving up.
WORKER_TIMEOUT = float(os.environ.get("ELASTUNE_WORKER_TIMEOUT", "30"))


# A segment submitted to a pool: a Prefect future (a task run of the driver's) or, on a warm
# pool, a thread's future; both give the report with ``result()``.
Launched = PrefectFuture[SegmentReport] | Future[SegmentReport]


class PoolTarget(Protocol):
    """The pool a job's segments go to, with its sizing backend; ``queues``: whether its
    nodes hold a segment handed out ahead until one they train ends."""

    name: str
    backend: PoolBackend
    queues: ClassVar[bool]

    def submit(
        self,
        job: JobRef,
        segment: Segment,
        config: dict[str, Any],
        run_id: str,
        instance_type: str | None,
        timeout: float | None,
    ) -> Launched:
        """Start ``segment`` on the pool; its report, once it ends."""

    def close(self) -> None:
        """Free what the pool holds for the job, once no segment of it runs."""


def pool_of(spec: JobSpec) -> LocalPool | WorkPool:
    """The pool ``compute.pool`` names, not yet opened: no server is asked anything. A name
    of :data:`MACHINE_POOLS` is this machine's; any other, a Prefect work pool's."""
    return MACHINE_POOLS.get(spec.compute.pool, WorkPool)(spec)


class LocalPool(PoolTarget):
    """This machine: each segment a task run of the driver's, trained by one of its worker
    processes, which share the CPU cores; a trial's segment takes CUDA devices of its own
    while it runs, when there are any.

    ``compute.workers`` segments train at once, each worker's torch with that share of this
    machine's threads.
    """

    name = LOCAL_POOL
    queues: ClassVar[bool] = False

    def __init__(self, spec: JobSpec):
        workers = spec.compute.workers
        self.devices = cuda_devices()
        self.backend = PoolBackend("none", [])  # nothing to size: the machine is there
        self._threads = max(1, torch.get_num_threads() // workers)
        self._workers: WorkerProcesses | None = None  # started by the first segment
        self._assigned = None if self.devices is None else LocalDevices(self.devices)
        self._lock = threading.Lock()  # the devices, taken and freed from several threads

    def open(self) -> LocalPool:
        return self

    def fork_here(self) -> None:
        """Make this process, its imports done (the trainable's among them), the server its
        workers fork from, so that none imports anything again (tasks/worker_processes.py)."""
        fork_server_here()

    def submit(
        self,
        job: JobRef,
        segment: Segment,
        config: dict[str, Any],
        run_id: str,
        instance_type: str | None,
        timeout: float | None,
    ) -> Launched:
        # The segment's own limit (job.segment_timeout) ends it in its worker process.
        with self._lock:
            if self._workers is None:
                self._workers = WorkerProcesses(self._threads)
            ids = None
            if self._assigned is not None:
                ids = self._assigned.take(segment.trial, segment.gpus)
        future = train_segment.submit(self._workers, job, segment, config, run_id, ids)
        if self._assigned is not None:
            future.add_done_callback(lambda _: self._release(segment.trial))
        return future

    def _release(self, trial: int) -> None:
        with self._lock:
            self._assigned.release(trial)  # type: ignore[union-attr]

    def close(self) -> None:
        if self._workers is not None:
            self._workers.close()


class WorkPool:
    """A Prefect work pool by name, not yet opened: :meth:`open` finds its type on the
    server and what it takes to run a segment there."""

    devices = None  # a node's devices are its own worker's

    def __init__(self, spec: JobSpec):
        self.spec = spec
        self.name = spec.compute.pool

    def open(self) -> PoolTarget:
        return open_pool(self.spec)

    def fork_here(self) -> None:
        return None  # the pool's nodes train; the driver has no workers to fork


# Pools by the name ``compute.pool`` gives them; every other name is a Prefect work pool's.
MACHINE_POOLS: dict[str, Callable[[JobSpec], LocalPool]] = {LOCAL_POOL: LocalPool}


@dataclass(frozen=True)
class FlowRunPool(PoolTarget):
    """A process or ECS pool: its ``train-segment`` deployment and GPU variables."""

    name: str
    deployment: UUID
    gpu_variables: bool
    backend: PoolBackend
    working_dir: str | None = None  # a process pool's: where the driver finds the trainable
    queues: ClassVar[bool] = False  # a flow run per segment: nothing waits on a node

    def job_variables(self, gpus_per_trial: float, instance_type: str | None) -> dict[str, str]:
        if self.working_dir is not None:
            return {"working_dir": self.working_dir}
        return gpu_job_variables(gpus_per_trial, instance_type) if self.gpu_variables else {}

    def submit(
        self,
        job: JobRef,
        segment: Segment,
        config: dict[str, Any],
        run_id: str,
        instance_type: str | None,
        timeout: float | None,
    ) -> Launched:
        variables = self.job_variables(segment.gpus, instance_type)
        return launch_segment.submit(
            self.deployment, job, segment, config, run_id, variables, timeout
        )

    def close(self) -> None:
        return None  # each segment's flow run ended with it


def open_pool(spec: JobSpec) -> PoolTarget:
    """Check the pool and wait for a worker; on a process or ECS pool, find (or register)
    its ``train-segment`` deployment. Every mistake surfaces here, before anything is
    created. Prints the mode the pool resolved to."""
    pool = spec.compute.pool
    work_pool = read_pool(pool)
    if work_pool.type == WARM_TYPE:
        ecs = spec.compute.ecs
        target = open_warm_pool(pool, work_pool.base_job_template, WORKER_TIMEOUT, ecs)
        mode = f"pool: {pool}, warm workers on {len(target.placer.live())} node(s)"
        if ecs:
            mode += f" now, ECS cluster {ecs.cluster} sized stage by stage"
        print(mode, file=sys.stderr)
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
    # A process worker runs each segment where the driver runs, so the trainable imports
    # there as it does here.
    working_dir = os.getcwd() if work_pool.type == "process" else None
    deployment = segment_deployment(pool, work_pool.type)
    return FlowRunPool(pool, deployment, "gpu_count" in variables, backend, working_dir)


def segment_deployment(pool: str, pool_type: str) -> UUID:
    """The pool's ``train-segment`` deployment. A process pool on this machine gets one
    registered from the installed package; any other pool must have one deployed."""
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
    deployment = train_segment_flow.to_deployment(
        name=pool, work_pool_name=pool, entrypoint_type=EntrypointType.MODULE_PATH
    )
    return deployment.apply()


class PoolSizer:
    """Before segments of a new stage start, size the pool for the stages then active, as
    the job's admission policy demands (:meth:`planners.admission.Admission.demand`). An
    asynchronous job has no stages: its pool is sized once, for the whole job.

    Args:
        backend: The pool's sizing backend.
        execution: The job's execution plan.
        scheduler: The scheduler's name, the sizing action's name for an asynchronous job.
    """

    def __init__(self, backend: PoolBackend, execution: Execution, scheduler: str):
        self.backend = backend
        self.execution = execution
        self.scheduler = scheduler
        self._active: set[tuple[int, int]] = set()  # (bracket, rung) of the stages running
        self._sized: Demand | None = None  # what the pool was last sized for

    def check(self) -> None:
        """Bad input, before anything is sized, if the backend could not size a stage of
        the plan on its own (or an asynchronous job's pool). Stages of brackets that overlap
        are sized together later, and checked then."""
        plan = self.execution.plan
        alone: list[list[Stage]] = [[]] if plan is None else [[s] for s in plan.stages]
        self.backend.check([self._demand(stages) for stages in alone])

    def size(self, starting: list[Segment]) -> list[SizingRecord]:
        """Size the pool for the stages active once ``starting`` starts; the actions taken."""
        plan = self.execution.plan
        stages: list[Stage] = []
        if plan is not None:
            self._active |= {(s.bracket, s.rung) for s in starting}
            stages = [plan.stage(*key) for key in sorted(self._active)]
            if not stages:  # between stages with nothing to start: keep the pool as it is
                return []
        demand = self._demand(stages)
        # Every change of the active stages, or of what they ask (a re-plan), sizes again.
        if demand == self._sized:
            return []
        done = self.backend.size(
            demand.stage, demand.slots, demand.gpus_per_trial, demand.instance_type
        )
        self.backend.wait_ready(timeout=600)
        self._sized = demand
        return done

    def _demand(self, stages: list[Stage]) -> Demand:
        """What ``stages``, active together, ask of the pool (none: an asynchronous job)."""
        name = "+".join(s.name for s in stages) if stages else self.scheduler
        slots, gpus = self.execution.admission.demand(stages)
        return Demand(name, slots, gpus, stages[-1].instance_type if stages else None)

    def stage_done(self, segment: Segment) -> None:
        """The stage of ``segment`` has all its results: it no longer holds the pool."""
        self._active.discard((segment.bracket, segment.rung))

    def replanned(self, execution: Execution) -> None:
        """The job was re-planned in flight: from its next sizing on, the pool holds what
        ``execution`` demands, for the stages running too."""
        self.execution = execution


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
        return SegmentReport.timed_out(segment, timeout)
    report = Tracker(job.mlflow_uri, job.experiment).load_report(run_id, report_name(segment))
    if report is None:
        raise WorkerLost(f"flow run {run.name} ended {run.state_name} without a report")
    return SegmentReport.from_dict(report)
