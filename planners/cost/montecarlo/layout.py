"""A stage laid out for the simulator: where its trials run and how long each one's segment
takes, from the profile (``elastune.planners.cost.montecarlo.simulate``).

Each trial's segment has a mean and an sd (:meth:`Profile.segment`), and terms that the
calibration's own error moves in every segment of a run alike (``basis``: 1 for the
segment's ``overhead_s``, 1 on a trial's first segment for ``trial_overhead_s``, and its
units' seconds for the relative error of ``seconds_per_unit``; ``Profile.calibration_cov``).

Example (two trials of 3 units on one GPU each, a unit of 2 s, 0.5 s a segment around it):
    >>> from elastune.planners.cost.pricing.allocation import GpuTier, StagePlan
    >>> from elastune.planners.cost.pricing.catalog import parse_catalog
    >>> from elastune.planners.staging import Profile
    >>> node = parse_catalog({"instance_types": {"box": {
    ...     "gpus": 2, "gpu": "any", "price_per_hour": 1.0}}}).get("box")
    >>> stage = StagePlan(0, 0, (GpuTier(2, 1.0, 3.0),), "box", 1)
    >>> layout = stage_layout(Profile({1: 2.0}, overhead_s=0.5), stage, node)
    >>> layout.mean.tolist(), layout.basis.tolist()
    ([6.5, 6.5], [[1.0, 1.0], [1.0, 1.0], [6.0, 6.0]])
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from elastune.planners.cost.montecarlo.nodes import Array
from elastune.planners.cost.pricing.allocation import StagePlan
from elastune.planners.cost.pricing.catalog import InstanceType
from elastune.planners.staging import Profile, StaticFluid, Work, best_rigid, place
from elastune.planners.staging.placement import Placement


@dataclass(frozen=True)
class StageLayout:
    """A stage's placement and its trials' segment times, in rank order."""

    placement: Placement
    mean: Array  # seconds, per trial
    sd: Array  # seconds, per trial
    spread_sd: Array  # of it, the straggler spread's: ``segment_cv`` times the units' mean
    slot_unit: Array  # per slot, the mean time of one unit: what an interruption loses at most
    basis: Array  # 3 x trials: what the calibration's errors in o, c and t scale (above)


def stage_layout(profile: Profile, stage: StagePlan, instance: InstanceType) -> StageLayout:
    """``stage`` on ``instance`` nodes, as given (a simulator that packs passes the stage
    :func:`packed`)."""
    wide = max(stage.sizes)
    if wide > instance.gpus:
        # The profile times workers that share one node (NVLink/PCIe); a trial spanning
        # nodes would all-reduce over the network, which nothing here models.
        raise ValueError(
            f"stage (bracket {stage.bracket}, rung {stage.rung}): a trial of {wide:g} GPUs "
            f"does not fit one {instance.name} node ({instance.gpus} GPUs); the cost model "
            f"times only trials whose workers share one node"
        )
    mean, sd, unit, first, work = [], [], [], [], []
    for tier in stage.tiers:
        m, s = profile.segment(tier.gpus, tier.resource, instance, tier.start == 0)
        per_unit = profile.timing(tier.gpus, instance).mean
        mean += [m] * tier.trials
        sd += [s] * tier.trials
        # a segment shorter than a unit loses all of itself at most
        unit += [per_unit * min(1.0, tier.resource)] * tier.trials
        first += [float(tier.start == 0)] * tier.trials
        work += [per_unit * tier.resource] * tier.trials
    placement = place(stage.sizes, instance.gpus, stage.instances)
    slot_unit = (placement.gather * np.array(unit)[:, None]).max(axis=0)
    basis = np.array([np.ones(len(mean)), first, work])
    spread = np.array(work) * profile.segment_cv
    return StageLayout(placement, np.array(mean), np.array(sd), spread, slot_unit, basis)


def packed(profile: Profile, stage: StagePlan, instance: InstanceType) -> StagePlan:
    """The stage as Fluid runs it (docs/algorithms.md §6.3): its trials are packed over the
    stage's ``instances x gpus`` GPUs, each trial's workers on one node (StaticFluid, or
    one width for all where that is shorter: :func:`elastune.planners.staging.fluid.best_rigid`),
    and take those widths; the nodes, and so the bill's shape, stay the plan's. Where the
    widths would need a slot structure that best-fit placement cannot hold, the stage as
    planned."""
    if any(tier.resource <= 0 for tier in stage.tiers):
        return stage
    unit = profile.timing(1.0, instance).mean
    trials = [tier for tier in stage.tiers for _ in range(tier.trials)]
    packer = StaticFluid(
        profile,
        stage.instances * instance.gpus,
        gpus_per_node=instance.gpus,
        max_share=max(profile.sharing, default=1),
    )
    group = [
        Work(i, t.resource, unit, profile.segment_overhead(t.start == 0))
        for i, t in enumerate(trials)
    ]
    widths = best_rigid(packer, group).widths
    tiers = []
    for index, tier in enumerate(stage.tiers):
        first = sum(t.trials for t in stage.tiers[:index])
        mine = sorted((widths[first + i] for i in range(tier.trials)), reverse=True)
        for width in dict.fromkeys(mine):
            tiers.append(dataclasses.replace(tier, trials=mine.count(width), gpus=width))
    out = stage.replace(tiers=tuple(tiers))
    try:
        place(out.sizes, instance.gpus, stage.instances)
    except ValueError:  # a width that no slot of the first wave has
        return stage
    return out
