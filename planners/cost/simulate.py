"""Monte Carlo simulator of an allocation plan: JCT and cost with stragglers (§5.2, §5.3).

Each chain (bracket) runs its stages in order with a barrier between them. At a barrier
the stage's pool is resized: surplus nodes are released (the newest first, so survivors
keep their nodes and nothing migrates) and missing ones are requested (queueing plus
startup, sampled). A change of instance type releases the whole pool. Trials are placed
best-fit (§5.5); each slot starts as soon as its node is ready and runs its trials one
after another, each segment's time drawn from the profile (normal: CLT per segment plus
the straggler spread). The stage ends with its last slot. Every node is billed by its
type's rule from request (or from running) to release. Chains run side by side; JCT is
the last chain's end.

Random draws are keyed by (bracket, rung) and a seed, so every candidate plan is priced on
the same stragglers and the same startup draws (common random numbers), and results per
chain are cached: a planner that changes one stage re-simulates one chain.

Example (ALGORITHMS.md §5.6, plan (4,4,4)):
    >>> from planners.cost.allocation import AllocationPlan, GpuTier, StagePlan
    >>> from planners.cost.catalog import parse_catalog
    >>> from planners.cost.profile import Profile
    >>> catalog = parse_catalog({"instance_types": {"p3.8xlarge": {
    ...     "gpus": 4, "gpu": "V100", "price_per_hour": 12.24, "startup": {"mean_s": 180}}}})
    >>> profile = Profile.from_scaling(720, speedup={2: 1.8, 4: 3.2})
    >>> chain = tuple(StagePlan(0, k, (GpuTier(n, 4.0, r),), "p3.8xlarge", n)
    ...               for k, (n, r) in enumerate([(8, 1), (4, 2), (2, 4)]))
    >>> outcome = Simulator(catalog, profile, samples=10).run(AllocationPlan((chain,)))
    >>> round(outcome.jct_q / 60, 2), round(outcome.cost_mean, 2)
    (29.25, 23.26)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from numpy.typing import NDArray

from planners.cost.allocation import AllocationPlan, StagePlan
from planners.cost.catalog import Catalog, InstanceType
from planners.cost.profile import Profile
from planners.placement import Placement, place

Array = NDArray[np.float64]


@dataclass
class _Cohort:
    """Nodes of one type requested together at ``request``; ``ready`` per node (S x c)."""

    instance: InstanceType
    request: Array
    ready: Array
    ids: list[int] = field(default_factory=list)  # node ids, only when tracing

    @property
    def count(self) -> int:
        return self.ready.shape[1]

    def bill(self, until: Array) -> Array:
        """Dollars per sample for every node of the cohort released at ``until``."""
        start = self.ready
        if self.instance.billing.starts == "request":
            start = np.broadcast_to(self.request[:, None], self.ready.shape)
        charge = self.instance.billing.charge(self.instance.price_per_hour, until[:, None] - start)
        return charge.sum(axis=1)

    def split(self, keep: int) -> tuple[_Cohort, _Cohort]:
        """The first ``keep`` nodes, and the rest."""
        return (
            _Cohort(self.instance, self.request, self.ready[:, :keep], self.ids[:keep]),
            _Cohort(self.instance, self.request, self.ready[:, keep:], self.ids[keep:]),
        )


@dataclass(frozen=True)
class NodeSpan:
    """One node's life in the nominal trace (seconds from job submission)."""

    node: int
    bracket: int
    instance_type: str
    gpus: int
    requested: float
    ready: float
    released: float


@dataclass(frozen=True)
class SegmentSpan:
    """One trial's segment in the nominal trace: GPUs ``[offset, offset+gpus)`` of ``node``."""

    bracket: int
    rung: int
    trial: int
    node: int
    offset: float
    gpus: float
    start: float
    end: float


