"""Sizing a stage's allocation: trials per node, waves, nodes, and the quota per bracket.

The arithmetic the planners share (RubberBand's moves, the static baselines): a stage of
``n`` trials on ``g`` GPUs each fits ``per_node`` trials on a node and runs in as few waves
as its nodes allow; brackets run side by side, each with a share of the GPU quota in
proportion to its work.

Example (9 trials of 2 GPUs on 4-GPU nodes: 2 per node, all at once on 5 nodes; or on 3,
in two waves):
    >>> from elastune.planners.cost.pricing.catalog import read_catalog
    >>> from elastune.planners.staging import Stage
    >>> node = read_catalog().get("g5.12xlarge")
    >>> stage = build_stage(Stage(0, 0, 9, 0, 1), 2.0, node, cap=None)
    >>> per_node(node, 2.0), stage.instances, fewer_nodes(stage, node)
    (2, 5, 3)
    >>> split(10, [3.0, 1.0])
    [7, 3]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import groupby

from elastune.planners.cost.pricing.allocation import GpuTier, StagePlan
from elastune.planners.cost.pricing.catalog import Catalog, InstanceType
from elastune.planners.staging import Profile, Stage, place


def chains_of(stages: Sequence[Stage]) -> list[list[Stage]]:
    """The job's stages grouped into one chain per bracket, in rung order."""
    ordered = sorted(stages, key=lambda s: (s.bracket, s.rung))
    return [list(chain) for _, chain in groupby(ordered, key=lambda s: s.bracket)]


def split(total: int, weights: Sequence[float]) -> list[int] | None:
    """``total`` split in proportion to ``weights`` (largest remainder), at least 1 each.

    None when ``total`` is smaller than the number of parts.
    """
    if total < len(weights):
        return None
    spare = total - len(weights)
    exact = [spare * w / sum(weights) for w in weights]
    shares = [1 + math.floor(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: -(exact[i] - math.floor(exact[i])))
    for i in by_remainder[: total - sum(shares)]:
        shares[i] += 1
    return shares


def chain_work(chain: Sequence[Stage]) -> float:
    """Resource units trained by a chain, resuming from checkpoints."""
    return sum(stage.work for stage in chain)


def per_node(instance: InstanceType, gpus: float) -> int:
    """Trials of ``gpus`` GPUs that fit one node (co-located, best fit)."""
    return int(instance.gpus / gpus + 1e-9)


def nodes_for(trials: int, slots_per_node: int, waves: int) -> int:
    """The fewest nodes that run ``trials`` in ``waves`` waves."""
    return math.ceil(math.ceil(trials / waves) / slots_per_node)


def wave_nodes(trials: int, slots_per_node: int, nodes: int | None) -> int:
    """The fewest nodes that run ``trials`` in as few waves as ``nodes`` nodes do (all at
    once when ``nodes`` is None): more nodes would only idle in the last wave."""
    waves = 1 if nodes is None else math.ceil(trials / (nodes * slots_per_node))
    return nodes_for(trials, slots_per_node, waves)


def build_stage(
    stage: Stage,
    gpus: float,
    instance: InstanceType,
    cap: int | None,
    hold: bool = False,
    market: str = "on-demand",
) -> StagePlan:
    """``stage`` on ``gpus`` GPUs per trial, in as few waves as ``cap`` nodes allow (all at
    once without a cap) on the fewest nodes that do it, or on exactly ``cap`` nodes when
    ``hold`` (a static pool), on ``market``."""
    if hold and cap is not None:
        nodes = cap
    else:
        nodes = wave_nodes(stage.trials, per_node(instance, gpus), cap)
    tier = GpuTier(stage.trials, gpus, stage.stop - stage.start, stage.start)
    return StagePlan(stage.bracket, stage.rung, (tier,), instance.name, nodes, market)


def fastest_stage(
    profile: Profile,
    stage: Stage,
    instance: InstanceType,
    cap: int | None,
    hold: bool = False,
    market: str = "on-demand",
) -> StagePlan:
    """The GPUs per trial that finish ``stage`` soonest on at most ``cap`` nodes (mean
    times, waves counted); ties go to fewer GPUs."""

    def finish(g: float) -> tuple[float, float]:
        waves = place((g,) * stage.trials, instance.gpus, cap).waves
        seconds = profile.segment(g, stage.stop - stage.start, instance, stage.start == 0)[0]
        return waves * seconds, g

    best = min(profile.counts_for(instance), key=finish)
    return build_stage(stage, best, instance, cap, hold, market)


def fewer_nodes(stage: StagePlan, instance: InstanceType) -> int | None:
    """Nodes for the next wave count that needs fewer nodes (None on one node)."""
    slots = per_node(instance, stage.tiers[0].gpus)
    waves = math.ceil(stage.trials / (stage.instances * slots))
    for more in range(waves + 1, stage.trials + 1):
        nodes = nodes_for(stage.trials, slots, more)
        if nodes < stage.instances:
            return nodes
    return None


def shrink_pool(chain: tuple[StagePlan, ...], catalog: Catalog) -> tuple[StagePlan, ...] | None:
    """The chain with its largest pool one wave smaller and no stage holding more GPUs
    than that: a bracket-wide cut, so a later stage never has to provision nodes an
    earlier one released (one-stage cuts cannot get there without first paying for it)."""
    held = [s.instances * catalog.get(s.instance_type).gpus for s in chain]
    peak = max(range(len(chain)), key=lambda k: held[k])
    fewer = fewer_nodes(chain[peak], catalog.get(chain[peak].instance_type))
    if fewer is None:
        return None
    cap = fewer * catalog.get(chain[peak].instance_type).gpus
    out = []
    for stage, gpus in zip(chain, held, strict=True):
        if gpus > cap:
            instance = catalog.get(stage.instance_type)
            slots = per_node(instance, stage.tiers[0].gpus)
            nodes = wave_nodes(stage.trials, slots, max(1, cap // instance.gpus))
            stage = stage.replace(instances=nodes)
        out.append(stage)
    return tuple(out)
