"""The training task: one segment of one trial, resumed from its checkpoint.

A segment runs at its width ``Segment.gpus`` (docs/algorithms.md §6, elastic trials):

* ``g > 1``: ``g`` data-parallel processes (:func:`elastune.tasks.distributed.run_distributed`:
  gloo on CPU, NCCL on CUDA with one GPU per process). Only a trainable that declares it supports
  this (``train.distributed = True``, see :func:`elastune.tasks.trainable.supports_distributed`) is
  run so.
* ``g = 1``: the trainable runs in one process, on ``cuda`` when there is one: a worker
  process of the local pool or of a warm node (:mod:`elastune.tasks.worker_processes`), or
  the process of a flow run on a process or ECS pool.
* ``g < 1``: the segment shares its device with other segments. On NVIDIA GPUs, segments
  in separate processes (the local pool's workers, a process or ECS pool) run concurrently
  only under MPS, which elastune detects (:func:`mps_running`) but does not start: run
  ``nvidia-cuda-mps-control -d`` on the node. Without MPS they time-slice the GPU, and the
  trial's run is tagged so.

A width that cannot run (the profile does not cover it, more GPUs than the pool or the
worker has, a trainable that is not data-parallel) is bad input with a message naming the
field, unless the job file sets ``compute.elastic_fallback: true``: the segment then runs on
1 GPU and its MLflow run says why.
"""

from __future__ import annotations

import contextvars
import logging
import math
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import MissingContextError
from prefect.logging import get_run_logger
from prefect.utilities.timeout import timeout as time_limit

from elastune.planners.search.schedulers.base import Result, Segment
from elastune.planners.spec import SpecError
from elastune.planners.staging.widths import FALLBACK_HINT, width_problem
from elastune.tasks.checkpoint_spool import Spool
from elastune.tasks.context import TrialContext
from elastune.tasks.contract import JobRef, SegmentReport, report_name, timeout_reason
from elastune.tasks.distributed import DistContext, DistributedError, run_distributed
from elastune.tasks.fence import fenced, fenced_call
from elastune.tasks.gpus import cuda_devices, mps_running
from elastune.tasks.tracking import Tracker, shared_tracker
from elastune.tasks.trainable import Trainable, TrainableError, load_trainable, supports_distributed
from elastune.tasks.worker_processes import WorkerDied, WorkerProcesses


class SegmentTimeout(TimeoutError):
    """The trainable ran over ``compute.segment_timeout``."""


@task(
    name="train-segment",
    task_run_name="trial-{segment.trial} {segment.start:g}→{segment.stop:g}",
    cache_policy=NO_CACHE,  # training must never be skipped by a cache hit
)
def train_segment(
    workers: WorkerProcesses,
    job: JobRef,
    segment: Segment,
    config: dict[str, Any],
    run_id: str,
    gpu_ids: Sequence[int] | None = None,
) -> SegmentReport:
    """A segment of the local pool, run by one of ``workers`` (wider than 1, on ranks that
    worker starts). Local segments keep their checkpoints on this machine until they end
    (tasks/checkpoint_spool.py)."""
    return train_in_worker(workers, job, segment, config, run_id, gpu_ids, spool=True)


def train_in_worker(
    workers: WorkerProcesses,
    job: JobRef,
    segment: Segment,
    config: dict[str, Any],
    run_id: str,
    gpu_ids: Sequence[int] | None = None,
    spool: bool = False,
    fence: str | None = None,
    artifacts: str | None = None,
) -> SegmentReport:
    """:func:`run_segment` in one of ``workers`` (a local job's segments, a warm node's), its
    MLflow writes carrying ``fence`` (tasks/fence.py), ``artifacts`` the run's artifact
    location if the caller knows it. A worker that dies fails the segment
    (not spooled, its report is kept in MLflow, where a warm node's driver reads it); one
    whose segment failed is retired: its process may be broken (a CUDA error poisons its
    context) or its trainable still running (past its limit, in a C call)."""
    limit = job.segment_timeout  # this one ends a worker stuck past the segment's own
    with workers.worker() as worker:
        try:
            call = (run_segment,) if fence is None else (fenced_call, fence, run_segment)
            report = worker.call(
                *call, job, segment, config, run_id, gpu_ids=gpu_ids, spool=spool,
                artifacts=artifacts,
                timeout=None if limit is None else limit + 2 * GIVE_UP_GRACE_SECONDS,
            )  # fmt: skip
        except WorkerDied as exc:
            report = SegmentReport.failure(segment, str(exc))
            if not spool:
                tracker = shared_tracker(job.mlflow_uri, job.experiment)
                if artifacts is not None:
                    tracker.know_artifacts(run_id, artifacts)
                with fenced(fence):
                    tracker.save_report(run_id, report_name(segment), report.to_dict())
            return report
        if report.result.failed:
            worker.retire()
    return report


# How long a data-parallel segment may run without ``compute.segment_timeout``; also each
# collective's limit, so a rank that hangs (rather than dies, which is noticed at once) is
# given up on after this.
ELASTIC_TIMEOUT_SECONDS = 7 * 24 * 3600.0

