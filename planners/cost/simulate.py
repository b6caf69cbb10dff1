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

Spot capacity [OWN model]: a stage may run on spot instances (``StagePlan.market``), at
the catalog's discounted price. Each running spot instance is interrupted as a Poisson
process at the catalog's rate (exponential running times; an instance that is starting is
not running, so it is not interrupted). When an instance is interrupted:

- it is billed up to the interruption by the usual rule, and its replacement from its
  own request (so each pays its own minimum charge and rounding);
- a replacement is requested at once and is ready after a new queueing plus startup draw;
- every segment running on it loses the work since its last checkpoint. Segments
  checkpoint at every resource unit, so the loss is a uniform part of one unit (half a
  unit on average; the whole segment if it is shorter than a unit), and each redoes
  that loss plus the profile's ``overhead_s`` (restore) on the replacement, after it is
  ready. Slots on the node that had already finished lose nothing.

An instance interrupted while its pool idles at a barrier is replaced at once when a
later stage keeps it (the replacement may still be starting when that stage begins),
and merely billed up to the interruption when it was going to be released. A change of
market, like a change of type, releases the pool. The nominal trace prices spot nodes but
plays no interruption (a mean run has a fraction of one).

Random draws are keyed by (bracket, rung) and a seed, so every candidate plan is priced on
the same stragglers, startup draws and spot lifetimes (common random numbers), and results per
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

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from statistics import NormalDist

import numpy as np
from numpy.typing import NDArray

from planners.cost.allocation import AllocationPlan, StagePlan
from planners.cost.catalog import Catalog, InstanceType
from planners.cost.profile import Profile
from planners.packing import StaticFluid, Work, best_rigid
from planners.placement import Placement, place

Array = NDArray[np.float64]

# What each random stream is for; streams are keyed (bracket, rung, purpose).
_DURATION, _QUEUE, _STARTUP, _LIFETIME = 0, 1, 2, 3
_SPOT = 8  # replacement round r of a stage: _SPOT + 8r + 0..3 (busy) and + 4..6 (idle)
_MAX_ROUNDS = 1000  # replacements per node and stage before a stage counts as never ending


@dataclass(frozen=True)
class _Pool:
    """The nodes a chain holds, all of one type and market. Per sample and node (S x c):
    when the node's current instance was requested, when it is ready, and when it will be
    interrupted (``fails``; None on-demand or at rate 0: never)."""

    instance: InstanceType
    market: str
    request: Array
    ready: Array
    fails: Array | None = None
    ids: tuple[int, ...] = ()  # node ids, only when tracing

    @property
    def count(self) -> int:
        return self.ready.shape[1]

    def charge(self, end: Array) -> Array:
        """Dollars per sample and node for the current instances ended at ``end`` (S x c)."""
        billing = self.instance.billing
        start = self.ready if billing.starts == "running" else self.request
        if np.isfinite(end).all():
            alive = end - start
        else:  # released at the end of a stage that never ends (requested then, too)
            with np.errstate(invalid="ignore"):
                alive = np.where(np.isinf(end), np.inf, end - start)
        dollars = billing.charge(self.instance.price(self.market), np.maximum(alive, 0.0))
        # Billed from running: an instance released before it ran costs nothing.
        return dollars if billing.starts == "request" else np.where(alive < 0, 0.0, dollars)

    def bill(self, until: Array) -> Array:
        """Dollars per sample for every node released at ``until``: an instance that was
        interrupted before then (while idle) is billed up to its interruption."""
        end = until[:, None] if self.fails is None else np.minimum(until[:, None], self.fails)
        return self.charge(end).sum(axis=1)

    def split(self, keep: int) -> tuple[_Pool, _Pool]:
        """The first ``keep`` nodes, and the rest."""

        def cut(part: slice) -> _Pool:
            fails = None if self.fails is None else self.fails[:, part]
            request, ready = self.request[:, part], self.ready[:, part]
            return _Pool(self.instance, self.market, request, ready, fails, self.ids[part])

        return cut(slice(None, keep)), cut(slice(keep, None))

    def join(self, new: _Pool) -> _Pool:
        """This pool with ``new``'s nodes after its own (same type and market)."""
        fails = None if self.fails is None else np.hstack([self.fails, new.fails])
        request, ready = np.hstack([self.request, new.request]), np.hstack([self.ready, new.ready])
        return _Pool(self.instance, self.market, request, ready, fails, self.ids + new.ids)


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
    market: str = "on-demand"


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
    _open: dict[int, tuple[int, str, int, float, float, str]] = field(default_factory=dict)

    def request(
        self, bracket: int, instance: InstanceType, market: str, at: float, ready: Array
    ) -> tuple[int, ...]:
        ids = []
        for when in ready:
            node = len(self.nodes) + len(self._open)
            self._open[node] = (bracket, instance.name, instance.gpus, at, float(when), market)
            ids.append(node)
        return tuple(ids)

    def release(self, ids: Sequence[int], at: float) -> None:
        for node in ids:
            bracket, name, gpus, requested, ready, market = self._open.pop(node)
            self.nodes.append(NodeSpan(node, bracket, name, gpus, requested, ready, at, market))
        self.nodes.sort(key=lambda n: n.node)


