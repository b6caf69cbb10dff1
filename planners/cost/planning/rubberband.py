"""RubberBand: the cheapest allocation plan whose p95 JCT meets the deadline
(docs/algorithms.md §5.4).

The job is fixed (its stages, trials and resources come from the scheduler's geometry);
the plan chooses, per stage, the GPUs per trial, the instance type and the pool size. The
greedy starts from the fastest plan, then repeatedly moves to the neighbour with the best
cost-marginal benefit ``M = (c - c2) / (j2 - j)``, money saved per second of JCT given up
(``+inf`` for a neighbour that is cheaper and not slower), among neighbours that are
cheaper and still meet the deadline at the simulator's quantile; it stops when none
qualifies. Plans are compared on mean cost and p95 JCT, all on the same random draws
(common random numbers).

Neighbours, each one move: lower one stage's GPUs per trial by one step, or move one stage
to another instance type (§5.4); and, our own additions [OWN], run one stage in one more
wave on fewer nodes, or cut a bracket's largest pool by one wave for all its stages. The
last two matter when the deadline is loose: fewer nodes pay for less startup and less
idle time behind stragglers, and a cut of every stage at once avoids re-provisioning a
later stage's nodes, which makes each one-stage cut more expensive on its own.

The greedy is run from several feasible starts and the cheapest result wins [OWN]: per
instance type, the fastest plan (the paper's start) and the elastic twin of the smallest
static pool that meets the deadline (:meth:`RubberBand.lean`), so the plan is never dearer
than that static pool run elastically; and any plans the caller adds (a re-plan's, §5.8).
When even the fastest plan misses the deadline the result is infeasible and says the
smallest deadline that works: the best fastest plan's p95 JCT.

Spot capacity (``spot=True``) [OWN]: a stage may run on spot instances of a type with spot
prices. The neighbourhood gains "switch this stage to the other market" and "switch every
stage of this bracket to spot / to on-demand", and every instance type also starts from
its fastest and lean plans on spot. The simulator plays the interruptions (lost work,
restarts on replacements), so a stage goes to spot only where that is cheaper on average
and the plan's p95 JCT, interruptions included, still meets the deadline. For a plan with
spot stages that p95 is its one-sided 95% upper confidence bound (:meth:`RubberBand.judged`):
rare interruptions make the sampled p95 noisy. With ``spot=False`` (the default) nothing
is spot and the plans are the on-demand ones.

A quota (``max_gpus``) caps the GPUs held at any time. Brackets run side by side, so each
gets a fixed share of the quota in proportion to its work; a stage whose trials do not fit
its share runs them in waves. Instance types that another type dominates (same node size
and billing, no slower, no dearer, no slower to start) are skipped.

Example (docs/algorithms.md §5.6):
    >>> from elastune.planners.cost.pricing.catalog import parse_catalog
    >>> from elastune.planners.staging import Profile
    >>> from elastune.planners.cost.montecarlo.simulate import PlanSimulator
    >>> from elastune.planners.staging import Stage
    >>> catalog = parse_catalog({"instance_types": {"p3.8xlarge": {
    ...     "gpus": 4, "gpu": "V100", "price_per_hour": 12.24, "startup": {"mean_s": 180}}}})
    >>> simulator = PlanSimulator(catalog, Profile.from_scaling(720, speedup={2: 1.8, 4: 3.2}))
    >>> job = [Stage(0, 0, 8, 0, 1), Stage(0, 1, 4, 1, 3), Stage(0, 2, 2, 3, 7)]
    >>> result = RubberBand(simulator, ["p3.8xlarge"], deadline=36 * 60).plan(job)
    >>> [m.plan.gpus_per_trial[0] for m in result.moves]
    [('4', '4', '4'), ('2', '4', '4')]
    >>> round(result.outcome.jct_q / 60, 2), round(result.outcome.cost_mean, 2)
    (32.17, 20.13)
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from elastune.planners.cost.montecarlo.outcome import Outcome, upper_quantile
from elastune.planners.cost.montecarlo.outcome import quantile as _quantile
from elastune.planners.cost.montecarlo.simulate import PlanSimulator
from elastune.planners.cost.pricing.allocation import AllocationPlan, StagePlan
from elastune.planners.cost.pricing.catalog import MARKETS, InstanceType
from elastune.planners.cost.pricing.stage_shapes import (
    build_stage,
    chain_work,
    chains_of,
    fastest_stage,
    fewer_nodes,
    shrink_pool,
    split,
)
from elastune.planners.spec import SpecError
from elastune.planners.staging import Stage

_TOLERANCE = 1e-9  # a neighbour must be cheaper by more than float noise


@dataclass(frozen=True)
class Move:
    """One plan on the greedy path: its p95 JCT, mean cost and the ``M`` that chose it."""

    plan: AllocationPlan
    jct: float
    cost: float
    benefit: float | None  # None for the starting plan


@dataclass(frozen=True)
class RubberBandResult:
    """The chosen plan, or the fastest one when ``feasible`` is False."""

    plan: AllocationPlan
    outcome: Outcome
    feasible: bool
    smallest_deadline: float | None  # seconds; set when the deadline cannot be met
    moves: tuple[Move, ...]


def _swap(chain: tuple[StagePlan, ...], k: int, stage: StagePlan) -> tuple[StagePlan, ...]:
    return (*chain[:k], stage, *chain[k + 1 :])


def _spot(stages: Sequence[StagePlan]) -> bool:
    return any(stage.market == "spot" for stage in stages)


def _least(cap: int | None, nodes: int) -> int:
    return nodes if cap is None else min(cap, nodes)


class RubberBand:
    """Greedy cost-marginal-benefit planner (see the module docstring).

    Args:
        simulator: Prices plans; its quantile is the feasibility level.
        instance_types: Types a stage may use (names from the simulator's catalog).
        deadline: Seconds the plan's p95 JCT must not exceed; None: no deadline.
        max_gpus: GPUs the job may hold at once; None: no quota.
        spot: Whether a stage may run on spot instances (types with spot prices only).
        spot_confidence: A plan with spot stages must meet the deadline at this one-sided
            upper confidence bound of its p95 JCT, not just at the sampled p95.
    """

    def __init__(
        self,
        simulator: PlanSimulator,
        instance_types: Sequence[str],
        *,
        deadline: float | None = None,
        max_gpus: int | None = None,
        spot: bool = False,
        spot_confidence: float = 0.95,
    ):
        if not instance_types:
            raise ValueError("instance_types must name at least one instance type")
        if deadline is not None and not deadline > 0:
            raise ValueError(f"deadline must be positive, got {deadline}")
        if max_gpus is not None and max_gpus < 1:
            raise ValueError(f"max_gpus must be >= 1, got {max_gpus}")
        self.simulator = simulator
        self.profile = simulator.profile
        self.types = simulator.catalog.select(instance_types)
        self.deadline = math.inf if deadline is None else deadline
        self.max_gpus = max_gpus
        if not 0 < spot_confidence < 1:
            raise ValueError(f"spot_confidence must lie in (0, 1), got {spot_confidence}")
        self.spot = spot
        self.spot_confidence = spot_confidence
        self._moved: dict[tuple[tuple[StagePlan, ...], str], tuple[StagePlan, ...]] = {}
        if spot and not any(t.spot is not None for t in self.types):
            raise SpecError(
                "compute.spot: none of the instance types ("
                + ", ".join(t.name for t in self.types)
                + ") has spot prices in the catalog"
            )

    # --- the plan space -----------------------------------------------------------------

    def caps(self, chains: Sequence[Sequence[Stage]], instance: InstanceType) -> list[int | None]:
        """Most nodes of ``instance`` each chain may hold; raises if the quota is too small."""
        if self.max_gpus is None:
            return [None] * len(chains)
        shares = split(self.max_gpus // instance.gpus, [chain_work(c) for c in chains])
        if shares is None:
            raise SpecError(
                f"compute.max_gpus: {self.max_gpus} GPUs is too few for {len(chains)} "
                f"brackets side by side on {instance.name} ({instance.gpus} GPUs per node)"
            )
        return list(shares)

    def markets(self, instance: InstanceType) -> tuple[str, ...]:
        """The markets a stage on ``instance`` may use."""
        return MARKETS if self.spot and instance.spot is not None else MARKETS[:1]

    def fastest(
        self,
        chains: Sequence[Sequence[Stage]],
        instance: InstanceType,
        market: str = "on-demand",
    ) -> AllocationPlan:
        caps = self.caps(chains, instance)
        return AllocationPlan(
            tuple(
                tuple(
                    fastest_stage(self.profile, stage, instance, cap, market=market)
                    for stage in chain
                )
                for chain, cap in zip(chains, caps, strict=True)
            )
        )

    def lean(
        self,
        chains: Sequence[Sequence[Stage]],
        instance: InstanceType,
        caps: list[int | None],
        market: str = "on-demand",
    ) -> AllocationPlan | None:
        """The elastic twin of the smallest static pool that meets the deadline: the fewest
        ``instance`` nodes, split among brackets by work, on which every stage runs as fast
        as it can, releasing what a stage does not need. None if even the largest misses."""
        weights = [chain_work(chain) for chain in chains]

        def on(total: int) -> AllocationPlan:
            shares = split(total, weights) or [1] * len(chains)
            return AllocationPlan(
                tuple(
                    tuple(
                        fastest_stage(
                            self.profile, stage, instance, _least(cap, share), market=market
                        )
                        for stage in chain
                    )
                    for chain, share, cap in zip(chains, shares, caps, strict=True)
                )
            )

        def meets(plan: AllocationPlan) -> bool:
            return self.judged(self.simulator.run(plan).jct, market == "spot") <= self.deadline

        fastest = self.fastest(chains, instance, market)
        low, high = len(chains), sum(max(s.instances for s in chain) for chain in fastest.chains)
        if not meets(on(high)):
            return None
        while low < high:  # JCT falls as the pool grows: bisect
            mid = (low + high) // 2
            low, high = (low, mid) if meets(on(mid)) else (mid + 1, high)
        return on(high)

    def neighbours(
        self,
        plan: AllocationPlan,
        chains: Sequence[Sequence[Stage]],
        caps: dict[str, list[int | None]],
    ) -> Iterator[tuple[int, tuple[StagePlan, ...]]]:
        """Plans one move away, as (bracket index, its new chain). For one stage: one GPU
        step fewer per trial (on no more nodes), one more wave (fewer nodes), another
        instance type (about as many GPUs; same market where it can), or, when spot is
        allowed, the other market; for one bracket: its largest pool one wave smaller
        (:func:`shrink_pool`), and every stage to spot or every stage to on-demand (a
        one-stage switch pays for a new pool on both sides of it).

        ``caps`` holds the node caps per chain of every usable instance type.
        """
        for c, chain in enumerate(plan.chains):
            for k, current in enumerate(chain):
                stage = chains[c][k]
                instance = self.simulator.catalog.get(current.instance_type)
                g = current.tiers[0].gpus
                lower = [x for x in self.profile.counts_for(instance) if x < g]
                market = current.market
                if lower:
                    cap = _least(caps[instance.name][c], current.instances)
                    lowered = build_stage(stage, lower[-1], instance, cap, market=market)
                    yield c, _swap(chain, k, lowered)
                fewer = fewer_nodes(current, instance)
                if fewer is not None:
                    yield c, _swap(chain, k, current.replace(instances=fewer))
                gpus = current.instances * instance.gpus
                for other in self.types:
                    if other.name == instance.name or other.name not in caps:
                        continue
                    counts = self.profile.counts_for(other)
                    fit = [x for x in counts if x <= g]
                    cap = _least(caps[other.name][c], math.ceil(gpus / other.gpus))
                    there = market if market in self.markets(other) else MARKETS[0]
                    moved = build_stage(stage, fit[-1] if fit else counts[0], other, cap)
                    yield c, _swap(chain, k, moved.replace(market=there))
                for other_market in self.markets(instance):
                    if other_market != market:
                        yield c, _swap(chain, k, self._on_market((current,), other_market)[0])
            shrunk = shrink_pool(chain, self.simulator.catalog)
            if shrunk is not None:
                yield c, shrunk
            if self.spot:
                for market in MARKETS:
                    moved = self._on_market(chain, market)
                    if moved != chain:
                        yield c, moved

    def _on_market(self, chain: tuple[StagePlan, ...], market: str) -> tuple[StagePlan, ...]:
        """Every stage of ``chain`` that can use ``market`` moved to it (cached: the greedy
        asks again for every chain at every step)."""
        moved = self._moved.get((chain, market))
        if moved is None:
            catalog = self.simulator.catalog
            moved = tuple(
                s.replace(market=market)
                if s.market != market and market in self.markets(catalog.get(s.instance_type))
                else s
                for s in chain
            )
            self._moved[(chain, market)] = moved
        return moved

    def options(
        self, stage: Stage, chain: int, caps: dict[str, list[int | None]]
    ) -> list[StagePlan]:
        """Every allocation of ``stage`` in the plan space the greedy walks: each usable
        type, market, GPU count and node count that gives a distinct number of waves."""
        out = []
        for name, type_caps in caps.items():
            instance = self.simulator.catalog.get(name)
            for market in self.markets(instance):
                for g in self.profile.counts_for(instance):
                    option: StagePlan | None = build_stage(
                        stage, g, instance, type_caps[chain], market=market
                    )
                    while option is not None:
                        out.append(option)
                        fewer = fewer_nodes(option, instance)
                        option = None if fewer is None else option.replace(instances=fewer)
        return out

    # --- the greedy ---------------------------------------------------------------------

    def usable(self, chains: Sequence[Sequence[Stage]]) -> dict[str, list[int | None]]:
        """Node caps per chain of every instance type worth trying. A type is skipped when
        the profile cannot time it, no GPU count fits it or the quota is too small (if no
        type is left, the first one's problem is raised, naming its field), and when
        another type dominates it: same GPUs per node and billing, at least as fast, no
        dearer, no slower to start and, when spot is allowed, no dearer and no more often
        interrupted on spot. Plans on a dominated type are never cheaper."""
        caps, problems = {}, []
        for instance in self.types:
            try:
                self.profile.check(instance)
                caps[instance.name] = self.caps(chains, instance)
            except SpecError as problem:
                problems.append(problem)
        if not caps:
            raise problems[0]
        kept = [t for t in self.types if t.name in caps]
        return {
            t.name: caps[t.name]
            for i, t in enumerate(kept)
            if not any(
                self._dominates(o, t) and (not self._dominates(t, o) or j < i)
                for j, o in enumerate(kept)
                if o is not t
            )
        }

    def _dominates(self, a: InstanceType, b: InstanceType) -> bool:
        probe = self.profile.gpu_counts[0]
        spot = (
            not self.spot
            or b.spot is None
            or (
                a.spot is not None
                and a.price("spot") <= b.price("spot")
                and a.spot.interruptions_per_hour <= b.spot.interruptions_per_hour
            )
        )
        return (
            spot
            and a.gpus == b.gpus
            and a.billing == b.billing
            and a.price_per_hour <= b.price_per_hour
            and self.profile.timing(probe, a).mean <= self.profile.timing(probe, b).mean
            and all(
                x.mean_s <= y.mean_s and x.sd_s <= y.sd_s
                for x, y in ((a.startup, b.startup), (a.queueing, b.queueing))
            )
        )

    def judged(self, jct: NDArray[np.float64], spot: bool) -> float:
        """The JCT a plan is held to against the deadline, from its sampled JCTs: the
        simulator's quantile, or for a plan with spot stages the upper confidence bound of
        that quantile. Interruptions are rare events that a few hundred samples estimate
        poorly, and the greedy keeps whichever candidate's samples were luckiest, so a
        sampled p95 alone lets spot plans miss the deadline more often than 5% [OWN]."""
        q = self.simulator.quantile
        return upper_quantile(jct, q, self.spot_confidence) if spot else _quantile(jct, q)

    def plan(
        self, stages: Sequence[Stage], also_from: Sequence[AllocationPlan] = ()
    ) -> RubberBandResult:
        """The cheapest plan found for ``stages``; ``also_from``: more plans of the same
        stages for the greedy to start from (a re-plan's kept plan, and its plan made as if
        no node were held)."""
        chains = chains_of(stages)
        caps = self.usable(chains)
        starts: list[AllocationPlan | None] = list(also_from)
        for name, type_caps in caps.items():
            instance = self.simulator.catalog.get(name)
            for market in self.markets(instance):
                starts += [
                    self.fastest(chains, instance, market),
                    self.lean(chains, instance, type_caps, market),
                ]
        results = [self._descend(start, chains, caps) for start in starts if start is not None]
        feasible = [r for r in results if r.feasible]
        if feasible:
            return min(feasible, key=lambda r: (r.outcome.cost_mean, r.outcome.jct_q))
        late = {id(r): self.judged(r.outcome.jct, _spot(r.plan.stages)) for r in results}
        best = min(results, key=lambda r: late[id(r)])
        return RubberBandResult(
            best.plan, best.outcome, False, math.ceil(late[id(best)]), best.moves
        )

    def _descend(
        self,
        start: AllocationPlan,
        chains: Sequence[Sequence[Stage]],
        caps: dict[str, list[int | None]],
    ) -> RubberBandResult:
        outcome = self.simulator.run(start)
        j, c = outcome.jct_q, outcome.cost_mean
        moves = [Move(start, j, c, None)]
        if self.judged(outcome.jct, _spot(start.stages)) > self.deadline:
            return RubberBandResult(start, outcome, False, None, tuple(moves))
        plan, quantile = start, self.simulator.quantile
        # A bracket held in flight with nothing planned ends with its running trials.
        draining = self.simulator.draining(start)
        held = [] if draining is None else [draining[0]]
        while True:
            # A move changes one chain: price it against the others, which stay as they are.
            runs = [self.simulator.chain(chain) for chain in plan.chains]
            costs = [run.total_mean for run in runs]
            best: tuple[tuple[float, float, float], int, tuple[StagePlan, ...]] | None = None
            for index, chain in self.neighbours(plan, chains, caps):
                run = self.simulator.chain(chain)
                c2 = c - costs[index] + run.total_mean  # mean cost adds up over chains
                if c2 >= c - _TOLERANCE:
                    continue
                ends = [r.end for i, r in enumerate(runs) if i != index] + [run.end, *held]
                jct = np.max(ends, axis=0)
                spot = _spot(chain) or any(
                    _spot(other) for i, other in enumerate(plan.chains) if i != index
                )
                if spot and self.judged(jct, True) > self.deadline:
                    continue
                j2 = _quantile(jct, quantile)
                if j2 > self.deadline:
                    continue
                benefit = (c - c2) / (j2 - j) if j2 > j else math.inf
                key = (benefit, -c2, -j2)  # ties: lower cost, then lower JCT
                if best is None or key > best[0]:
                    best = (key, index, chain)
            if best is None:
                return RubberBandResult(plan, outcome, True, None, tuple(moves))
            (benefit, _, _), index, chain = best
            plan = plan.with_chain(index, chain)
            outcome = self.simulator.run(plan)
            j, c = outcome.jct_q, outcome.cost_mean
            moves.append(Move(plan, j, c, benefit))
