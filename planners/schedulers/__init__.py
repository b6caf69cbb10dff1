"""Schedulers by name: each module holds one algorithm behind the interface of ``base``."""

from __future__ import annotations

from planners.plan import brackets
from planners.schedulers.base import Action, Decision, Result, Scheduler, Segment
from planners.schedulers.hyperband import Hyperband
from planners.schedulers.sha import SuccessiveHalving
from planners.spec import HyperbandSpec, JobSpec, ShaSpec

__all__ = ["Action", "Decision", "Result", "Scheduler", "Segment", "make_scheduler"]


def make_scheduler(spec: JobSpec, seed: int = 0) -> Scheduler:
    """The scheduler the job file names. ``seed`` feeds schedulers that draw at random."""
    s = spec.scheduler
    if isinstance(s, ShaSpec):
        return SuccessiveHalving(brackets(spec)[0])
    if isinstance(s, HyperbandSpec):
        return Hyperband(s.min_resource, s.max_resource, s.eta)
    raise AssertionError(f"unhandled scheduler {s.name}")
