"""The training task: one segment of one trial, resumed from its checkpoint."""

from __future__ import annotations

import importlib
import inspect
import math
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from planners.schedulers.base import Result, Segment
from planners.spec import JobSpec, SpecError
from tasks.context import TrialContext
from tasks.tracking import Tracker

Trainable = Callable[[dict[str, Any], TrialContext], Any]


def load_trainable(reference: str) -> Trainable:
    """Import ``module:function``; a failure names the ``trainable`` field."""
    module_name, _, attribute = reference.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise SpecError(f"trainable: cannot import {module_name} ({exc})") from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise SpecError(f"trainable: {module_name} has no function {attribute}")
    try:
        inspect.signature(function).bind({}, None)
    except TypeError:
        raise SpecError(f"trainable: {reference} must take (config, ctx)") from None
    return function


@dataclass(frozen=True)
class JobRef:
    """What a segment needs to know about its job; small and picklable for remote workers."""

    job_id: str
    trainable: str
    metric: str
    mode: str
    max_resource: float
    mlflow_uri: str
    experiment: str

    @classmethod
    def of(cls, spec: JobSpec, job_id: str, mlflow_uri: str) -> JobRef:
        return cls(
            job_id,
            spec.trainable,
            spec.metric,
            spec.mode,
            spec.scheduler.max_resource,
            mlflow_uri,
            spec.experiment,
        )

    def loss(self, value: float) -> float:
        return -value if self.mode == "max" else value


@dataclass(frozen=True)
class SegmentReport:
    """A finished segment: the scheduler's :class:`Result` plus what went wrong, if anything."""

    result: Result
    metrics_seen: tuple[str, ...]
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def failure(cls, segment: Segment, reason: str) -> SegmentReport:
        """A segment that produced nothing (timed out, lost its worker): the trial fails."""
        return cls(Result(segment.trial, segment.start, math.inf, failed=True), (), reason)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SegmentReport:
        result = dict(data["result"])
        result["history"] = tuple(tuple(point) for point in result["history"])
        return cls(Result(**result), tuple(data["metrics_seen"]), data["error"])


def report_name(segment: Segment) -> str:
    """Artifact name of a segment's report in its trial's MLflow run."""
    return f"{segment.start:g}-{segment.stop:g}"


def run_segment(
    job: JobRef, segment: Segment, config: dict[str, Any], run_id: str, device: str = "cpu"
) -> SegmentReport:
    """Train ``segment`` in this process and keep its report in MLflow. A trainable that
    raises yields a failed result: one trial's failure never ends the job."""
    tracker = Tracker(job.mlflow_uri, job.experiment)
    ctx = TrialContext(
        trial=segment.trial,
        start=segment.start,
        stop=segment.stop,
        max_resource=job.max_resource,
        run_id=run_id,
        tracker=tracker,
        device=device,
        gpus=segment.gpus,
    )
    began = time.perf_counter()
    error = None
    try:
        load_trainable(job.trainable)(dict(config), ctx)
    except Exception as exc:
        error = "".join(traceback.format_exception_only(exc)).strip()
        error += "\n" + "".join(traceback.format_tb(exc.__traceback__)[-3:])
    seconds = time.perf_counter() - began
    reports = ctx.reports
    if not reports and error is None and ctx.restored_from >= segment.stop:
        # This segment finished before a crash lost its report: it checkpointed at (or past)
        # its stop, so it trained nothing now. Its metrics are in MLflow already.
        reports = [
            (float(step), {job.metric: value})
            for step, value in sorted(tracker.metric_history(run_id, job.metric))
            if segment.start < step <= ctx.restored_from
        ]
    history = tuple((r, job.loss(m[job.metric])) for r, m in reports if job.metric in m)
    seen = tuple(sorted({k for _, metrics in reports for k in metrics}))
    if error is None and history and not math.isfinite(history[-1][1]):
        error = f"metric {job.metric} is {job.loss(history[-1][1])}"
    failed = error is not None or not history
    loss = history[-1][1] if history else math.inf
    result = Result(segment.trial, ctx.resource, loss, failed, history, seconds)
    report = SegmentReport(result, seen, error)
    # The report is kept with the trial, so a resumed or remote driver never re-runs a
    # segment that finished.
    tracker.save_report(run_id, report_name(segment), report.to_dict())
    return report


@task(
    name="train-segment",
    task_run_name="trial-{segment.trial} {segment.start:g}→{segment.stop:g}",
    cache_policy=NO_CACHE,  # training must never be skipped by a cache hit
)
def train_segment(
    job: JobRef, segment: Segment, config: dict[str, Any], run_id: str
) -> SegmentReport:
    return run_segment(job, segment, config, run_id)
