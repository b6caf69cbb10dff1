"""What the driver and a segment's worker tell each other: the job a segment belongs to
(:class:`JobRef`, small and picklable for remote workers) and what the segment came back
with (:class:`SegmentReport`, kept in the trial's MLflow run under :func:`report_name`).

Example:
    >>> from elastune.planners.search.schedulers.base import Segment
    >>> segment = Segment(trial=4, start=1, stop=3, rung=1)
    >>> report_name(segment), SegmentReport.failure(segment, "worker lost").result.failed
    ('1-3', True)
    >>> SegmentReport.from_dict(SegmentReport.timed_out(segment, 60).to_dict()).error
    'timeout: segment ran over 60 s'
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any

from elastune.planners.search.schedulers.base import Result, Segment
from elastune.planners.spec import JobSpec
from elastune.planners.staging.widths import profile_widths
from elastune.tasks.context import mix


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
    # Elastic widths: the profile's GPU counts (None: no profile), the pool's GPUs, and
    # whether a width that cannot run falls back to 1 GPU.
    widths: tuple[float, ...] | None = None
    max_gpus: int | None = None
    elastic_fallback: bool = False
    seed: int | None = None  # sampler.seed: trials of jobs seeded alike start alike
    segment_timeout: float | None = None  # compute.segment_timeout (None: no limit)
    # Wall-clock time (time.time()) of budget.deadline, counted from the job's start on its
    # driver: segments stop at their first step past it (TrialContext.range). None: none.
    deadline_at: float | None = None

    def trial_seed(self, trial: int) -> int:
        """``ctx.seed`` of a trial: the job's seed mixed with the trial id (the trial id
        alone when the job has no seed); 31 bits, so that any seeding API takes it, and
        arithmetic on it (``GlobalBatches``) stays within 64 bits."""
        return trial if self.seed is None else mix(self.seed, trial) % 2**31

    @classmethod
    def of(cls, spec: JobSpec, job_id: str, mlflow_uri: str) -> JobRef:
        """The job's reference, its deadline counted from now."""
        deadline = spec.budget.deadline
        return cls(
            job_id,
            spec.trainable,
            spec.metric,
            spec.mode,
            spec.scheduler.max_resource,
            mlflow_uri,
            spec.experiment,
            widths=profile_widths(spec),
            max_gpus=spec.compute.max_gpus,
            elastic_fallback=spec.compute.elastic_fallback,
            seed=spec.sampler.seed,
            segment_timeout=spec.compute.segment_timeout,
            deadline_at=None if deadline is None else time.time() + deadline,
        )

    def loss(self, value: float) -> float:
        return -value if self.mode == "max" else value


@dataclass(frozen=True)
class SegmentReport:
    """A finished segment: the scheduler's :class:`Result` plus what went wrong, if anything.
    ``cut``: the job's deadline stopped it short of its stop (its result is partial)."""

    result: Result
    metrics_seen: tuple[str, ...]
    error: str | None = None
    cut: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def failure(cls, segment: Segment, reason: str) -> SegmentReport:
        """A segment that produced nothing (timed out, lost its worker): the trial fails."""
        return cls(Result(segment.trial, segment.start, math.inf, failed=True), (), reason)

    @classmethod
    def timed_out(cls, segment: Segment, seconds: float) -> SegmentReport:
        """A segment its driver gave up on after ``compute.segment_timeout``."""
        return cls.failure(segment, timeout_reason(seconds))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SegmentReport:
        result = dict(data["result"])
        result["history"] = tuple(tuple(point) for point in result["history"])
        return cls(
            Result(**result), tuple(data["metrics_seen"]), data["error"], data.get("cut", False)
        )


def timeout_reason(seconds: float) -> str:
    return f"timeout: segment ran over {seconds:g} s"


def report_name(segment: Segment) -> str:
    """Artifact name of a segment's report in its trial's MLflow run."""
    return f"{segment.start:g}-{segment.stop:g}"
