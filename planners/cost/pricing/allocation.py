"""Allocation plans: what the cost planners produce and the simulator prices.

A plan is one chain of stages per bracket (Hyperband's brackets are independent chains that
run side by side; SHA has one). A stage names the instance type, its market (on-demand, or
spot: discounted but interrupted at the catalog's rate) and how many instances it holds,
and splits its trials into GPU tiers: trials that share a GPU count per trial and train
the same resource in the stage. RubberBand stages have one tier; a SEER stage has
one per tier (docs/algorithms.md §4.2).

Example:
    >>> stage = StagePlan(0, 0, (GpuTier(8, 2.0, 1.0),), "p3.8xlarge", 4)
    >>> stage.trials, stage.gpus, stage.gpus_label, stage.market
    (8, 16.0, '2', 'on-demand')
    >>> AllocationPlan(((stage,),)).on_market("spot").stages[0].market
    'spot'
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from elastune.planners.cost.pricing.catalog import MARKETS


@dataclass(frozen=True)
class GpuTier:
    """``trials`` trials of a stage, each on ``gpus`` GPUs, each training ``resource`` units
    from level ``start`` (what they had reached when the stage began)."""

    trials: int
    gpus: float
    resource: float
    start: float = 0.0

    @property
    def stop(self) -> float:
        return self.start + self.resource

    def __post_init__(self) -> None:
        if self.trials < 1:
            raise ValueError(f"trials must be >= 1, got {self.trials}")
        if not self.gpus > 0:
            raise ValueError(f"gpus per trial must be > 0, got {self.gpus}")
        if not self.resource >= 0:
            raise ValueError(f"resource must be >= 0, got {self.resource}")


@dataclass(frozen=True)
class StagePlan:
    """One stage of bracket ``bracket`` (rung ``rung``) on ``instances`` nodes of ``market``."""

    bracket: int
    rung: int
    tiers: tuple[GpuTier, ...]
    instance_type: str
    instances: int
    market: str = "on-demand"

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ValueError("a stage needs at least one tier")
        if self.instances < 1:
            raise ValueError(f"instances must be >= 1, got {self.instances}")
        if self.market not in MARKETS:
            raise ValueError(f"market must be one of {MARKETS}, got {self.market!r}")
        # Planners look plans up by their stages thousands of times: hash once.
        fields = (self.bracket, self.rung, self.tiers, self.instance_type, self.instances)
        fields += (self.market,)
        object.__setattr__(self, "_hash", hash(fields))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    @property
    def name(self) -> str:
        return f"b{self.bracket}-r{self.rung}"

    @property
    def trials(self) -> int:
        return sum(t.trials for t in self.tiers)

    @property
    def gpus(self) -> float:
        """GPUs the stage's trials use when all run at once."""
        return sum(t.trials * t.gpus for t in self.tiers)

    @property
    def sizes(self) -> tuple[float, ...]:
        """GPUs of every trial, in rank order (the first tier holds the best trials)."""
        return tuple(t.gpus for t in self.tiers for _ in range(t.trials))

    @property
    def gpus_label(self) -> str:
        if len(self.tiers) == 1:
            return f"{self.tiers[0].gpus:g}"
        return ", ".join(f"{t.gpus:g}×{t.trials}" for t in self.tiers)

    def replace(self, **changes: object) -> StagePlan:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class AllocationPlan:
    """Stages per bracket. ``hold``: a static pool, every node held until the job ends."""

    chains: tuple[tuple[StagePlan, ...], ...]
    hold: bool = False

    def __post_init__(self) -> None:
        if not self.chains or not all(self.chains):
            raise ValueError("a plan needs at least one stage in every chain")

    @property
    def stages(self) -> tuple[StagePlan, ...]:
        return tuple(stage for chain in self.chains for stage in chain)

    @property
    def gpus_per_trial(self) -> tuple[tuple[str, ...], ...]:
        """Per chain, each stage's GPUs per trial: a compact key for logs and tests."""
        return tuple(tuple(s.gpus_label for s in chain) for chain in self.chains)

    def on_market(self, market: str) -> AllocationPlan:
        """The same plan with every stage on ``market`` (a whole plan on spot)."""
        chains = tuple(tuple(s.replace(market=market) for s in chain) for chain in self.chains)
        return dataclasses.replace(self, chains=chains)

    def with_chain(self, index: int, chain: tuple[StagePlan, ...]) -> AllocationPlan:
        chains = list(self.chains)
        chains[index] = chain
        return dataclasses.replace(self, chains=tuple(chains))