@dataclass
class Trace:
    """The plan played once with mean times and mean delays: what the Gantt chart draws."""

    nodes: list[NodeSpan] = field(default_factory=list)
    segments: list[SegmentSpan] = field(default_factory=list)
    jct: float = 0.0
    cost: float = 0.0
    _open: dict[int, tuple[int, str, int, float, float]] = field(default_factory=dict)

    def request(self, bracket: int, instance: InstanceType, at: float, ready: Array) -> list[int]:
        ids = []
        for when in ready:
            node = len(self.nodes) + len(self._open)
            self._open[node] = (bracket, instance.name, instance.gpus, at, float(when))
            ids.append(node)
        return ids

    def release(self, ids: Sequence[int], at: float) -> None:
        for node in ids:
            bracket, name, gpus, requested, ready = self._open.pop(node)
            self.nodes.append(NodeSpan(node, bracket, name, gpus, requested, ready, at))
        self.nodes.sort(key=lambda n: n.node)


@dataclass(frozen=True)
class ChainRun:
    """One chain simulated: per-sample end and cost, per-stage times and spend weights."""

    end: Array
    released_cost: Array  # nodes released before the chain's end
    closing_cost: Array  # the nodes still held, released at the chain's end
    held: tuple[_Cohort, ...]
    starts: tuple[Array, ...]
    ends: tuple[Array, ...]
    rates: tuple[float, ...]  # $/s of the nodes each stage holds, to attribute the bill

    @cached_property
    def total_mean(self) -> float:
        """Mean cost of the chain when it releases its nodes at its own end."""
        return float((self.released_cost + self.closing_cost).mean())

    @property
    def spend(self) -> tuple[float, ...]:
        """Mean dollars of node time per stage, barrier to barrier (list price)."""
        barriers = (np.zeros_like(self.end), *self.ends)
        return tuple(
            rate * float((end - before).mean())
            for rate, before, end in zip(self.rates, barriers, self.ends, strict=False)
        )


@dataclass(frozen=True)
class StageOutcome:
    """Per-sample training start and end of one stage, and its share of the mean cost."""

    start: Array
    end: Array
    cost: float


def quantile(values: Array, q: float) -> float:
    """``np.quantile(values, q)`` (linear interpolation) by partial sort: planners ask
    for it on every candidate plan."""
    position = q * (len(values) - 1)
    low = int(position)
    high = min(low + 1, len(values) - 1)
    part = np.partition(values, (low, high))
    return float(part[low] + (part[high] - part[low]) * (position - low))


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
                StageOutcome(start, end, float(total.mean()) * share / weight)
                for start, end, share in zip(run.starts, run.ends, spend, strict=True)
            ]
        return tuple(out)

    def summary(self, values: Array) -> dict[str, float]:
        """p50, p95 and mean of ``jct`` or ``cost``."""
        p50, p95 = np.quantile(values, [0.5, 0.95])
        return {"p50": float(p50), "p95": float(p95), "mean": float(values.mean())}


