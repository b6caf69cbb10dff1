"""What the simulator needs from a learning-curve benchmark: one :class:`Curve` per
configuration (the metric after each epoch, and what the epochs cost), behind the
:class:`Benchmark` protocol. :mod:`elastune.planners.sim.lcbench` implements it for LCBench.

Example (a toy benchmark: accuracy grows with ``x`` and with epochs, one second an epoch):
    >>> class Toy:
    ...     name, max_resource, table = "toy", 3, None
    ...     def curve(self, config):
    ...         return Curve([config["x"] * e / 3 for e in (1, 2, 3)], [1.0, 2.0, 3.0])
    >>> benchmark: Benchmark = Toy()
    >>> benchmark.curve({"x": 0.9}).metric[-1]
    0.9
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Curve:
    """One configuration's learning curve: the metric after each epoch ``1..E`` and the
    cumulative seconds up to each epoch (non-decreasing)."""

    metric: Sequence[float]
    seconds: Sequence[float]


class Benchmark(Protocol):
    """What the simulator needs from a learning-curve benchmark."""

    name: str
    max_resource: int  # epochs a curve has
    # Finite configurations to draw from, or None when any configuration can be evaluated.
    table: Sequence[Mapping[str, Any]] | None

    def curve(self, config: Mapping[str, Any]) -> Curve: ...
