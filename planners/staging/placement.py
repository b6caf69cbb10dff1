"""Placing a stage's trials on GPU nodes (docs/algorithms.md §5.5): best fit, largest first.

Trials are taken largest first. A trial that fits one node goes to the open node where it
fits most tightly, so its workers share NVLink/PCIe and never all-reduce over the network.
A trial wider than a node takes ``ceil(g / gpus_per_node)`` whole nodes that nothing else
shares. When the stage holds fewer nodes than it needs (``nodes``), the trials that find
no room wait and run in later waves on a slot of their size (the one with the fewest trials
queued). ``nodes_needed`` is what the cluster must provide for all trials to run at once.

Example:
    >>> p = place((1.0, 4.0, 2.0, 1.0), gpus_per_node=4)
    >>> p.nodes, [(s.node, s.offset, s.gpus) for s in p.slots], p.trial_slot
    (2, [(0, 0.0, 4.0), (1, 0.0, 2.0), (1, 2.0, 1.0), (1, 3.0, 1.0)], (2, 0, 1, 3))
    >>> place([2, 2, 2, 1, 1], gpus_per_node=4).node_trials
    ((0, 1), (2, 3, 4))
    >>> waves = place((2.0,) * 5, gpus_per_node=4, nodes=1)
    >>> waves.trial_slot, waves.waves
    ((0, 1, 0, 1, 0), 3)
    >>> nodes_needed([8, 1], gpus_per_node=4), nodes_needed([0.5] * 6, gpus_per_node=1)
    (3, 3)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
from numpy.typing import NDArray

_EPS = 1e-9  # GPU shares such as 1/3 do not add up exactly


@dataclass(frozen=True)
class Slot:
    """``gpus`` GPUs starting at GPU ``offset`` of stage node ``node``.

    A trial wider than a node has a slot of ``span`` whole nodes, ``node`` the first.
    """

    node: int
    offset: float
    gpus: float
    span: int = 1


@dataclass(frozen=True)
class Placement:
    """Where each trial of a stage runs. ``trial_slot[i]`` is trial ``i``'s slot."""

    nodes: int
    slots: tuple[Slot, ...]
    trial_slot: tuple[int, ...]

    @cached_property
    def waves(self) -> int:
        """Most trials any one slot runs in turn (1: all trials run at once)."""
        return int(np.bincount(self.trial_slot).max()) if self.trial_slot else 0

    @cached_property
    def node_trials(self) -> tuple[tuple[int, ...], ...]:
        """The trials of every node, in opening order; a wide trial is in each of its nodes."""
        nodes: list[list[int]] = [[] for _ in range(self.nodes)]
        for index, slot in enumerate(self.slots):
            for trial in np.flatnonzero(self.slot_of_trial == index):
                for node in range(slot.node, slot.node + slot.span):
                    nodes[node].append(int(trial))
        return tuple(tuple(node) for node in nodes)

    @cached_property
    def slot_of_trial(self) -> NDArray[np.int64]:
        return np.array(self.trial_slot, dtype=np.int64)

    @cached_property
    def slot_nodes(self) -> NDArray[np.int64]:
        """The (first) stage node of every slot."""
        return np.array([slot.node for slot in self.slots], dtype=np.int64)

    @cached_property
    def gather(self) -> NDArray[np.float64]:
        """A ``trials x slots`` 0/1 matrix: durations @ gather = busy time of every slot."""
        matrix = np.zeros((len(self.trial_slot), len(self.slots)))
        matrix[np.arange(len(self.trial_slot)), self.trial_slot] = 1.0
        return matrix


def place(sizes: Sequence[float], gpus_per_node: int, nodes: int | None = None) -> Placement:
    """Best-fit-decreasing placement of trials of ``sizes`` GPUs on at most ``nodes`` nodes.

    ``nodes=None`` opens as many nodes as the trials need to all run at once.
    """
    return _place(tuple(sizes), gpus_per_node, nodes)


@lru_cache(maxsize=4096)  # planners place the same stage for many candidate plans
def _place(sizes: tuple[float, ...], gpus_per_node: int, nodes: int | None) -> Placement:
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be >= 1, got {gpus_per_node}")
    if nodes is not None and nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    for index, g in enumerate(sizes):
        if not 0 < g < math.inf:
            raise ValueError(f"sizes[{index}] (GPUs per trial) must be > 0 and finite, got {g}")
    free: list[float] = []  # free GPUs per open node
    slots: list[Slot] = []
    trial_slot = [-1] * len(sizes)
    order = sorted(range(len(sizes)), key=lambda i: -sizes[i])  # stable: rank order kept
    waiting = []
    for i in order:
        g = sizes[i]
        if g > gpus_per_node + _EPS:
            span = math.ceil(g / gpus_per_node - _EPS)
            if nodes is not None and len(free) + span > nodes:
                waiting.append(i)
                continue
            slots.append(Slot(len(free), 0.0, g, span))
            free += [0.0] * span  # whole nodes: nothing else shares them
            trial_slot[i] = len(slots) - 1
            continue
        fitting = best_fit(free, g)
        if fitting is not None:
            node = fitting
        elif nodes is None or len(free) < nodes:
            free.append(float(gpus_per_node))
            node = len(free) - 1
        else:
            waiting.append(i)
            continue
        slots.append(Slot(node, gpus_per_node - free[node], g))
        free[node] -= g
        trial_slot[i] = len(slots) - 1
    load = [1] * len(slots)
    for i in waiting:
        same = [s for s, slot in enumerate(slots) if abs(slot.gpus - sizes[i]) < _EPS]
        if not same:
            raise ValueError(
                f"no slot of {sizes[i]:g} GPUs on {nodes} node(s) of {gpus_per_node} GPUs "
                f"for a trial in a later wave"
            )
        slot = min(same, key=lambda s: (load[s], s))
        load[slot] += 1
        trial_slot[i] = slot
    return Placement(len(free), tuple(slots), tuple(trial_slot))


def fits(free: float, g: float) -> bool:
    """Do ``g`` GPUs fit in ``free`` ones (shares such as 0.1 + 0.2 given back leave
    0.9999999999999999)?

    >>> fits(1.0 - 0.1 - 0.2 + 0.2 + 0.1, 1.0), fits(0.5, 1.0)
    (True, False)
    """
    return free + _EPS >= g


def best_fit(free: Sequence[float], g: float) -> int | None:
    """The node where ``g`` GPUs fit most tightly, given each node's ``free`` GPUs (the
    lowest index on a tie); None if none has room.

    >>> best_fit([4.0, 1.0, 2.0], 1.5), best_fit([1.0], 2.0)
    (2, None)
    """
    room = [n for n, f in enumerate(free) if fits(f, g)]
    return min(room, key=lambda n: (free[n], n)) if room else None


def nodes_needed(sizes: Sequence[float], gpus_per_node: int) -> int:
    """Nodes for all trials of ``sizes`` GPUs to run at once (0 for no trials)."""
    return place(sizes, gpus_per_node).nodes
