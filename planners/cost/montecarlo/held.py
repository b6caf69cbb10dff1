"""The nodes a chain holds when it is re-planned in flight, and the trials still running on
them (docs/algorithms.md §5.8).

A decision inside a stage (when its first wave has reported) cannot move the trials that have begun
since: they run to their end on the nodes they hold. :class:`Held` names those nodes (the stage they
were provisioned for) and how long each trial still running on them has run. The plan simulator
(``elastune.planners.cost.montecarlo.simulate``) draws each one's segment time from the profile
given that it has run that long (:func:`left_after`), keeps its GPUs busy until it ends, and bills
its node until then: the rest of the stage starts on a GPU once it is free, and the stage after it
starts once every trial of this one has ended.

The running trials take the held stage's slots in order, each timed as that slot's trial:
the driver knows when a segment started, not which GPUs it holds.

Example (three trials of 100 s, sd 10 s, have run 50 s, 100 s and 150 s; their median
times left: the one at half its mean has about half left, the one far past it ends soon):
    >>> import numpy as np
    >>> u = np.array([[0.5, 0.5, 0.5]])
    >>> left = left_after(np.array([50.0, 100.0, 150.0]), np.full(3, 100.0), np.full(3, 10.0),
    ...                   np.ones((1, 1)), u)
    >>> np.round(left, 1).tolist()
    [[50.0, 6.7, 1.3]]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from elastune.planners.cost.montecarlo.nodes import Array
from elastune.planners.cost.pricing.allocation import StagePlan
from elastune.planners.staging.placement import Placement

# The normal's upper tail by erfc, which keeps its precision where 1 - cdf would lose it.
_tail = np.vectorize(lambda a: 0.5 * math.erfc(a / math.sqrt(2)), otypes=[float])
_inv_cdf = np.vectorize(NormalDist().inv_cdf, otypes=[float])
_TINY = 1e-300  # inv_cdf needs 0 < p < 1


@dataclass(frozen=True)
class Held:
    """A chain's nodes in flight: the stage they were provisioned for, and the seconds each
    of its trials still running on them has run (none: the nodes are idle)."""

    stage: StagePlan
    running: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if any(not s >= 0 for s in self.running):
            raise ValueError(f"running: seconds run must be >= 0, got {self.running}")

    @property
    def key(self) -> tuple[int, int]:
        """The held stage's (bracket, rung)."""
        return (self.stage.bracket, self.stage.rung)


def left_after(ran: Array, mean: Array, sd: Array, speed: Array, u: Array) -> Array:
    """Seconds left (S x r) of ``r`` running segments that have run ``ran`` seconds each,
    their time ``max(mean + sd * z, 0) * speed`` (``mean`` and ``sd`` r or S x r, ``speed``
    S x 1) with ``z`` a standard normal drawn by inversion of ``u`` (S x r) given that the
    time exceeds ``ran``. A segment whose spread is 0 and whose time has passed ends now."""
    bound = ran / speed - mean  # S x r: past the mean by, at the run's speed
    spread = sd > 0
    a = np.where(spread, bound / np.where(spread, sd, 1.0), np.copysign(np.inf, bound))
    # z above a: -inv_cdf((1 - u) * tail(a)), which keeps its precision far in the tail.
    tail = _tail(a)
    z = np.where(tail > 0, -_inv_cdf(np.clip((1.0 - u) * tail, _TINY, 1.0 - 1e-16)), 0.0)
    seconds = np.maximum(mean + sd * z, 0.0) * speed
    return np.maximum(seconds - ran, 0.0)


def gpu_free(placement: Placement, nodes: int, gpus_per_node: int, left: Array) -> Array:
    """When each GPU of the ``nodes`` held is free (S x nodes x gpus_per_node), running
    trial ``k`` (``left``'s column, S x r) on the slot of the held stage's trial ``k``."""
    free = np.zeros((left.shape[0], nodes, gpus_per_node))
    trials = len(placement.trial_slot)
    for k in range(left.shape[1]):
        slot = placement.slots[placement.trial_slot[k % trials]]
        on, gpus = _span(slot.node, slot.span, slot.offset, slot.gpus, gpus_per_node)
        free[:, on, gpus] = np.maximum(free[:, on, gpus], left[:, k, None, None])
    return free


def slot_free(placement: Placement, gpus_per_node: int, free: Array) -> Array:
    """When each slot of ``placement`` (a stage on the held nodes, the first of them the
    held ones) finds its GPUs free (S x slots): 0 on nodes beyond ``free``'s."""
    out = np.zeros((free.shape[0], len(placement.slots)))
    for index, slot in enumerate(placement.slots):
        nodes, gpus = _span(slot.node, slot.span, slot.offset, slot.gpus, gpus_per_node)
        nodes = slice(nodes.start, min(nodes.stop, free.shape[1]))
        if nodes.start < nodes.stop:
            out[:, index] = free[:, nodes, gpus].max(axis=(1, 2))
    return out


def _span(node: int, span: int, offset: float, gpus: float, per_node: int) -> tuple[slice, slice]:
    """The nodes and the GPUs on each of a slot (a share of a GPU holds the whole GPU)."""
    if span > 1:
        return slice(node, node + span), slice(0, per_node)
    low = math.floor(offset + 1e-9)
    return slice(node, node + 1), slice(low, max(low + 1, math.ceil(offset + gpus - 1e-9)))