Reports = list[tuple[float, dict[str, float]]]


def run_segment(
    job: JobRef,
    segment: Segment,
    config: dict[str, Any],
    run_id: str,
    device: str | None = None,
    gpu_ids: Sequence[int] | None = None,
    spool: bool = False,
    artifacts: str | None = None,
) -> SegmentReport:
    """Train ``segment`` at its width and keep its report in MLflow. A trainable that raises,
    runs over ``job.segment_timeout`` or that this worker cannot import yields a failed
    result: one trial's failure never ends the job. A width that cannot run raises SpecError
    (see :func:`segment_width`). The time limit interrupts a trainable stuck in Python code;
    one blocked inside a C call is left behind in its own thread a few seconds later
    (:func:`_within_limit`).

    Args:
        device: Where a single-process segment trains; default ``cuda`` when there is one.
        gpu_ids: The GPUs the executor (a packer's assignment) gave this segment, one per
            data-parallel process; default ``0 .. g-1``. Ignored without CUDA.
        spool: Keep a single-process segment's checkpoints on this machine and hand the
            newest to MLflow when it ends (:class:`elastune.tasks.checkpoint_spool.Spool`):
            for segments whose retry runs on this machine too (the local pool).
        artifacts: The run's artifact location (:meth:`Tracker.artifact_location`), which
            this process would otherwise ask MLflow for; None: ask.
    """
    tracker = shared_tracker(job.mlflow_uri, job.experiment)
    if artifacts is not None:
        tracker.know_artifacts(run_id, artifacts)
    began = time.perf_counter()
    try:
        trainable = load_trainable(job.trainable)
    except TrainableError as exc:  # the job checked it; this worker lacks the code
        reports, resource, error, cut = [], segment.start, str(exc), False
    else:
        reports, resource, error, cut = _train_at_width(
            job, segment, config, run_id, trainable, tracker, device, gpu_ids, spool
        )
    seconds = time.perf_counter() - began
    first = min((r for r, _ in reports), default=resource + 1)
    if first > segment.start + 1:
        # This segment was under way (or even finished) before a crash: it resumed from a
        # checkpoint past its start, so the epochs before that were reported by the run that
        # died. Their metrics are in MLflow already; the report must hold them too.
        earlier = [
            (float(step), {job.metric: value})
            for step, value in sorted(tracker.metric_history(run_id, job.metric))
            if segment.start < step < first and step <= resource
        ]
        reports = earlier + list(reports)
    history = tuple((r, job.loss(m[job.metric])) for r, m in reports if job.metric in m)
    seen = tuple(sorted({k for _, metrics in reports for k in metrics}))
    if error is None and history and not math.isfinite(history[-1][1]):
        error = f"metric {job.metric} is {job.loss(history[-1][1])}"
    failed = error is not None or not history
    loss = history[-1][1] if history else math.inf
    result = Result(segment.trial, resource, loss, failed, history, seconds)
    report = SegmentReport(result, seen, error, cut)
    # The report is kept with the trial, so a resumed or remote driver never re-runs a
    # segment that finished.
    tracker.flush_tags(run_id)  # a segment that logged no metrics: its width
    tracker.save_report(run_id, report_name(segment), report.to_dict())
    return report


def _train_at_width(
    job: JobRef,
    segment: Segment,
    config: dict[str, Any],
    run_id: str,
    trainable: Trainable,
    tracker: Tracker,
    device: str | None,
    gpu_ids: Sequence[int] | None,
    spool: bool,
) -> tuple[Reports, float, str | None, bool]:
    """Run the segment on one process or ``g``; its reports, resource reached, error and
    whether the deadline cut it short."""
    gpus, fallback = segment_width(job, segment, trainable)
    cuda = cuda_devices() is not None
    ids = list(gpu_ids) if cuda and gpu_ids is not None else None
    if device is None:
        device = "cpu" if not cuda else f"cuda:{ids[0]}" if ids else "cuda"
    tags: dict[str, Any] = {"elastune.gpus": f"{gpus:g}"}
    if fallback is not None:
        tags["elastune.width_fallback"] = f"asked {segment.gpus:g} GPUs: {fallback}"
    if gpus < 1 and cuda:
        tags["elastune.gpu_sharing"] = "mps" if mps_running() else "time-slicing"
    tracker.keep_tags(run_id, tags)
    if gpus <= 1:
        kept = Spool.beside(job.mlflow_uri) if spool else None
        ctx, error = _train(
            job, segment, config, run_id, trainable, device=device, gpus=gpus, spool=kept
        )
        return ctx.reports, ctx.resource, error, ctx.cut
    try:
        reports, resource, cut = run_distributed(
            _train_rank,
            int(gpus),
            (job, segment, config, run_id, gpus),
            devices=ids,
            timeout=min(job.segment_timeout or math.inf, ELASTIC_TIMEOUT_SECONDS),
            preload=[job.trainable.partition(":")[0]],
        )
    except (DistributedError, TimeoutError) as exc:
        # The ranks' reports are lost with them; the segment failed either way.
        return [], segment.start, str(exc), False
    return reports, resource, None, cut


