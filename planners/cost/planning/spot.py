"""Spot with a deadline (docs/algorithms.md §5.9): each stage of an on-demand plan runs on
spot capacity while the slack allows, and on on-demand once it runs out.

The idea is the safety net of "Can't Be Late" (Wu et al., NSDI 2024): spot is used as long
as, should it go badly, on-demand capacity can still finish the job in time. Here the
decision is taken at every stage barrier, per run: stage ``k`` goes to spot when

    now + spot[k] + rest[k + 1] <= deadline

where ``spot[k]`` is the stage's duration on spot and ``rest[k + 1]`` that of every later
stage on on-demand, each at the ``confidence`` quantile of the simulator's samples and
each from a fresh pool (its nodes requested at the barrier: a change of market releases
the pool, so this never counts a startup it would not pay). Progress that ran ahead of the
forecast buys later stages back onto spot; progress that fell behind moves them to
on-demand, where the rest of the job is no longer exposed to interruptions. A reclaimed
spot instance is replaced and its segments resume from their last checkpoint (the
simulator's spot model, ``elastune.planners.cost.montecarlo.simulate``).

:meth:`SpotDeadline.play` runs a plan under the rule in one world: a
:class:`~elastune.planners.cost.montecarlo.simulate.PlanSimulator` with one sample, whose seed is
the interruption trace (and the stragglers and delays). :func:`plan_spot` chooses the on-demand plan
the rule starts from: one made for a share of the deadline, which leaves the rest as slack for spot.

Example (a loose deadline: every stage on spot; a tight one: the last stage on-demand):
    >>> from elastune.planners.cost.pricing.allocation import AllocationPlan, GpuTier, StagePlan
    >>> from elastune.planners.cost.pricing.catalog import parse_catalog
    >>> from elastune.planners.staging import Profile
    >>> catalog = parse_catalog({"instance_types": {"g5.xlarge": {"gpus": 1, "gpu": "A10G",
    ...     "price_per_hour": 1.0, "startup": {"mean_s": 120},
    ...     "spot": {"discount": 0.6, "interruptions_per_hour": 2.0}}}})
    >>> simulator = PlanSimulator(catalog, Profile({1: 600.0}), samples=400)
    >>> chain = tuple(StagePlan(0, k, (GpuTier(n, 1.0, r),), "g5.xlarge", n)
    ...               for k, (n, r) in enumerate([(4, 1), (2, 2), (1, 4)]))
    >>> plan = AllocationPlan((chain,))
    >>> loose = SpotDeadline(simulator, plan, deadline=3 * 3600)
    >>> [loose.market(k, 0.0) for k in range(3)]
    ['spot', 'spot', 'spot']
    >>> tight = SpotDeadline(simulator, plan, deadline=6500)
    >>> tight.market(0, 0.0), tight.market(2, 2700.0)
    ('spot', 'on-demand')
    >>> jct, cost, markets = tight.play(simulator.world(seed=7))
    >>> jct <= 6500, len(markets)
    (True, 3)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from elastune.planners.cost.montecarlo.outcome import quantile
from elastune.planners.cost.montecarlo.simulate import PlanSimulator
from elastune.planners.cost.planning.rubberband import RubberBand
from elastune.planners.cost.pricing.allocation import AllocationPlan, StagePlan
from elastune.planners.staging import Stage


class SpotDeadline:
    """The per-stage spot rule for a one-chain on-demand ``plan`` (module docstring).

    Args:
        simulator: Prices the stages (its samples give the quantiles).
        plan: The on-demand plan whose stages may move to spot (one chain: a SHA job).
        deadline: Seconds from the job's start.
        confidence: Quantile of the durations the rule guards against.
    """

    def __init__(
        self,
        simulator: PlanSimulator,
        plan: AllocationPlan,
        deadline: float,
        confidence: float = 0.99,
    ):
        if len(plan.chains) != 1:
            raise ValueError("spot with a deadline plans one chain (a SHA job)")
        if not 0 < confidence < 1:
            raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
        self.plan = plan
        self.deadline = deadline
        chain = tuple(stage.replace(market="on-demand") for stage in plan.chains[0])
        self.chain = chain
        self.spot = [
            quantile(simulator.chain((stage.replace(market="spot"),)).end, confidence)
            for stage in chain
        ]
        self.rest = [
            quantile(simulator.chain(chain[k:]).end, confidence) for k in range(len(chain))
        ] + [0.0]

    def market(self, index: int, now: float) -> str:
        """The market of stage ``index`` when its barrier is reached at ``now``."""
        if now + self.spot[index] + self.rest[index + 1] <= self.deadline:
            return "spot"
        return "on-demand"

    def play(self, world: PlanSimulator) -> tuple[float, float, tuple[str, ...]]:
        """The plan run under the rule in ``world`` (one sample): its JCT, its cost and the
        market each stage ran on."""
        if world.samples != 1:
            raise ValueError(f"a world is one sample, got {world.samples}")
        executed: list[StagePlan] = []
        now = 0.0
        for index, stage in enumerate(self.chain):
            executed.append(stage.replace(market=self.market(index, now)))
            run = world.chain(tuple(executed))
            now = float(run.end[0])
        cost = float(np.sum(run.released_cost + run.closing_cost))
        return now, cost, tuple(s.market for s in executed)


def plan_spot(
    simulator: PlanSimulator,
    instance_types: Sequence[str],
    stages: Sequence[Stage],
    deadline: float,
    *,
    shares: Sequence[float] = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
    worlds: int = 200,
    confidence: float = 0.99,
) -> SpotDeadline | None:
    """The cheapest :class:`SpotDeadline` over on-demand plans made for a share of the
    deadline (RubberBand's cheapest plan meeting ``share x deadline``): a smaller share
    leaves more slack for spot, on a faster, dearer plan. Each is played in ``worlds``
    worlds of its own (seeds from 10,000, apart from any a benchmark draws) and kept if it
    meets the deadline in a ``confidence`` share of them. None when none does."""
    best: tuple[float, SpotDeadline] | None = None
    for share in shares:
        base = RubberBand(simulator, instance_types, deadline=share * deadline).plan(stages)
        if not base.feasible:
            continue
        policy = SpotDeadline(simulator, base.plan, deadline, confidence)
        runs = [policy.play(simulator.world(10_000 + seed)) for seed in range(worlds)]
        hits = sum(jct <= deadline for jct, _, _ in runs) / worlds
        cost = float(np.mean([c for _, c, _ in runs]))
        if hits >= confidence and (best is None or cost < best[0]):
            best = (cost, policy)
    return None if best is None else best[1]
