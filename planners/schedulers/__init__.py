"""Schedulers by name: each module holds one algorithm behind the interface of ``base``."""

from __future__ import annotations

from planners.plan import brackets
from planners.schedulers.asha import Asha
from planners.schedulers.base import Action, Decision, Result, Scheduler, Segment
from planners.schedulers.bloom import Bloom
from planners.schedulers.fifo import Fifo
from planners.schedulers.hyperband import Hyperband
from planners.schedulers.median import MedianStopping
from planners.schedulers.pbt import Pbt
from planners.schedulers.sha import SuccessiveHalving
from planners.space import distributions
from planners.spec import (
    AshaSpec,
    BloomSpec,
    FifoSpec,
    HyperbandSpec,
    JobSpec,
    MedianSpec,
    PbtSpec,
    ShaSpec,
)

__all__ = ["Action", "Decision", "Result", "Scheduler", "Segment", "make_scheduler"]


def make_scheduler(spec: JobSpec, seed: int = 0) -> Scheduler:
    """The scheduler the job file names. ``seed`` feeds schedulers that draw at random."""
    s = spec.scheduler
    if isinstance(s, ShaSpec):
        return SuccessiveHalving(brackets(spec)[0])
    if isinstance(s, HyperbandSpec):
        return Hyperband(s.min_resource, s.max_resource, s.eta)
    if isinstance(s, AshaSpec):
        return Asha(
            s.min_resource,
            s.max_resource,
            s.eta,
            max_trials=s.max_trials,
            brackets=s.brackets,
            bootstrap_count=s.bootstrap_count,
            seed=seed,
        )
    if isinstance(s, BloomSpec):
        return Bloom(
            s.min_resource,
            s.max_resource,
            s.eta,
            max_trials=s.max_trials,
            promotions=s.promotions,
            brackets=s.brackets,
            slope_weight=s.slope_weight,
            revive=s.revive,
            seed=seed,
        )
    if isinstance(s, FifoSpec):
        return Fifo(s.max_resource, s.max_trials)
    if isinstance(s, MedianSpec):
        return MedianStopping(
            s.min_resource,
            s.max_resource,
            interval=s.interval,
            grace_period=s.grace_period,
            min_samples_required=s.min_samples_required,
            max_trials=s.max_trials,
        )
    if isinstance(s, PbtSpec):
        return Pbt(
            distributions(spec),
            s.max_resource,
            s.perturbation_interval,
            population_size=s.population_size,
            quantile_fraction=s.quantile_fraction,
            resample_probability=s.resample_probability,
            seed=seed,
        )
    raise AssertionError(f"unhandled scheduler {s.name}")