def segment_width(job: JobRef, segment: Segment, trainable: Trainable) -> tuple[float, str | None]:
    """The width ``segment`` runs at, and why it fell back to 1 GPU (None if it did not).
    A width that cannot run is a SpecError unless the job allows the fallback."""
    problem = width_problem(
        segment.gpus,
        trainable=job.trainable,
        distributed=supports_distributed(trainable),
        covered=job.widths,
        max_gpus=job.max_gpus,
        devices=cuda_devices(),
    )
    if problem is None:
        return segment.gpus, None
    where = f"trial {segment.trial}, segment {segment.start:g}→{segment.stop:g}"
    if not job.elastic_fallback:
        raise SpecError(f"{where}: {problem}{FALLBACK_HINT}")
    _logger().warning("%s: %s; running it on 1 GPU (compute.elastic_fallback)", where, problem)
    return 1.0, problem


# How long past ``compute.segment_timeout`` a segment waits for a trainable the limit could
# not stop (blocked inside a C call): the limit ends one in Python code at once.
GIVE_UP_GRACE_SECONDS = 5.0


class SegmentBlocked(SegmentTimeout):
    """The trainable was still running ``GIVE_UP_GRACE_SECONDS`` past its limit, in
    ``thread``."""

    def __init__(self, message: str, thread: threading.Thread):
        super().__init__(message)
        self.thread = thread


def _train(
    job: JobRef,
    segment: Segment,
    config: dict[str, Any],
    run_id: str,
    trainable: Trainable,
    **placement: Any,
) -> tuple[TrialContext, str | None]:
    """Run the trainable on this segment in this process; the context and the error, if any."""
    ctx = TrialContext(
        trial=segment.trial,
        start=segment.start,
        stop=segment.stop,
        max_resource=job.max_resource,
        run_id=run_id,
        tracker=shared_tracker(job.mlflow_uri, job.experiment),
        seed=job.trial_seed(segment.trial),
        deadline_at=job.deadline_at,
        **placement,
    )
    if placement.get("world_size", 1) > 1:
        try:
            trainable(dict(config), ctx)  # a rank that raises must end its peers: let it
        finally:
            ctx.finish()
        return ctx, None
    blocked = False
    try:
        _within_limit(job.segment_timeout, lambda: trainable(dict(config), ctx))
    except SegmentTimeout as exc:
        # A call blocked in C keeps its thread, and the process its devices, until the
        # worker process is retired (its failed report retires it).
        blocked = isinstance(exc, SegmentBlocked)
        return ctx, timeout_reason(job.segment_timeout)
    except (Exception, SystemExit) as exc:  # a trainable's sys.exit() ends its trial alone
        error = "".join(traceback.format_exception_only(exc)).strip()
        error += "\n" + "".join(traceback.format_tb(exc.__traceback__)[-3:])
        return ctx, error
    finally:
        if not blocked:  # else ctx stays with the blocked thread: what it wrote is kept
            ctx.finish()
    return ctx, None


def _within_limit(limit: float | None, call: Callable[[], None]) -> None:
    """``call()`` within ``limit`` seconds. The limit is raised into the call's thread at
    its next line of Python, so it cannot end a call blocked inside C (a CUDA call that
    never returns, a data loader waiting on a dead process): the call runs in a daemon
    thread of its own, left behind ``GIVE_UP_GRACE_SECONDS`` past the limit
    (:class:`SegmentBlocked`), where it holds up neither this segment, nor the thread pool
    it came from, nor the process's exit.
    The limit interrupts the trainable's own code only: ctx shields its writes to MLflow."""
    if limit is None:
        call()
        return
    raised: list[BaseException] = []

    def limited() -> None:
        try:
            with time_limit(limit, timeout_exc_type=SegmentTimeout):
                call()
        except BaseException as exc:  # the caller's thread raises it
            raised.append(exc)

    context = contextvars.copy_context()  # Prefect's run context, for the trainable's logs
    thread = threading.Thread(target=context.run, args=(limited,), daemon=True)
    thread.name = f"{threading.current_thread().name}-trainable"
    thread.start()
    thread.join(limit + GIVE_UP_GRACE_SECONDS)
    if thread.is_alive():
        raise SegmentBlocked(f"still running {GIVE_UP_GRACE_SECONDS:g} s past {limit:g} s", thread)
    if raised:
        raise raised[0]


def _train_rank(
    dist: DistContext,
    job: JobRef,
    segment: Segment,
    config: dict[str, Any],
    run_id: str,
    gpus: float,
) -> tuple[Reports, float, bool]:
    """One process of a data-parallel segment; rank 0's reports are the segment's."""
    ctx, _ = _train(
        job,
        segment,
        config,
        run_id,
        load_trainable(job.trainable),
        device=str(dist.device),
        gpus=gpus,
        rank=dist.rank,
        world_size=dist.world_size,
    )
    return ctx.reports, ctx.resource, ctx.cut


def _logger() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    try:
        return get_run_logger()
    except MissingContextError:  # called outside a Prefect run (tests, a plain script)
        return logging.getLogger("elastune")