@dataclass(frozen=True)
class ChainRun:
    """One chain simulated: per-sample end and cost, per-stage times and spend weights."""

    end: Array
    released_cost: Array  # nodes released before the chain's end
    closing_cost: Array  # the nodes still held, released at the chain's end
    held: tuple[_Pool, ...]
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


class Simulator:
    """Prices allocation plans by Monte Carlo (see the module docstring).

    Args:
        catalog: Instance types, prices, billing rules, provisioning delays.
        profile: Seconds per resource unit per GPU count, with spread.
        samples: Monte Carlo samples per plan.
        seed: Seeds every draw; the same seed gives the same stragglers to every plan.
        quantile: The JCT and cost quantile that plans are judged on (0.95: p95).
        packing: Run each stage as a Fluid TrialGroup: its trials take the widths
            StaticFluid packs them at over the stage's GPUs (its nodes), not the plan's
            GPUs per trial (see :meth:`packed`).
    """

    def __init__(
        self,
        catalog: Catalog,
        profile: Profile,
        samples: int = 200,
        seed: int = 0,
        quantile: float = 0.95,
        packing: bool = False,
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
        if packing:
            profile.check_packable()
        self.packing = packing
        self._draws: dict[tuple[int, int, int], Array] = {}
        self._chains: dict[tuple[StagePlan, ...], ChainRun] = {}
        self._layouts: dict[tuple[StagePlan, str], tuple[Placement, Array, Array, Array]] = {}
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
        """The plan once with mean segment times and mean delays, node by node (spot
        nodes at their price, without interruptions: a mean run has a fraction of one)."""
        trace = Trace()
        runs = [self._simulate(chain, trace) for chain in plan.chains]
        trace.jct = float(max(run.end[0] for run in runs))
        for run in runs:
            until = np.array([trace.jct]) if plan.hold else run.end
            trace.cost += float(run.released_cost[0])
            trace.cost += float(sum(pool.bill(until)[0] for pool in run.held))
            for pool in run.held:
                trace.release(pool.ids, float(until[0]))
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
        return self._draw(bracket, rung, purpose, columns, uniform=False)

    def _uniforms(self, bracket: int, rung: int, purpose: int, columns: int) -> Array:
        """``samples x columns`` uniforms on [0, 1), kept like :meth:`_normals`."""
        return self._draw(bracket, rung, purpose, columns, uniform=True)

    def _draw(self, bracket: int, rung: int, purpose: int, columns: int, uniform: bool) -> Array:
        key = (bracket, rung, purpose)
        draws = self._draws.get(key)
        if draws is None or draws.shape[1] < columns:
            rng = np.random.default_rng([self.seed, bracket, rung, purpose])
            size = max(columns, 2 * (0 if draws is None else draws.shape[1]))
            shape = (size, self.samples)
            draws = rng.random(shape) if uniform else rng.standard_normal(shape)
            draws = self._draws[key] = draws.T
        return draws[:, :columns]

    def _delays(
        self, instance: InstanceType, stage: StagePlan, purposes: tuple[int, int], columns: int
    ) -> Array:
        """Queueing plus startup of ``columns`` new instances (S x columns)."""
        z_queue = self._normals(stage.bracket, stage.rung, purposes[0], columns)
        z_start = self._normals(stage.bracket, stage.rung, purposes[1], columns)
        return instance.queueing.sample(z_queue) + instance.startup.sample(z_start)

    def _lifetimes(self, stage: StagePlan, purpose: int, columns: int, rate: float) -> Array:
        """Running time of ``columns`` spot instances until interrupted: exponential."""
        return -np.log1p(-self._uniforms(stage.bracket, stage.rung, purpose, columns)) / rate

    def _simulate(self, chain: tuple[StagePlan, ...], trace: Trace | None = None) -> ChainRun:
        nominal = trace is not None  # one sample at the means, recorded node by node
        samples = 1 if nominal else self.samples
        now, released = np.zeros(samples), np.zeros(samples)
        pool: _Pool | None = None
        starts: list[Array] = []
        ends: list[Array] = []
        rates: list[float] = []
        lost: list[Array] = []
        done = 0
        # Candidate plans mostly differ in a late stage: resume after the longest prefix
        # already simulated (its state depends on nothing after it).
        for length in range(0 if nominal else len(chain) - 1, 0, -1):
            state = self._prefixes.get(chain[:length])
            if state is not None:
                now, released, pool, *lists = state
                starts, ends, rates, lost = (list(x) for x in lists)
                done = length
                break

        def release(gone: _Pool) -> None:
            nonlocal released
            released = released + gone.bill(now)
            if trace is not None:
                trace.release(gone.ids, float(now[0]))

        for length, stage in enumerate(chain[done:], start=done + 1):
            instance = self.catalog.get(stage.instance_type, "plan.instance_type")
            price = instance.price(stage.market)  # checks that a spot stage has spot prices
            rate = 0.0 if nominal else instance.interruptions_per_second(stage.market)
            if pool is not None and (pool.instance.name, pool.market) != (
                instance.name,
                stage.market,
            ):
                release(pool)  # another type or market: a new pool
                pool = None
            if pool is not None and pool.count > stage.instances:
                pool, gone = pool.split(stage.instances)  # the newest go; survivors keep theirs
                release(gone)
            if pool is not None and pool.fails is not None:
                pool, charge = self._replace_idle(stage, pool, now)
                released = released + charge
            missing = stage.instances - (0 if pool is None else pool.count)
            if missing > 0:
                if nominal:
                    mean_delay = instance.queueing.mean_s + instance.startup.mean_s
                    delay = np.full((1, missing), mean_delay)
                else:
                    delay = self._delays(instance, stage, (_QUEUE, _STARTUP), missing)
                ready = now[:, None] + delay
                request = np.broadcast_to(now[:, None], ready.shape)
                fails = None
                if rate > 0:
                    fails = ready + self._lifetimes(stage, _LIFETIME, missing, rate)
                ids = (
                    ()
                    if trace is None
                    else trace.request(
                        stage.bracket, instance, stage.market, float(now[0]), ready[0]
                    )
                )
                new = _Pool(instance, stage.market, request, ready, fails, ids)
                pool = new if pool is None else pool.join(new)
            assert pool is not None  # a stage holds at least one node

            # A slot starts as soon as its node is ready; the stage ends with its last slot.
            placement, mean, sd, unit = self._layout(stage, instance)
            slot_ready = np.maximum(now[:, None], pool.ready[:, placement.slot_nodes])
            if nominal:
                durations = mean[None, :]
            else:
                z = self._normals(stage.bracket, stage.rung, _DURATION, stage.trials)
                durations = np.maximum(mean + sd * z, 0.0)
            hits = np.zeros(samples)
            if pool.fails is not None:
                busy = slot_ready + durations @ placement.gather
                busy, pool, charge, hits = self._interrupt(stage, placement, pool, busy, unit)
                released = released + charge
                end = busy.max(axis=1)
            elif placement.waves == 1:
                end = (slot_ready[:, placement.slot_of_trial] + durations).max(axis=1)
            else:
                end = (slot_ready + durations @ placement.gather).max(axis=1)
            if trace is not None:
                self._record(trace, stage, placement, durations[0], slot_ready[0], pool.ids)
            rates.append(price / 3600 * pool.count)
            starts.append(slot_ready.min(axis=1))
            ends.append(end)
            lost.append(hits)
            now = end
            if not nominal and length < len(chain):  # whole chains are cached by chain()
                state = (now, released, pool, tuple(starts), tuple(ends), tuple(rates), tuple(lost))
                self._prefixes[chain[:length]] = state

        assert pool is not None
        return ChainRun(
            now,
            released,
            pool.bill(now),
            (pool,),
            tuple(starts),
            tuple(ends),
            tuple(rates),
            tuple(lost),
        )

    def _interrupt(
        self, stage: StagePlan, placement: Placement, pool: _Pool, busy: Array, unit: Array
    ) -> tuple[Array, _Pool, Array, Array]:
        """Spot interruptions while the stage trains: per slot, ``busy`` (S x slots) is
        when it would finish if nothing more were interrupted. A node whose instance is
        interrupted while one of its slots is busy is replaced (queueing plus startup);
        each busy slot on it redoes the work since its last checkpoint (a uniform part of
        one resource unit, ``unit``) plus the profile's overhead, on the replacement.
        Returns the new ends, the pool, the interrupted instances' bills and the count."""
        assert pool.fails is not None
        rate = pool.instance.interruptions_per_second(pool.market)
        nodes = placement.slot_nodes
        onto = np.zeros((len(nodes), pool.count))  # slot -> its node
        onto[np.arange(len(nodes)), nodes] = 1.0
        request, ready, fails = pool.request, pool.ready, pool.fails
        charges, hits = np.zeros(self.samples), np.zeros(self.samples)
        for round_ in range(_MAX_ROUNDS):
            hit = (fails[:, nodes] < busy) & np.isfinite(busy)  # interrupted while busy
            node_hit = (hit @ onto) > 0
            if not node_hit.any():
                break
            base = _SPOT + 8 * round_
            gone = dataclasses.replace(pool, request=request, ready=ready)
            charges = charges + np.where(node_hit, gone.charge(fails), 0.0).sum(axis=1)
            down = self._delays(pool.instance, stage, (base, base + 1), pool.count)
            redo = self._uniforms(stage.bracket, stage.rung, base + 2, len(nodes)) * unit
            request = np.where(node_hit, fails, request)
            ready = np.where(node_hit, fails + down, ready)
            busy = np.where(hit, busy + down[:, nodes] + redo + self.profile.overhead_s, busy)
            life = self._lifetimes(stage, base + 3, pool.count, rate)
            fails = np.where(node_hit, ready + life, fails)
            hits = hits + node_hit.sum(axis=1)
        else:
            # Interrupted far more often than a unit of work completes: it never finishes.
            busy = np.where(fails[:, nodes] < busy, np.inf, busy)
        pool = dataclasses.replace(pool, request=request, ready=ready, fails=fails)
        return busy, pool, charges, hits

    def _replace_idle(self, stage: StagePlan, pool: _Pool, now: Array) -> tuple[_Pool, Array]:
        """Instances of a kept spot pool interrupted while idle (before the barrier at
        ``now``) were replaced at once: bill them up to the interruption and give their
        nodes the replacement's request and ready times."""
        assert pool.fails is not None
        rate = pool.instance.interruptions_per_second(pool.market)
        request, ready, fails = pool.request, pool.ready, pool.fails
        charges = np.zeros(len(now))
        for round_ in range(_MAX_ROUNDS):
            hit = (fails < now[:, None]) & np.isfinite(now)[:, None]
            if not hit.any():
                break
            base = _SPOT + 8 * round_ + 4
            gone = dataclasses.replace(pool, request=request, ready=ready)
            charges = charges + np.where(hit, gone.charge(fails), 0.0).sum(axis=1)
            down = self._delays(pool.instance, stage, (base, base + 1), pool.count)
            request = np.where(hit, fails, request)
            ready = np.where(hit, fails + down, ready)
            fails = np.where(hit, ready + self._lifetimes(stage, base + 2, pool.count, rate), fails)
        return dataclasses.replace(pool, request=request, ready=ready, fails=fails), charges

    def _layout(
        self, stage: StagePlan, instance: InstanceType
    ) -> tuple[Placement, Array, Array, Array]:
        """The stage's placement, every trial's mean and sd segment time (rank order), and
        per slot the mean time of one resource unit: what an interruption loses at most
        since the last checkpoint (the whole segment when it is shorter than a unit)."""
        key = (stage, instance.name)
        layout = self._layouts.get(key)
        if layout is None:
            stage = self.packed(stage, instance)
            wide = max(stage.sizes)
            if wide > instance.gpus:
                # The profile times workers that share one node (NVLink/PCIe); a trial
                # spanning nodes would all-reduce over the network, which nothing here models.
                raise ValueError(
                    f"stage (bracket {stage.bracket}, rung {stage.rung}): a trial of "
                    f"{wide:g} GPUs does not fit one {instance.name} node ({instance.gpus} "
                    f"GPUs); the cost model times only trials whose workers share one node"
                )
            mean, sd, unit = [], [], []
            for tier in stage.tiers:
                m, s = self.profile.segment(tier.gpus, tier.resource, instance)
                mean += [m] * tier.trials
                sd += [s] * tier.trials
                per_unit = self.profile.timing(tier.gpus, instance).mean
                unit += [per_unit * min(1.0, tier.resource)] * tier.trials
            placement = place(stage.sizes, instance.gpus, stage.instances)
            slot_unit = (placement.gather * np.array(unit)[:, None]).max(axis=0)
            layout = (placement, np.array(mean), np.array(sd), slot_unit)
            self._layouts[key] = layout
        return layout

    def packed(self, stage: StagePlan, instance: InstanceType) -> StagePlan:
        """With packing, the stage as Fluid runs it (ALGORITHMS.md §6.3): its trials are
        packed over the stage's ``instances x gpus`` GPUs, each trial's workers on one node
        (StaticFluid, or one width for all where that is shorter:
        :func:`planners.packing.best_rigid`), and take those widths; the nodes, and so the
        bill's shape, stay the plan's. Without packing, or where the widths would need a
        slot structure that best-fit placement cannot hold, the stage as planned."""
        if not self.packing or any(tier.resource <= 0 for tier in stage.tiers):
            return stage
        unit = self.profile.timing(1.0, instance).mean
        trials = [tier for tier in stage.tiers for _ in range(tier.trials)]
        packer = StaticFluid(
            self.profile,
            stage.instances * instance.gpus,
            gpus_per_node=instance.gpus,
            max_share=max(self.profile.sharing, default=1),
        )
        group = [Work(i, t.resource, unit) for i, t in enumerate(trials)]
        widths = best_rigid(packer, group).widths
        tiers = []
        for index, tier in enumerate(stage.tiers):
            first = sum(t.trials for t in stage.tiers[:index])
            mine = sorted((widths[first + i] for i in range(tier.trials)), reverse=True)
            for width in dict.fromkeys(mine):
                tiers.append(dataclasses.replace(tier, trials=mine.count(width), gpus=width))
        packed = stage.replace(tiers=tuple(tiers))
        try:
            place(packed.sizes, instance.gpus, stage.instances)
        except ValueError:  # a width that no slot of the first wave has
            return stage
        return packed

    @staticmethod
    def _record(
        trace: Trace,
        stage: StagePlan,
        placement: Placement,
        durations: Array,
        slot_ready: Array,
        ids: Sequence[int],
    ) -> None:
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
