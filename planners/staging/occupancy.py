"""Which trials hold which GPUs of a packer's pool, node by node.

Example (two nodes of two GPUs: a two-GPU trial, then two halves sharing one GPU):
    >>> from fractions import Fraction
    >>> gpus = GpuOccupancy(total=4, gpus_per_node=2)
    >>> gpus.occupy(0, Fraction(2), (0, 1))
    >>> gpus.find(Fraction(1, 2))
    (1, (2,))
    >>> gpus.occupy(1, Fraction(1, 2), (2,))
    >>> gpus.find(Fraction(1, 2)), gpus.find(Fraction(2))
    ((1, (2,)), None)
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction


class GpuOccupancy:
    """GPUs ``0..total-1``, ``gpus_per_node`` to a node (the last node may be smaller).

    A GPU is free, held whole by one trial, or shared by trials of widths ``1/c``: ``n`` of
    them fit while ``n <= c`` for each, so every one runs at ``sigma(n) >= sigma(c)``, at least
    the speed the packer assumed for it (sigma never rises with ``c``)."""

    def __init__(self, total: int, gpus_per_node: int):
        self.total = total
        self.gpus_per_node = gpus_per_node
        self.holders: dict[int, set[int]] = {}
        self.share: dict[int, int] = {}  # trial -> c, for trials of width 1/c

    @property
    def largest_node(self) -> int:
        return min(self.total, self.gpus_per_node)

    def _nodes(self) -> dict[int, list[int]]:
        nodes: dict[int, list[int]] = {}
        for gpu in range(self.total):
            nodes.setdefault(gpu // self.gpus_per_node, []).append(gpu)
        return nodes

    def find(self, width: Fraction, mover: int | None = None) -> tuple[int, tuple[int, ...]] | None:
        """Best fit for ``width``, as if ``mover`` (a running trial) had left; None if none."""

        def others(gpu: int) -> set[int]:
            return self.holders.get(gpu, set()) - {mover}

        if width < 1:
            c = width.denominator
            shared = []
            for gpu in range(self.total):
                sharers = others(gpu)
                caps = [self.share.get(t, 0) for t in sharers]
                if sharers and len(sharers) + 1 <= min([c, *caps]):
                    shared.append(gpu)
            if shared:
                # Join the fullest shared GPU, so the others stay whole for wide trials.
                gpu = min(shared, key=lambda g: (-len(others(g)), g))
                return gpu // self.gpus_per_node, (gpu,)
            width = Fraction(1)
        need = int(width)
        best = None
        for node, gpus in self._nodes().items():
            idle = [g for g in gpus if not others(g)]
            # Best fit: the node left with the fewest free GPUs keeps big holes for wide trials.
            if len(idle) >= need and (best is None or len(idle) < len(best[1])):
                best = (node, idle)
        return None if best is None else (best[0], tuple(best[1][:need]))

    def occupy(self, trial: int, width: Fraction, gpus: tuple[int, ...]) -> None:
        for gpu in gpus:
            self.holders.setdefault(gpu, set()).add(trial)
        if width < 1:
            self.share[trial] = width.denominator

    def release(self, trial: int, gpus: Iterable[int]) -> None:
        for gpu in gpus:
            self.holders.get(gpu, set()).discard(trial)
        self.share.pop(trial, None)

    def resize(self, total: int) -> set[int]:
        """Grow or shrink to ``total`` GPUs (highest ids go first); the trials displaced."""
        displaced = {t for g, hs in self.holders.items() if g >= total for t in hs}
        self.holders = {g: hs for g, hs in self.holders.items() if g < total}
        self.total = total
        return displaced
