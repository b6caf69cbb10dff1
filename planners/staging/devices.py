"""Which of the machine's CUDA devices each running segment trains on.

Segments of a local job (``compute.pool: local``) run side by side in the driver's worker
processes, as a warm node's do in its own. On a machine with several GPUs they must not all
train on ``cuda:0``: a segment of width ``g >= 1`` gets ``ceil(g)`` devices, the least
loaded ones; a share ``g < 1`` goes to the least loaded device. The flow's admission
(``compute.workers``, or the stage packer's GPU count) keeps the load within the machine,
so devices are shared only when a job runs more segments at once than the machine has
devices.

Example (four GPUs: a wide segment, a whole one, two halves of the last device):
    >>> devices = LocalDevices(4)
    >>> [devices.take(t, g) for t, g in enumerate([2.0, 1.0, 0.5, 0.5])]
    [(0, 1), (2,), (3,), (3,)]
    >>> devices.release(0)
    >>> devices.take(4, 2.0)
    (0, 1)
"""

from __future__ import annotations

import math


class LocalDevices:
    """Device ids per running trial (a trial runs one segment at a time).

    Args:
        count: CUDA devices of this machine (>= 1).
    """

    def __init__(self, count: int):
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        self.load = [0.0] * count  # GPUs' worth of segments on each device
        self._held: dict[int, tuple[tuple[int, ...], float]] = {}  # by trial

    def take(self, trial: int, width: float) -> tuple[int, ...]:
        """The devices ``trial``'s next segment trains on, at ``width`` GPUs."""
        if trial in self._held:
            raise ValueError(f"trial {trial} already holds devices {self._held[trial][0]}")
        n = min(len(self.load), max(1, math.ceil(width - 1e-9)))
        ids = tuple(sorted(sorted(range(len(self.load)), key=lambda d: (self.load[d], d))[:n]))
        share = width / n
        for device in ids:
            self.load[device] += share
        self._held[trial] = (ids, share)
        return ids

    def release(self, trial: int) -> None:
        """``trial``'s segment ended: its devices are free again."""
        ids, share = self._held.pop(trial)
        for device in ids:
            self.load[device] -= share
