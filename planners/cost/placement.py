"""Placing a stage's trials on nodes (ALGORITHMS.md §5.5): best fit, co-located workers.

Trials are taken largest first; each goes to the open node where it fits most tightly, so
a trial's workers share one node (NVLink/PCIe, no all-reduce over the network). A trial
never spans nodes: the profile's timings assume co-located workers. When the stage holds
fewer nodes than it needs, the trials that find no room wait and run in later waves on a
slot of their size (the one with the fewest trials queued).

Example:
    >>> p = place((1.0, 4.0, 2.0, 1.0), gpus_per_node=4)
    >>> p.nodes, [(s.node, s.offset, s.gpus) for s in p.slots], p.trial_slot
    (2, [(0, 0.0, 4.0), (1, 0.0, 2.0), (1, 2.0, 1.0), (1, 3.0, 1.0)], (2, 0, 1, 3))
    >>> waves = place((2.0,) * 5, gpus_per_node=4, nodes=1)
    >>> waves.trial_slot, waves.waves
    ((0, 1, 0, 1, 0), 3)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
from numpy.typing import NDArray

_EPS = 1e-9  # GPU shares such as 1/3 do not add up exactly


@dataclass(frozen=True)
class Slot:
    """``gpus`` GPUs starting at GPU ``offset`` of stage node ``node``."""

    node: int
    offset: float
    gpus: float


@dataclass(frozen=True)
class Placement:
    """Where each trial of a stage runs. ``trial_slot[i]`` is trial ``i``'s slot."""

    nodes: int
    slots: tuple[Slot, ...]
    trial_slot: tuple[int, ...]

    @cached_property
    def waves(self) -> int:
        """Most trials any one slot runs in turn (1: all trials run at once)."""
        return int(np.bincount(self.trial_slot).max())

    @cached_property
    def slot_of_trial(self) -> NDArray[np.int64]:
        return np.array(self.trial_slot, dtype=np.int64)

    @cached_property
    def slot_nodes(self) -> NDArray[np.int64]:
        """The stage node of every slot."""
        return np.array([slot.node for slot in self.slots], dtype=np.int64)

    @cached_property
    def gather(self) -> NDArray[np.float64]:
        """A ``trials x slots`` 0/1 matrix: durations @ gather = busy time of every slot."""
        matrix = np.zeros((len(self.trial_slot), len(self.slots)))
        matrix[np.arange(len(self.trial_slot)), self.trial_slot] = 1.0
        return matrix


@lru_cache(maxsize=4096)
def place(sizes: tuple[float, ...], gpus_per_node: int, nodes: int | None = None) -> Placement:
    """Best-fit-decreasing placement of trials of ``sizes`` GPUs on at most ``nodes`` nodes.

    ``nodes=None`` opens as many nodes as the trials need to all run at once.
    """
    if not sizes:
        raise ValueError("a stage needs at least one trial")
    if nodes is not None and nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    for g in sizes:
        if not 0 < g <= gpus_per_node + _EPS:
            raise ValueError(
                f"gpus_per_trial {g:g} does not fit one node of {gpus_per_node} GPUs "
                f"(trials never span nodes)"
            )
    free: list[float] = []  # free GPUs per open node
    slots: list[Slot] = []
    trial_slot = [-1] * len(sizes)
    order = sorted(range(len(sizes)), key=lambda i: -sizes[i])  # stable: rank order kept
    waiting = []
    for i in order:
        g = sizes[i]
        fits = [n for n, f in enumerate(free) if f + _EPS >= g]
        if fits:
            node = min(fits, key=lambda n: (free[n], n))
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
            raise ValueError(f"no slot of {sizes[i]:g} GPUs for a trial in a later wave")
        slot = min(same, key=lambda s: (load[s], s))
        load[slot] += 1
        trial_slot[i] = slot
    return Placement(len(free), tuple(slots), tuple(trial_slot))


def nodes_needed(sizes: tuple[float, ...], gpus_per_node: int) -> int:
    """Nodes for all trials of ``sizes`` GPUs to run at once."""
    return place(sizes, gpus_per_node).nodes
