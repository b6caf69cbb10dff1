"""The plan to start a job that will be re-planned after its first wave (docs/algorithms.md
§5.10): its first stage chosen for the re-planning to come, not for the profile alone.

RubberBand's plan is the cheapest one if the profile is right. A job re-planned in flight
(:mod:`elastune.planners.cost.inflight.replanner`) learns what the profile got wrong from its first
wave, and everything not begun by then is bought knowing it; the trials begun when that wave has
reported (the wave and, on each slot it freed, the next trial: :func:`begun`) are all that a wrong
profile buys before anything is measured. So :func:`recourse_start` costs each of RubberBand's
options for the first stage under every error the profile may have (``points`` equally likely
errors, the quantiles of a lognormal with relative sd ``prior_error``, the one
:class:`~elastune.planners.cost.inflight.estimate.ProfileEstimate` gives the profile): the trials it
has begun, then the cheapest plan for the rest made knowing the error, or its own plan kept whole
where that costs less and meets the deadline. It starts the job on the option whose cost is, on the
mean over the errors, the nearest to the least any option costs at each error (a cost near what
knowing the error would cost, where the truth is fast and everything is cheap as where it is slow),
among those that leave the deadline within reach at every error where RubberBand's own first stage
does, and whose plan meets the deadline under the profile itself (the plan shown is still one that
meets it). Where some of them run at least :data:`MIN_WAVE` trials in their first wave (half the
stage, if that is fewer), only those: that wave's segments are all the job has measured when it
first re-plans, and a few of them misread the speed and its spread.

Measured on the re-planning benchmark's job (``python benchmarks/replan.py``;
docs/benchmarks.md): 96.6% of the deadlines at 1.03x the cost of the plan that knew the
true profile, against 97.4% at 1.15x from RubberBand's plan. It plans the rest of the job for
every option under every error: 1-6 s for that job (27 trials, 100 samples), 10-30 s for
one of 81 trials on two types (200 samples), against 0.03-0.1 s for RubberBand's plan. So
``plan_job`` uses it for a first stage of at most :data:`MAX_OPTIONS` options
(:func:`first_options`); a larger one would take minutes. One chain (SHA): a Hyperband
job's brackets start side by side.

Example (RubberBand's plan runs the first stage on one 4-GPU node, two trials at a time
on two GPUs each; the recourse start runs all nine at once on single-GPU nodes, the
cheapest GPUs whatever the error, and learns the speed from nine segments):
    >>> from elastune.planners.cost.pricing.catalog import read_catalog
    >>> from elastune.planners.cost.inflight.replanner import Replanner
    >>> from elastune.planners.staging import Profile, Stage
    >>> job = [Stage(0, 0, 9, 0, 1), Stage(0, 1, 3, 1, 3), Stage(0, 2, 1, 3, 9)]
    >>> profile = Profile.from_scaling(240, speedup={2: 1.8, 4: 3.2}, segment_cv=0.1)
    >>> types = ["g5.xlarge", "g5.12xlarge"]
    >>> replanner = Replanner(read_catalog(), types, job, deadline=2200, samples=50)
    >>> first = replanner.plan(profile).plan.stages[0]
    >>> first.instance_type, first.instances, first.gpus_label
    ('g5.12xlarge', 1, '2')
    >>> first = recourse_start(replanner, profile).stages[0]
    >>> first.instance_type, first.instances, first.gpus_label
    ('g5.xlarge', 9, '1')
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

from elastune.planners.cost.inflight.estimate import ProfileEstimate
from elastune.planners.cost.inflight.replanner import (
    Replanner,
    begun,
    first_wave,
    left_to_run,
    part,
)
from elastune.planners.cost.montecarlo.held import Held
from elastune.planners.cost.pricing.allocation import AllocationPlan, StagePlan
from elastune.planners.cost.pricing.stage_shapes import chains_of
from elastune.planners.staging import Profile, Stage, Timing

#: The most first-stage options a start is chosen among in ``plan_job``: each costs
#: ``points + 1`` RubberBand plans of the rest (32 options, 27 trials on two types: 1-6 s;
#: 59, examples/cloud.yaml's 81 trials on three types: 36 s).
MAX_OPTIONS = 40

#: The segments a start's first wave measures where an option runs that many at once
#: (half the stage, if that is fewer): the straggler spread read from 14 segments has a
#: relative standard error of 1/sqrt(2 * 13), about 0.2.
MIN_WAVE = 14


class NoStart(ValueError):
    """No first stage leaves a rest that meets the deadline under the profile (RubberBand's
    plan may still meet it as a whole: a split at the first stage's p95 is stricter)."""


def recourse_start(
    replanner: Replanner,
    profile: Profile,
    points: int = 7,
    prior_error: float | None = None,
    options: Sequence[StagePlan] | None = None,
) -> AllocationPlan:
    """The plan whose first stage costs nearest to knowing the profile's error (module
    docstring), the rest RubberBand's under ``profile`` after it.

    Args:
        replanner: The job's re-planner (its stages, types, deadline and simulator).
        profile: The profile the job starts with.
        points: How many errors of the profile to average over.
        prior_error: The profile's relative error; None: ``ProfileEstimate``'s default.
        options: :func:`first_options` where the caller has them already (each makes
            RubberBand's plan of the whole job).
    """
    if points < 1:
        raise ValueError(f"points must be >= 1, got {points}")
    if replanner.deadline is None:
        raise ValueError("a recourse start needs a deadline (the replanner has none)")
    chains = chains_of(replanner.stages)
    if len(chains) != 1:
        raise ValueError(f"a recourse start plans one chain, the job has {len(chains)}")
    error = ProfileEstimate(profile).prior_error if prior_error is None else prior_error
    if not error > 0:
        raise ValueError(f"prior_error must be > 0, got {error}")
    errors = profile_errors(points, error)
    first = chains[0][0]
    wide_wave = min(MIN_WAVE, math.ceil(first.trials / 2))
    plans: list[AllocationPlan] = []
    costs: list[list[float]] = []
    meets: list[list[bool]] = []
    measures: list[bool] = []
    options = first_options(replanner, profile) if options is None else options
    for option in options:
        plan = start_on(replanner, profile, option)
        if plan is None:
            continue  # the plan shown must meet the deadline under its own profile
        ran = part(option, 0, begun(option, replanner.catalog))
        left = left_to_run(replanner.stages, {(first.bracket, first.rung): ran.trials})
        known = [_known(replanner, _scaled(profile, f), plan, ran, left) for f in errors]
        plans.append(plan)
        costs.append([k.cost for k in known])
        meets.append([k.meets for k in known])
        measures.append(first_wave(option, replanner.catalog) >= wide_wave)
    if not plans:
        raise NoStart("no first stage meets the deadline under the profile")
    # Each option's cost at an error over the least any option costs there: the goal is
    # a cost near what knowing the error would cost, at cheap errors as at dear ones.
    table = np.array(costs)
    least = table.min(axis=0)
    ratio = np.divide(table, least, out=np.ones_like(table), where=least > 0).mean(axis=1)
    # Money saved is no reason to give up a deadline: no error at which RubberBand's own
    # first stage leaves it within reach may leave another start out of it.
    kept = np.array(meets)
    if plans[0].stages[0] == options[0]:
        ratio[~(kept >= kept[0]).all(axis=1)] = np.inf
    # The first wave's segments are all the job has measured when it first re-plans:
    # fewer than MIN_WAVE (or half the stage) read the speed, and its spread, too
    # loosely. A profile held exact (one point) has nothing to learn.
    wide = np.array(measures) & np.isfinite(ratio)
    if points > 1 and wide.any():
        ratio[~wide] = np.inf
    return plans[int(np.argmin(ratio))]  # ties: RubberBand's own, first


def first_options(
    replanner: Replanner, profile: Profile, own: StagePlan | None = None
) -> list[StagePlan]:
    """The first stages a start is chosen among: RubberBand's own first (``own`` where the
    caller holds RubberBand's plan already), then every other option of its plan space
    (each type, market, GPUs per trial and node count with a distinct number of waves)."""
    chains = chains_of(replanner.stages)
    rubberband = replanner.rubberband(profile, replanner.deadline)
    # RubberBand's own first stage first: it stays where no option is cheaper (free nodes).
    if own is None:
        own = rubberband.plan(replanner.stages).plan.stages[0]
    options = rubberband.options(chains[0][0], 0, rubberband.usable(chains))
    return [own, *(o for o in options if o != own)]


def start_on(replanner: Replanner, profile: Profile, option: StagePlan) -> AllocationPlan | None:
    """The job (one chain) started on ``option``, RubberBand's plan under ``profile`` for
    the stages after it; None where no such rest meets the deadline."""
    rest = list(chains_of(replanner.stages)[0][1:])
    after = _after(replanner, profile, option, rest)
    return AllocationPlan(((option, *after.stages),)) if after.meets else None


def profile_errors(points: int, prior_error: float) -> list[float]:
    """``points`` equally likely factors by which the profile's speed may be off: the
    quantiles of a lognormal whose relative sd is ``prior_error``."""
    sigma = math.sqrt(math.log(1 + prior_error**2))
    return [math.exp(sigma * NormalDist().inv_cdf((i + 0.5) / points)) for i in range(points)]


class _Rest(NamedTuple):
    """RubberBand's stages for the rest of a job after a first stage, the mean cost of
    that stage and of them, and whether they meet the deadline at its quantile."""

    stages: tuple[StagePlan, ...]
    cost: float
    meets: bool


def _known(
    replanner: Replanner, profile: Profile, plan: AllocationPlan, ran: StagePlan, left: list[Stage]
) -> _Rest:
    """The job started on ``plan``, under ``profile`` known once ``ran`` (the first stage's
    trials begun when its first wave reports) is done: the cheaper of ``plan`` kept whole,
    where it meets the deadline, and RubberBand's plan of the rest after ``ran``."""
    assert replanner.deadline is not None
    after = _after(replanner, profile, ran, left)
    kept = replanner.rubberband(profile, None).simulator.run(plan)
    meets = float(np.quantile(kept.jct, replanner.quantile)) <= replanner.deadline
    if meets and not (after.meets and after.cost < kept.cost_mean):
        return _Rest(plan.stages, kept.cost_mean, True)
    return after


def _after(replanner: Replanner, profile: Profile, done: StagePlan, left: list[Stage]) -> _Rest:
    """The rest of the job after ``done`` ran under ``profile``, its nodes held."""
    assert replanner.deadline is not None
    ran = replanner.rubberband(profile, None).simulator.run(AllocationPlan(((done,),)))
    deadline_left = replanner.deadline - float(np.quantile(ran.jct, replanner.quantile))
    if not left:
        return _Rest((), ran.cost_mean, deadline_left >= 0)
    holding = {done.bracket: Held(done)}
    rest = replanner.rubberband(profile, max(deadline_left, 1.0), holding).plan(left)
    meets = deadline_left > 1.0 and rest.feasible
    return _Rest(rest.plan.stages, ran.cost_mean + rest.outcome.cost_mean, meets)


def _scaled(profile: Profile, factor: float) -> Profile:
    """``profile`` with every width ``factor`` times as slow."""
    timings = {g: Timing(t.mean * factor, t.sd * factor) for g, t in profile.timings.items()}
    return dataclasses.replace(profile, timings=timings)
