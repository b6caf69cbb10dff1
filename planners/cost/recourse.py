"""The plan to start a job that will be re-planned after its first wave (docs/algorithms.md
§5.10): its first stage chosen for the re-planning to come, not for the profile alone.

RubberBand's plan is the cheapest one if the profile is right. A job re-planned in flight
(:mod:`planners.cost.replan`) learns what the profile got wrong from its first wave, and
everything after that wave is bought knowing it; the first wave is all that a wrong
profile buys before anything is measured. So :func:`recourse_start` judges each of
RubberBand's options for the first stage by what it costs under every error the profile
may have: the mean, over ``points`` equally likely errors (the quantiles of a lognormal
with relative sd ``prior_error``, the one :class:`~planners.cost.replan.ProfileEstimate`
gives the profile), of the first wave's cost and the cheapest plan for the rest made
knowing the error once that wave is done. Only options whose plan meets the deadline
under the profile itself are candidates: the plan shown is still one that meets it.

Measured on the re-planning benchmark's job (``python benchmarks/replan.py --first-stage
recourse``; docs/benchmarks.md): 95.8% of the deadlines at 1.20x the cost of the plan
that knew the true profile, against 97.3% at 1.25x from RubberBand's plan. ``elastune
plan`` does not use it yet. One chain (SHA): a Hyperband job's brackets start side by side.

Example (RubberBand's plan runs the first stage in five waves of two trials on 4 GPUs
each; the recourse start runs all nine at once on single-GPU nodes, which tell the speed
and spread from nine segments before anything else is bought):
    >>> from planners.cost.catalog import read_catalog
    >>> from planners.cost.replan import Replanner
    >>> from planners.staging import Profile, Stage
    >>> job = [Stage(0, 0, 9, 0, 1), Stage(0, 1, 3, 1, 3), Stage(0, 2, 1, 3, 9)]
    >>> profile = Profile.from_scaling(240, speedup={2: 1.8, 4: 3.2}, segment_cv=0.1)
    >>> types = ["g5.xlarge", "g5.12xlarge"]
    >>> replanner = Replanner(read_catalog(), types, job, deadline=1700, samples=50)
    >>> first = replanner.plan(profile).plan.stages[0]
    >>> first.instance_type, first.instances, first.gpus_label
    ('g5.12xlarge', 2, '4')
    >>> first = recourse_start(replanner, profile).stages[0]
    >>> first.instance_type, first.instances, first.gpus_label
    ('g5.xlarge', 9, '1')
"""

from __future__ import annotations

import dataclasses
import math
from statistics import NormalDist

import numpy as np

from planners.cost.allocation import AllocationPlan, StagePlan
from planners.cost.replan import ProfileEstimate, Replanner, first_wave, left_to_run, part
from planners.cost.sizing import chains_of
from planners.staging import Profile, Stage, Timing


def recourse_start(
    replanner: Replanner,
    profile: Profile,
    points: int = 7,
    prior_error: float | None = None,
) -> AllocationPlan:
    """The plan whose first stage is the cheapest over the profile's errors (module
    docstring), the rest RubberBand's under ``profile`` after it.

    Args:
        replanner: The job's re-planner (its stages, types, deadline and simulator).
        profile: The profile the job starts with.
        points: How many errors of the profile to average over.
        prior_error: The profile's relative error; None: ``ProfileEstimate``'s default.
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
    sigma = math.sqrt(math.log(1 + error**2))
    errors = [math.exp(sigma * NormalDist().inv_cdf((i + 0.5) / points)) for i in range(points)]
    first, rest = chains[0][0], chains[0][1:]
    rubberband = replanner.rubberband(profile, replanner.deadline)
    # RubberBand's own first stage first: it stays where no option is cheaper (free nodes).
    own = rubberband.plan(replanner.stages).plan.stages[0]
    options = rubberband.options(first, 0, rubberband.usable(chains))
    best: tuple[float, AllocationPlan] | None = None
    for option in [own, *(o for o in options if o != own)]:
        after = _after(replanner, profile, option, list(rest))
        if after is None:
            continue  # the plan shown must meet the deadline under its own profile
        wave = part(option, 0, first_wave(option, replanner.catalog))
        left = left_to_run(replanner.stages, {(first.bracket, first.rung): wave.trials})
        cost = 0.0
        for factor in errors:
            known = _after(replanner, _scaled(profile, factor), wave, left, feasible=False)
            assert known is not None
            cost += known[1] / points
        if best is None or cost < best[0]:
            best = (cost, AllocationPlan(((option, *after[0]),)))
    if best is None:
        raise ValueError("no first stage meets the deadline under the profile")
    return best[1]


def _after(
    replanner: Replanner,
    profile: Profile,
    done: StagePlan,
    left: list[Stage],
    feasible: bool = True,
) -> tuple[tuple[StagePlan, ...], float] | None:
    """RubberBand's stages for ``left`` after ``done`` ran under ``profile``, its nodes
    held, and the mean cost of ``done`` and of them; None if ``feasible`` and they miss the
    deadline."""
    assert replanner.deadline is not None
    ran = replanner.rubberband(profile, None).simulator.run(AllocationPlan(((done,),)))
    deadline_left = replanner.deadline - float(np.quantile(ran.jct, replanner.quantile))
    if not left:
        return None if feasible and deadline_left < 0 else ((), ran.cost_mean)
    holding = {done.bracket: done}
    rest = replanner.rubberband(profile, max(deadline_left, 1.0), holding).plan(left)
    if feasible and (deadline_left <= 1.0 or not rest.feasible):
        return None
    return rest.plan.stages, ran.cost_mean + rest.outcome.cost_mean


def _scaled(profile: Profile, factor: float) -> Profile:
    """``profile`` with every width ``factor`` times as slow."""
    timings = {g: Timing(t.mean * factor, t.sd * factor) for g, t in profile.timings.items()}
    return dataclasses.replace(profile, timings=timings)
