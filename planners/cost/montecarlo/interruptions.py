"""Spot interruptions in the plan simulator (:mod:`.simulate`) [OWN model].

A stage may run on spot instances (``StagePlan.market``), at the catalog's discounted
price. Each running spot instance is interrupted as a Poisson process at the catalog's rate
(exponential running times; an instance that is starting is not running, so it is not
interrupted). When an instance is interrupted:

- it is billed up to the interruption by the usual rule, and its replacement from its
  own request (so each pays its own minimum charge and rounding);
- a replacement is requested at once and is ready after a new queueing plus startup draw;
- every segment running on it loses the work since its last checkpoint. Segments
  checkpoint at every resource unit, so the loss is a uniform part of one unit (half a
  unit on average; the whole segment if it is shorter than a unit), and each redoes
  that loss plus the profile's ``overhead_s`` (restore) on the replacement, after it is
  ready. Slots on the node that had already finished lose nothing (:func:`while_busy`).

An instance interrupted while its pool idles at a barrier is replaced at once when a
later stage keeps it (the replacement may still be starting when that stage begins:
:func:`while_idle`), and merely billed up to the interruption when it was going to be
released. A change of market, like a change of type, releases the pool. The nominal trace
prices spot nodes but plays no interruption (a mean run has a fraction of one).

Example (two spot nodes kept at a barrier at 900 s; the first was interrupted at 600 s,
billed up to then and replaced at once, its replacement ready 175 s later):
    >>> import numpy as np
    >>> from elastune.planners.cost.pricing.allocation import GpuTier, StagePlan
    >>> from elastune.planners.cost.pricing.catalog import read_catalog
    >>> g5 = read_catalog().get("g5.xlarge")
    >>> stage = StagePlan(0, 1, (GpuTier(2, 1.0, 1.0),), "g5.xlarge", 2, market="spot")
    >>> fails = np.array([[600.0, 5000.0]])
    >>> pool = NodePool(g5, "spot", np.zeros((1, 2)), np.full((1, 2), 120.0), fails)
    >>> kept, billed = while_idle(Draws(seed=0, samples=1), stage, pool, np.array([900.0]))
    >>> kept.request.tolist(), kept.ready.round().tolist(), round(float(billed[0]), 4)
    ([[600.0, 0.0]], [[775.0, 120.0]], 0.0671)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from elastune.planners.cost.montecarlo.draws import SPOT, Draws
from elastune.planners.cost.montecarlo.nodes import Array, NodePool
from elastune.planners.cost.pricing.allocation import StagePlan
from elastune.planners.staging.placement import Placement

MAX_ROUNDS = 1000  # replacements per node and stage before a stage counts as never ending


def while_busy(
    draws: Draws,
    restore_s: float,
    stage: StagePlan,
    placement: Placement,
    pool: NodePool,
    busy: Array,
    unit: Array,
) -> tuple[Array, NodePool, Array, Array]:
    """Spot interruptions while ``stage`` trains: per slot, ``busy`` (S x slots) is when
    it would finish if nothing more were interrupted. A node whose instance is interrupted
    while one of its slots is busy is replaced (queueing plus startup); each busy slot on
    it redoes the work since its last checkpoint (a uniform part of one resource unit,
    ``unit``) plus ``restore_s``, on the replacement. Returns the new ends, the pool, the
    interrupted instances' bills and their count."""
    assert pool.fails is not None
    rate = pool.instance.interruptions_per_second(pool.market)
    nodes = placement.slot_nodes
    onto = np.zeros((len(nodes), pool.count))  # slot -> its node
    onto[np.arange(len(nodes)), nodes] = 1.0
    request, ready, fails = pool.request, pool.ready, pool.fails
    charges, hits = np.zeros(draws.samples), np.zeros(draws.samples)
    for round_ in range(MAX_ROUNDS):
        hit = (fails[:, nodes] < busy) & np.isfinite(busy)  # interrupted while busy
        node_hit = (hit @ onto) > 0
        if not node_hit.any():
            break
        base = SPOT + 8 * round_
        gone = dataclasses.replace(pool, request=request, ready=ready)
        charges = charges + np.where(node_hit, gone.charge(fails), 0.0).sum(axis=1)
        down = draws.delays(pool.instance, stage, (base, base + 1), pool.count)
        redo = draws.uniforms(stage.bracket, stage.rung, base + 2, len(nodes)) * unit
        request = np.where(node_hit, fails, request)
        ready = np.where(node_hit, fails + down, ready)
        busy = np.where(hit, busy + down[:, nodes] + redo + restore_s, busy)
        life = draws.lifetimes(stage, base + 3, pool.count, rate)
        fails = np.where(node_hit, ready + life, fails)
        hits = hits + node_hit.sum(axis=1)
    else:
        # Interrupted far more often than a unit of work completes: it never finishes.
        busy = np.where(fails[:, nodes] < busy, np.inf, busy)
    pool = dataclasses.replace(pool, request=request, ready=ready, fails=fails)
    return busy, pool, charges, hits


def while_idle(
    draws: Draws, stage: StagePlan, pool: NodePool, now: Array
) -> tuple[NodePool, Array]:
    """Instances of a kept spot pool interrupted while idle (before the barrier at
    ``now``) were replaced at once: bill them up to the interruption and give their
    nodes the replacement's request and ready times."""
    assert pool.fails is not None
    rate = pool.instance.interruptions_per_second(pool.market)
    request, ready, fails = pool.request, pool.ready, pool.fails
    charges = np.zeros(len(now))
    for round_ in range(MAX_ROUNDS):
        hit = (fails < now[:, None]) & np.isfinite(now)[:, None]
        if not hit.any():
            break
        base = SPOT + 8 * round_ + 4
        gone = dataclasses.replace(pool, request=request, ready=ready)
        charges = charges + np.where(hit, gone.charge(fails), 0.0).sum(axis=1)
        down = draws.delays(pool.instance, stage, (base, base + 1), pool.count)
        request = np.where(hit, fails, request)
        ready = np.where(hit, fails + down, ready)
        life = draws.lifetimes(stage, base + 2, pool.count, rate)
        fails = np.where(hit, ready + life, fails)
    return dataclasses.replace(pool, request=request, ready=ready, fails=fails), charges
