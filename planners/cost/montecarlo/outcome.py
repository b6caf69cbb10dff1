"""What the plan simulator returns: per-sample JCT and cost, per chain and per stage.

Plans are judged on a quantile of the samples (p95): :func:`quantile` computes it,
:func:`upper_quantile` bounds it from above where few samples see a rare event.

Example:
    >>> import numpy as np
    >>> samples = np.arange(1.0, 101.0)
    >>> quantile(samples, 0.95), upper_quantile(samples, 0.95, 0.95)
    (95.05, 99.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from statistics import NormalDist

import numpy as np

from elastune.planners.cost.montecarlo.nodes import Array, NodePool


@dataclass(frozen=True)
class ChainRun:
    """One chain simulated: per-sample end and cost, per-stage times and spend weights."""

    end: Array
    released_cost: Array  # nodes released before the chain's end
    closing_cost: Array  # the nodes still held, released at the chain's end
    held: tuple[NodePool, ...]
    starts: tuple[Array, ...]
    ends: tuple[Array, ...]
    rates: tuple[float, ...]  # $/s of the nodes each stage holds, to attribute the bill
    interruptions: tuple[Array, ...]  # per stage: spot instances lost while it trains

    @cached_property
    def total_mean(self) -> float:
        """Mean cost of the chain when it releases its nodes at its own end."""
        return float((self.released_cost + self.closing_cost).mean())

    @property
    def spend(self) -> tuple[float, ...]:
        """Mean dollars of node time per stage, barrier to barrier (list or spot price)."""
        barriers = (np.zeros_like(self.end), *self.ends)
        return tuple(
            rate * float((end - before).mean())
            for rate, before, end in zip(self.rates, barriers, self.ends, strict=False)
        )


@dataclass(frozen=True)
class StageOutcome:
    """Per-sample training start and end of one stage, its share of the mean cost, and
    the mean number of its spot instances interrupted while it trains."""

    start: Array
    end: Array
    cost: float
    interruptions: float = 0.0


def quantile(values: Array, q: float) -> float:
    """``np.quantile(values, q)`` (linear interpolation) by partial sort: planners ask
    for it on every candidate plan."""
    position = q * (len(values) - 1)
    low = int(position)
    high = min(low + 1, len(values) - 1)
    part = np.partition(values, (low, high))
    if part[high] == part[low]:  # also when both are inf (a spot stage that never ends)
        return float(part[low])
    return float(part[low] + (part[high] - part[low]) * (position - low))


def upper_quantile(values: Array, q: float, confidence: float) -> float:
    """A one-sided upper confidence bound of the ``q``-quantile of the distribution that
    ``values`` sample: the order statistic at or above the true quantile with probability
    ``confidence`` (normal approximation to the binomial count below the quantile)."""
    n = len(values)
    z = NormalDist().inv_cdf(confidence)
    rank = min(max(math.ceil(n * q + z * math.sqrt(n * q * (1 - q))), 1), n)
    return float(np.partition(values, rank - 1)[rank - 1])


@dataclass(frozen=True)
class Outcome:
    """Per-sample JCT (s) and cost ($) of a plan; ``quantile`` is the feasibility level."""

    jct: Array
    cost: Array
    quantile: float
    chains: tuple[tuple[ChainRun, Array], ...]  # each chain's run and its total cost

    @property
    def jct_q(self) -> float:
        return quantile(self.jct, self.quantile)

    @property
    def cost_q(self) -> float:
        return quantile(self.cost, self.quantile)

    @property
    def cost_mean(self) -> float:
        return float(self.cost.mean())

    @property
    def stages(self) -> tuple[StageOutcome, ...]:
        """Per stage, in plan order; the chain's mean bill split by node-time spent."""
        out = []
        for run, total in self.chains:
            spend = run.spend
            weight = sum(spend) or 1.0
            out += [
                StageOutcome(start, end, float(total.mean()) * share / weight, float(lost.mean()))
                for start, end, share, lost in zip(
                    run.starts, run.ends, spend, run.interruptions, strict=True
                )
            ]
        return tuple(out)

    @property
    def interruptions(self) -> Array:
        """Per sample, the spot instances interrupted while training, over all stages."""
        per_stage = (x for run, _ in self.chains for x in run.interruptions)
        return sum(per_stage, np.zeros_like(self.jct))

    def summary(self, values: Array) -> dict[str, float]:
        """p50, p95 and mean of ``jct`` or ``cost``."""
        p50, p95 = np.quantile(values, [0.5, 0.95])
        return {"p50": float(p50), "p95": float(p95), "mean": float(values.mean())}