class Simulator:
    """Prices allocation plans by Monte Carlo (see the module docstring).

    Args:
        catalog: Instance types, prices, billing rules, provisioning delays.
        profile: Seconds per resource unit per GPU count, with spread.
        samples: Monte Carlo samples per plan.
        seed: Seeds every draw; the same seed gives the same stragglers to every plan.
        quantile: The JCT and cost quantile that plans are judged on (0.95: p95).
    """

    def __init__(
        self,
        catalog: Catalog,
        profile: Profile,
        samples: int = 200,
        seed: int = 0,
        quantile: float = 0.95,
    ):
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        if not 0 < quantile < 1:
            raise ValueError(f"quantile must lie in (0, 1), got {quantile}")
        self.catalog = catalog
        self.profile = profile
        self.samples = samples
        self.seed = seed
        self.quantile = quantile
        self._draws: dict[tuple[int, int, int], Array] = {}
        self._chains: dict[tuple[StagePlan, ...], ChainRun] = {}
        self._layouts: dict[tuple[StagePlan, str], tuple[Placement, Array, Array]] = {}
        self._prefixes: dict[tuple[StagePlan, ...], tuple] = {}

    # --- public -------------------------------------------------------------------------

    def run(self, plan: AllocationPlan) -> Outcome:
        runs = [self.chain(chain) for chain in plan.chains]
        jct = runs[0].end if len(runs) == 1 else np.max([run.end for run in runs], axis=0)
        chains = []
        for run in runs:
            closing = run.closing_cost
            if plan.hold:  # a static pool is paid for until the whole job ends
                closing = sum((c.bill(jct) for c in run.held), np.zeros(self.samples))
            chains.append((run, run.released_cost + closing))
        cost = chains[0][1] if len(chains) == 1 else np.sum([c for _, c in chains], axis=0)
        return Outcome(jct, cost, self.quantile, tuple(chains))

    def trace(self, plan: AllocationPlan) -> Trace:
        """The plan once with mean segment times and mean delays, node by node."""
        trace = Trace()
        runs = [self._simulate(chain, trace) for chain in plan.chains]
        trace.jct = float(max(run.end[0] for run in runs))
        for run in runs:
            until = np.array([trace.jct]) if plan.hold else run.end
            trace.cost += float(run.released_cost[0])
            trace.cost += float(sum(c.bill(until)[0] for c in run.held))
            for cohort in run.held:
                trace.release(cohort.ids, float(until[0]))
        return trace

    # --- internals ----------------------------------------------------------------------

    def chain(self, chain: tuple[StagePlan, ...], keep: bool = True) -> ChainRun:
        """One chain simulated on its own: planners combine chains themselves. ``keep``
        caches the result (an exhaustive search that sees each chain once need not)."""
        run = self._chains.get(chain)
        if run is None:
            run = self._simulate(chain)
            if keep:
                self._chains[chain] = run
        return run

    def _normals(self, bracket: int, rung: int, purpose: int, columns: int) -> Array:
        """``samples x columns`` standard normals, fixed per (bracket, rung, purpose).

        Drawn column by column, so asking for more columns keeps the first ones: a plan
        with one more node sees the same startup draws for the nodes it shares.
        """
        key = (bracket, rung, purpose)
        draws = self._draws.get(key)
        if draws is None or draws.shape[1] < columns:
            rng = np.random.default_rng([self.seed, bracket, rung, purpose])
            size = max(columns, 2 * (0 if draws is None else draws.shape[1]))
            draws = self._draws[key] = rng.standard_normal((size, self.samples)).T
        return draws[:, :columns]

    def _simulate(self, chain: tuple[StagePlan, ...], trace: Trace | None = None) -> ChainRun:
        nominal = trace is not None  # one sample at the means, recorded node by node
        samples = 1 if nominal else self.samples
        now, released = np.zeros(samples), np.zeros(samples)
        cohorts: list[_Cohort] = []
        starts: list[Array] = []
        ends: list[Array] = []
        rates: list[float] = []
        done = 0
        # Candidate plans mostly differ in a late stage: resume after the longest prefix
        # already simulated (its state depends on nothing after it).
        for length in range(0 if nominal else len(chain) - 1, 0, -1):
            state = self._prefixes.get(chain[:length])
            if state is not None:
                now, released, saved, *lists = state
                cohorts = list(saved)
                starts, ends, rates = (list(x) for x in lists)
                done = length
                break

        def release(cohort: _Cohort) -> None:
            nonlocal released
            released = released + cohort.bill(now)
            if trace is not None:
                trace.release(cohort.ids, float(now[0]))

        for length, stage in enumerate(chain[done:], start=done + 1):
            instance = self.catalog.get(stage.instance_type, "plan.instance_type")
            if cohorts and cohorts[0].instance.name != instance.name:
                for cohort in cohorts:
                    release(cohort)
                cohorts = []
            surplus = sum(c.count for c in cohorts) - stage.instances
            while surplus > 0:  # the newest nodes go first; survivors keep theirs
                kept, gone = cohorts[-1].split(max(cohorts[-1].count - surplus, 0))
                release(gone)
                surplus -= gone.count
                cohorts[-1:] = [kept] if kept.count else []
            if surplus < 0:
                new = -surplus
                if nominal:
                    delay = np.full((1, new), instance.queueing.mean_s + instance.startup.mean_s)
                else:
                    z_queue = self._normals(stage.bracket, stage.rung, 1, new)
                    z_start = self._normals(stage.bracket, stage.rung, 2, new)
                    delay = instance.queueing.sample(z_queue) + instance.startup.sample(z_start)
                cohort = _Cohort(instance, now, now[:, None] + delay)
                if trace is not None:
                    at = float(now[0])
                    cohort.ids = trace.request(stage.bracket, instance, at, cohort.ready[0])
                cohorts.append(cohort)

            # A slot starts as soon as its node is ready; the stage ends with its last slot.
            placement, mean, sd = self._layout(stage, instance)
            ready = cohorts[0].ready if len(cohorts) == 1 else np.hstack([c.ready for c in cohorts])
            slot_ready = np.maximum(now[:, None], ready[:, placement.slot_nodes])
            if nominal:
                durations = mean[None, :]
            else:
                z = self._normals(stage.bracket, stage.rung, 0, stage.trials)
                durations = np.maximum(mean + sd * z, 0.0)
            if placement.waves == 1:
                end = (slot_ready[:, placement.slot_of_trial] + durations).max(axis=1)
            else:
                end = (slot_ready + durations @ placement.gather).max(axis=1)
            if trace is not None:
                self._record(trace, stage, placement, durations[0], slot_ready[0], cohorts)
            held = sum(c.count for c in cohorts)
            rates.append(instance.price_per_hour / 3600 * held)
            starts.append(slot_ready.min(axis=1))
            ends.append(end)
            now = end
            if not nominal and length < len(chain):  # whole chains are cached by chain()
                state = (now, released, tuple(cohorts), tuple(starts), tuple(ends), tuple(rates))
                self._prefixes[chain[:length]] = state

        closing = sum((c.bill(now) for c in cohorts), np.zeros(samples))
        return ChainRun(
            now, released, closing, tuple(cohorts), tuple(starts), tuple(ends), tuple(rates)
        )

    def _layout(self, stage: StagePlan, instance: InstanceType) -> tuple[Placement, Array, Array]:
        """The stage's placement and every trial's mean and sd segment time, rank order."""
        key = (stage, instance.name)
        layout = self._layouts.get(key)
        if layout is None:
            wide = max(stage.sizes)
            if wide > instance.gpus:
                # The profile times workers that share one node (NVLink/PCIe); a trial
                # spanning nodes would all-reduce over the network, which nothing here models.
                raise ValueError(
                    f"stage (bracket {stage.bracket}, rung {stage.rung}): a trial of "
                    f"{wide:g} GPUs does not fit one {instance.name} node ({instance.gpus} "
                    f"GPUs); the cost model times only trials whose workers share one node"
                )
            mean, sd = [], []
            for tier in stage.tiers:
                m, s = self.profile.segment(tier.gpus, tier.resource, instance)
                mean += [m] * tier.trials
                sd += [s] * tier.trials
            placement = place(stage.sizes, instance.gpus, stage.instances)
            layout = self._layouts[key] = (placement, np.array(mean), np.array(sd))
        return layout

    @staticmethod
    def _record(
        trace: Trace,
        stage: StagePlan,
        placement: Placement,
        durations: Array,
        slot_ready: Array,
        cohorts: list[_Cohort],
    ) -> None:
        ids = [node for cohort in cohorts for node in cohort.ids]
        free = [float(t) for t in slot_ready]  # when each slot is next free
        for trial, slot_index in enumerate(placement.trial_slot):
            slot = placement.slots[slot_index]
            start, free[slot_index] = free[slot_index], free[slot_index] + durations[trial]
            trace.segments.append(
                SegmentSpan(
                    stage.bracket,
                    stage.rung,
                    trial,
                    ids[slot.node],
                    slot.offset,
                    slot.gpus,
                    start,
                    free[slot_index],
                )
            )
