"""Schedulers by name: the one a job file's ``scheduler:`` section names, and the brackets
that the synchronous ones (``sha``, ``hyperband``) unroll to.

Example:
    >>> from elastune.planners.spec import parse_job
    >>> spec = parse_job({"name": "d", "trainable": "m:f", "metric": "acc",
    ...     "space": {"x": {"type": "float", "low": 0, "high": 1}},
    ...     "scheduler": {"name": "sha", "min_resource": 1, "max_resource": 9}})
    >>> [(r.trials, r.resource) for r in brackets(spec)[0].rungs]
    [(9, 1), (3, 3), (1, 9)]
    >>> type(make_scheduler(spec)).__name__
    'SuccessiveHalving'
"""

from __future__ import annotations

from elastune.planners.search.schedulers.asha import Asha
from elastune.planners.search.schedulers.base import Scheduler
from elastune.planners.search.schedulers.bloom import Bloom
from elastune.planners.search.schedulers.fifo import Fifo
from elastune.planners.search.schedulers.hyperband import Hyperband
from elastune.planners.search.schedulers.median import MedianStopping
from elastune.planners.search.schedulers.pbt import Pbt
from elastune.planners.search.schedulers.sha import SuccessiveHalving
from elastune.planners.spec import JobSpec, SpecError, distributions
from elastune.planners.spec.geometry import Bracket, floor_log, hyperband_brackets, sha_bracket
from elastune.planners.spec.model import (
    AshaSpec,
    BloomSpec,
    FifoSpec,
    HyperbandSpec,
    MedianSpec,
    PbtSpec,
    ShaSpec,
)


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


def sha_trials(spec: ShaSpec) -> int:
    """``max_trials``, or by default just enough for one trial to reach the top rung."""
    if spec.max_trials is not None:
        return spec.max_trials
    return spec.eta ** floor_log(spec.max_resource / spec.min_resource, spec.eta)


def brackets(spec: JobSpec) -> list[Bracket]:
    """The brackets a synchronous job (``sha``, ``hyperband``) unrolls to; SpecError for an
    asynchronous one, which has none."""
    s = spec.scheduler
    if isinstance(s, ShaSpec):
        return [sha_bracket(sha_trials(s), s.min_resource, s.max_resource, s.eta)]
    if isinstance(s, HyperbandSpec):
        return hyperband_brackets(s.min_resource, s.max_resource, s.eta)
    # SpecError (a ValueError): `elastune plan` on an asynchronous job is bad input, exit 2.
    raise SpecError(
        f"scheduler.name: {s.name} is asynchronous and has no staged plan to price; "
        "name sha or hyperband to plan a job"
    )
