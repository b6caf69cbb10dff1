"""Placement of trials on GPU nodes: best fit, largest first (ALGORITHMS.md §5.5).

A trial that fits on one node goes to the open node where it fits most tightly, so its
workers share NVLink/PCIe and never all-reduce over the network. A trial wider than a node
takes ``ceil(g / gpus_per_node)`` whole nodes that nothing else shares. The node count of
a stage is what the cluster must provide before the stage starts.

Example:
    >>> place([2, 2, 2, 1, 1], gpus_per_node=4)
    [(0, 1), (2, 3, 4)]
    >>> nodes_needed([8, 1], gpus_per_node=4)
    3
    >>> nodes_needed([0.5] * 6, gpus_per_node=1)
    3
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# GPU widths such as 1/3 are not exact in binary; a trial still fits a node's remainder
# when it misses by rounding only.
_EPS = 1e-9


def place(gpus: Sequence[float], gpus_per_node: int) -> list[tuple[int, ...]]:
    """Nodes in opening order, each the indices (into ``gpus``) of the trials it holds.

    A trial wider than a node appears in each of the whole nodes it spans.
    """
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be >= 1, got {gpus_per_node}")
    for index, g in enumerate(gpus):
        if not g > 0:
            raise ValueError(f"gpus[{index}] must be > 0, got {g}")
    nodes: list[list[int]] = []
    free: list[float] = []
    # Stable sort: trials of equal width keep their order, so placements are reproducible.
    for index in sorted(range(len(gpus)), key=lambda i: -gpus[i]):
        g = gpus[index]
        if g > gpus_per_node + _EPS:
            for _ in range(math.ceil(g / gpus_per_node - _EPS)):
                nodes.append([index])
                free.append(0.0)
            continue
        fits = [n for n in range(len(nodes)) if free[n] >= g - _EPS]
        if fits:
            best = min(fits, key=lambda n: free[n])
        else:
            nodes.append([])
            free.append(float(gpus_per_node))
            best = len(nodes) - 1
        nodes[best].append(index)
        free[best] -= g
    return [tuple(node) for node in nodes]


def nodes_needed(gpus: Sequence[float], gpus_per_node: int) -> int:
    """How many nodes of ``gpus_per_node`` GPUs hold trials of these widths (§5.5)."""
    return len(place(gpus, gpus_per_node))
