"""Monte Carlo simulator of an allocation plan: JCT and cost with stragglers (§5.2, §5.3).

Each chain (bracket) runs its stages in order with a barrier between them, from the job's start plus
the profile's ``job_overhead_s`` (what a job spends outside its segments, counted before the first
but for the share ``job_tail_s`` of it that ends the chain after its last stage; drawn once per
sample with its spread ``job_overhead_sd``, the same for every chain, and split in that proportion).
At a barrier the stage's pool is resized: surplus nodes are released (the newest first, so survivors
keep their nodes and nothing migrates) and missing ones are requested (queueing plus startup,
sampled). A change of instance type releases the whole pool. Trials are placed best-fit (§5.5); each
slot starts as soon as its node is ready and runs its trials one after another, each segment's time
drawn from the profile (normal: CLT per segment plus the straggler spread) times the run's speed
(``run_cv``: one draw per sample for all its segments). Where the profile was calibrated, the
calibration's error in its overheads and unit time (``calibration_cov``) is drawn once per sample
too, and moves the job's overhead and every segment of the sample alike
(``elastune.planners.cost.montecarlo.layout``): a forecast made from a few short runs is uncertain
by more than the runs' own spread. The stage ends with its last slot. Every node is billed by its
type's rule from request (or from running) to release. Chains run side by side; JCT is the last
chain's end.

Spot capacity: a stage may run on spot instances (``StagePlan.market``), at the catalog's discounted
price, interrupted and replaced as ``elastune.planners.cost.montecarlo.interruptions`` models.

Random draws are keyed by (bracket, rung) and a seed, so every candidate plan is priced on the same
stragglers, startup draws and spot lifetimes (common random numbers,
``elastune.planners.cost.montecarlo.draws``), and results per chain are cached: a planner that
changes one stage re-simulates one chain. Results are in
``elastune.planners.cost.montecarlo.outcome``, the nominal trace in
``elastune.planners.cost.montecarlo.trace``, the nodes and their bills in
``elastune.planners.cost.montecarlo.nodes``.

Example (docs/algorithms.md §5.6, plan (4,4,4)):
    >>> from elastune.planners.cost.pricing.allocation import AllocationPlan, GpuTier, StagePlan
    >>> from elastune.planners.cost.pricing.catalog import parse_catalog
    >>> from elastune.planners.staging import Profile
    >>> catalog = parse_catalog({"instance_types": {"p3.8xlarge": {
    ...     "gpus": 4, "gpu": "V100", "price_per_hour": 12.24, "startup": {"mean_s": 180}}}})
    >>> profile = Profile.from_scaling(720, speedup={2: 1.8, 4: 3.2})
    >>> chain = tuple(StagePlan(0, k, (GpuTier(n, 4.0, r),), "p3.8xlarge", n)
    ...               for k, (n, r) in enumerate([(8, 1), (4, 2), (2, 4)]))
    >>> outcome = PlanSimulator(catalog, profile, samples=10).run(AllocationPlan((chain,)))
    >>> round(outcome.jct_q / 60, 2), round(outcome.cost_mean, 2)
    (29.25, 23.26)
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from elastune.planners.cost.montecarlo.draws import (
    DURATION,
    HELD,
    LIFETIME,
    QUEUE,
    RUNNING,
    STARTUP,
    Draws,
)
from elastune.planners.cost.montecarlo.held import Held, gpu_free, left_after, slot_free
from elastune.planners.cost.montecarlo.interruptions import while_busy, while_idle
from elastune.planners.cost.montecarlo.layout import StageLayout, packed, stage_layout
from elastune.planners.cost.montecarlo.nodes import Array, NodePool
from elastune.planners.cost.montecarlo.outcome import ChainRun, Outcome
from elastune.planners.cost.montecarlo.trace import Trace
from elastune.planners.cost.pricing.allocation import AllocationPlan, StagePlan
from elastune.planners.cost.pricing.catalog import Catalog, InstanceType
from elastune.planners.staging import Profile


@dataclass
class _ChainState:
    """A chain simulated up to a barrier: what its next stage starts from. Arrays are per
    sample and never changed in place, so a copy shares them."""

    now: Array  # when the last stage ended
    released: Array  # dollars of the nodes released so far
    tail: Array  # the job's own end, after the last stage
    pool: NodePool | None = None
    # In flight: when each GPU of the held nodes (the pool's first) is free of the trials
    # still running on it (S x nodes x gpus), when they have all ended, and their stage.
    busy: Array | None = None
    drain: Array | None = None
    running_stage: tuple[int, int] | None = None
    starts: list[Array] = field(default_factory=list)
    ends: list[Array] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    lost: list[Array] = field(default_factory=list)

    @classmethod
    def start(cls, at: Array, tail: Array) -> _ChainState:
        """A chain before its first stage, which starts ``at`` seconds into the job; the
        job ends ``tail`` seconds after its last stage."""
        return cls(at, np.zeros_like(at), tail)

    @property
    def stages(self) -> int:
        """Stages simulated so far."""
        return len(self.ends)

    @property
    def held(self) -> NodePool:
        """The pool, once a stage has provisioned it."""
        assert self.pool is not None
        return self.pool

    def copy(self) -> _ChainState:
        return dataclasses.replace(
            self,
            starts=list(self.starts),
            ends=list(self.ends),
            rates=list(self.rates),
            lost=list(self.lost),
        )

    def release(self, gone: NodePool, trace: Trace | None, first: int = 0) -> None:
        """Bill ``gone``'s nodes (the pool's from ``first`` on) up to now, or up to the end
        of a trial still running on one (and end them in the trace)."""
        until = self.now
        if self.busy is not None:
            free = np.zeros((len(self.now), gone.count))
            held = self.busy[:, first : first + gone.count].max(axis=2)
            free[:, : held.shape[1]] = held
            until = np.maximum(self.now[:, None], free)
        self.released = self.released + gone.bill(until)
        if trace is not None:
            trace.release(gone.ids, float(self.now[0]))

    def run(self) -> ChainRun:
        """The chain simulated to its end, its tail after its last stage; its pool is
        released at the last stage's end."""
        return ChainRun(
            self.now + self.tail,
            self.released,
            self.held.bill(self.now),
            (self.held,),
            tuple(self.starts),
            tuple(self.ends),
            tuple(self.rates),
            tuple(self.lost),
        )


def _static_release(runs: Sequence[ChainRun]) -> Array:
    """When a static pool is released: the last chain's last stage end (its nodes go
    before the job's tail), per sample."""
    return np.max([run.ends[-1] for run in runs], axis=0)


class PlanSimulator:
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
        holding: Per bracket, the nodes its chain holds in flight, for a job re-planned
            while it runs (``elastune.planners.cost.inflight.replanner``): the chain starts on the
            nodes of the stage it is running or has just finished, ready at time 0, busy until the
            trials still running on them end (``elastune.planners.cost.montecarlo.held``); a bracket
            whose plan holds no stage but runs trials ends with them. Monte Carlo runs only (the
            nominal trace starts empty).
    """

    def __init__(
        self,
        catalog: Catalog,
        profile: Profile,
        samples: int = 200,
        seed: int = 0,
        quantile: float = 0.95,
        packing: bool = False,
        holding: Mapping[int, Held] | None = None,
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
        self.holding = dict(holding or {})
        self.draws = Draws(seed, samples, profile.calibration_dof)
        self._spread = self.draws.spread(profile.segment_cv_dof)
        self._chains: dict[tuple[StagePlan, ...], ChainRun] = {}
        self._layouts: dict[tuple[StagePlan, str], StageLayout] = {}
        cov = profile.calibration_cov
        self._fit = None if cov is None else self.draws.fit(cov)  # S x (F, o, c, t)
        self._prefixes: dict[tuple[StagePlan, ...], _ChainState] = {}
        self._running: dict[int, Array] = {}  # per bracket held: the running trials' time left
        self._free: dict[int, Array] = {}  # and when each GPU they hold is free

    # --- public -------------------------------------------------------------------------

    def run(self, plan: AllocationPlan) -> Outcome:
        runs = [self.chain(chain) for chain in plan.chains]
        jct = runs[0].end if len(runs) == 1 else np.max([run.end for run in runs], axis=0)
        released = _static_release(runs) if plan.hold else None
        chains = []
        for run in runs:
            closing = run.closing_cost
            if released is not None:
                closing = sum((c.bill(released) for c in run.held), np.zeros(self.samples))
            chains.append((run, run.released_cost + closing))
        cost = chains[0][1] if len(chains) == 1 else np.sum([c for _, c in chains], axis=0)
        draining = self.draining(plan)
        if draining is not None:
            jct, cost = np.maximum(jct, draining[0]), cost + draining[1]
        return Outcome(jct, cost, self.quantile, tuple(chains))

    def draining(self, plan: AllocationPlan) -> tuple[Array, Array] | None:
        """When the brackets held in flight that ``plan`` runs nothing more in end (their
        running trials' last end) and what their nodes cost until then; None: none."""
        planned = {chain[0].bracket for chain in plan.chains}
        ends, costs = [], []
        for bracket, held in self.holding.items():
            if held.running and bracket not in planned:
                until = self._gpu_free(held).max(axis=2)  # S x nodes
                ends.append(until.max(axis=1))
                costs.append(self._held_pool(held).bill(until))
        if not ends:
            return None
        return np.max(ends, axis=0), np.sum(costs, axis=0)

    def judging(self, quantile: float) -> PlanSimulator:
        """This simulator judging plans at ``quantile``: the same draws, and the chains it
        has run shared with it (a quantile changes how a run is judged, not the run)."""
        if not 0 < quantile < 1:
            raise ValueError(f"quantile must lie in (0, 1), got {quantile}")
        other = copy.copy(self)
        other.quantile = quantile
        return other

    def world(self, seed: int) -> PlanSimulator:
        """A simulator like this one with one sample and ``seed``: one world in which a
        plan is run, and decided on, stage by stage (``elastune.planners.cost.planning.spot``)."""
        return PlanSimulator(
            self.catalog,
            self.profile,
            samples=1,
            seed=seed,
            quantile=self.quantile,
            packing=self.packing,
            holding=self.holding,
        )

    def trace(self, plan: AllocationPlan) -> Trace:
        """The plan once with mean segment times and mean delays, node by node (spot
        nodes at their price, without interruptions: a mean run has a fraction of one)."""
        trace = Trace()
        runs = [self._simulate(chain, trace) for chain in plan.chains]
        trace.jct = float(max(run.end[0] for run in runs))
        released = _static_release(runs) if plan.hold else None
        for run in runs:
            until = run.ends[-1] if released is None else released
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

    def _simulate(self, chain: tuple[StagePlan, ...], trace: Trace | None = None) -> ChainRun:
        nominal = trace is not None  # one sample at the means, recorded node by node
        overhead = np.full(1, self.profile.job_overhead_s)
        state = self._start(overhead) if nominal else self._resume(chain)
        for length, stage in enumerate(chain[state.stages :], start=state.stages + 1):
            instance = self.catalog.get(stage.instance_type, "plan.instance_type")
            price = instance.price(stage.market)  # checks that a spot stage has spot prices
            if state.drain is not None and (stage.bracket, stage.rung) != state.running_stage:
                # A barrier: the trials running in flight end before this stage begins.
                state.now = np.maximum(state.now, state.drain)
                state.busy = state.drain = None
            self._provision(state, stage, instance, trace)
            self._train(state, stage, instance, trace)
            state.rates.append(price / 3600 * state.held.count)
            if not nominal and length < len(chain):  # whole chains are cached by chain()
                self._prefixes[chain[:length]] = state.copy()
        return state.run()

    def _resume(self, chain: tuple[StagePlan, ...]) -> _ChainState:
        """Candidate plans mostly differ in a late stage: the state after the longest prefix
        of ``chain`` already simulated (it depends on nothing after it), or the start."""
        for length in range(len(chain) - 1, 0, -1):
            state = self._prefixes.get(chain[:length])
            if state is not None:
                return state.copy()
        # A chain in flight has only the job's tail ahead; counting all of its overhead
        # again errs on the safe side.
        profile = self.profile
        shift = None if self._fit is None else self._fit[:, 0]
        state = self._start(self.draws.job(profile.job_overhead_s, profile.job_overhead_sd, shift))
        held = self.holding.get(chain[0].bracket)
        if held is not None:  # in flight: it holds its last stage's nodes, ready now
            state.pool = self._held_pool(held)
            if held.running:
                state.busy = self._gpu_free(held)
                state.drain = state.busy.max(axis=(1, 2))
                state.running_stage = held.key
        return state

    def _held_pool(self, held: Held) -> NodePool:
        """The nodes of ``held``'s stage, ready now (spot ones interrupted at their draw)."""
        last = held.stage
        instance = self.catalog.get(last.instance_type, "plan.instance_type")
        zero = np.zeros((self.samples, last.instances))
        rate = instance.interruptions_per_second(last.market)
        fails = self.draws.lifetimes(last, HELD, last.instances, rate) if rate > 0 else None
        return NodePool(instance, last.market, zero, zero, fails)

    def running(self, bracket: int) -> Array:
        """Seconds left (S x r) of the trials running on the nodes ``bracket`` holds, each
        drawn given the time it has run (``elastune.planners.cost.montecarlo.held``); cached."""
        left = self._running.get(bracket)
        if left is None:
            held = self.holding[bracket]
            stage = held.stage
            layout = self._layout(stage, self.catalog.get(stage.instance_type))
            trial = np.arange(len(held.running)) % stage.trials
            mean = self._means(layout)[..., trial]
            speed = self.draws.speed(self.profile.run_cv)
            u = self.draws.uniforms(stage.bracket, stage.rung, RUNNING, len(trial))
            ran, sd = np.array(held.running), self._sd(layout)[..., trial]
            left = self._running[bracket] = left_after(ran, mean, sd, speed, u)
        return left

    def _gpu_free(self, held: Held) -> Array:
        """When each GPU of ``held``'s nodes is free (S x nodes x gpus); cached, as every
        chain that resumes from it and every plan's draining asks again."""
        free = self._free.get(held.stage.bracket)
        if free is None:
            instance = self.catalog.get(held.stage.instance_type)
            placement = self._layout(held.stage, instance).placement
            left = self.running(held.stage.bracket)
            free = gpu_free(placement, held.stage.instances, instance.gpus, left)
            self._free[held.stage.bracket] = free
        return free

    def _sd(self, layout: StageLayout) -> Array:
        """The sd of each trial's segment time, per sample where the straggler spread was
        read from a few segments (``Profile.segment_cv_dof``): each run its own spread."""
        if self._spread is None:
            return layout.sd
        extra = layout.spread_sd**2 * (self._spread**2 - 1.0)
        return np.sqrt(np.maximum(layout.sd**2 + extra, 0.0))

    def _means(self, layout: StageLayout) -> Array:
        """The mean segment time of each trial, per sample where the calibration errs."""
        return layout.mean + (0.0 if self._fit is None else self._fit[:, 1:] @ layout.basis)

    def _start(self, overhead: Array) -> _ChainState:
        """A chain at the job's start, the job's overhead drawn: the tail's share of it
        (``job_tail_s`` of ``job_overhead_s``) after the last stage, the rest before the
        first, so that its spread moves the JCT as it did whole."""
        profile = self.profile
        share = profile.job_tail_s / profile.job_overhead_s if profile.job_overhead_s else 0.0
        return _ChainState.start(overhead * (1 - share), overhead * share)

    def _provision(
        self, state: _ChainState, stage: StagePlan, instance: InstanceType, trace: Trace | None
    ) -> None:
        """Resize the chain's pool at the barrier before ``stage``: another type or market
        releases all of it, surplus nodes go (the newest first, so survivors keep their
        nodes), kept spot nodes interrupted while idle are replaced, missing ones requested."""
        pool = state.pool
        if pool is not None and (pool.instance.name, pool.market) != (
            instance.name,
            stage.market,
        ):
            state.release(pool, trace)  # another type or market: a new pool
            pool, state.busy = None, None
        if pool is not None and state.busy is not None:
            # The nodes that free first take the stage; the others go as their trials end.
            order = np.argsort(state.busy.max(axis=2), axis=1, kind="stable")
            pool = pool.reordered(order)
            state.busy = np.take_along_axis(state.busy, order[:, :, None], axis=1)
        if pool is not None and pool.count > stage.instances:
            pool, gone = pool.split(stage.instances)  # the newest go; survivors keep theirs
            state.release(gone, trace, first=stage.instances)
        if pool is not None and pool.fails is not None:
            pool, charge = while_idle(self.draws, stage, pool, state.now)
            state.released = state.released + charge
        missing = stage.instances - (0 if pool is None else pool.count)
        if missing > 0:
            new = self._request(stage, instance, missing, state.now, trace)
            pool = new if pool is None else pool.join(new)
        assert pool is not None  # a stage holds at least one node
        state.pool = pool

    def _request(
        self,
        stage: StagePlan,
        instance: InstanceType,
        count: int,
        now: Array,
        trace: Trace | None,
    ) -> NodePool:
        """``count`` new nodes requested at ``now``, ready after queueing plus startup (the
        means in the nominal trace) and, on spot, interrupted after a sampled lifetime."""
        if trace is not None:
            mean_delay = instance.queueing.mean_s + instance.startup.mean_s
            delay = np.full((1, count), mean_delay)
            rate = 0.0  # the nominal trace plays no interruption
        else:
            delay = self.draws.delays(instance, stage, (QUEUE, STARTUP), count)
            rate = instance.interruptions_per_second(stage.market)
        ready = now[:, None] + delay
        request = np.broadcast_to(now[:, None], ready.shape)
        fails = None
        if rate > 0:
            fails = ready + self.draws.lifetimes(stage, LIFETIME, count, rate)
        ids = (
            ()
            if trace is None
            else trace.request(stage.bracket, instance, stage.market, float(now[0]), ready[0])
        )
        return NodePool(instance, stage.market, request, ready, fails, ids)

    def _train(
        self, state: _ChainState, stage: StagePlan, instance: InstanceType, trace: Trace | None
    ) -> None:
        """Run ``stage`` on the chain's pool: a slot starts as soon as its node is ready and
        the stage ends with its last slot; spot nodes interrupted meanwhile are replaced."""
        pool = state.held
        layout = self._layout(stage, instance)
        placement = layout.placement
        slot_ready = np.maximum(state.now[:, None], pool.ready[:, placement.slot_nodes])
        if state.busy is not None:  # the rest of a stage in flight: GPUs free as trials end
            slot_ready = np.maximum(slot_ready, slot_free(placement, instance.gpus, state.busy))
        if trace is not None:
            durations = layout.mean[None, :]
        else:
            z = self.draws.normals(stage.bracket, stage.rung, DURATION, stage.trials)
            mean = self._means(layout)
            speed = self.draws.speed(self.profile.run_cv)
            durations = np.maximum(mean + self._sd(layout) * z, 0.0) * speed
        hits = np.zeros(len(state.now))
        if pool.fails is not None:
            busy = slot_ready + durations @ placement.gather
            unit = layout.slot_unit
            busy, pool, charge, hits = while_busy(
                self.draws, self.profile.overhead_s, stage, placement, pool, busy, unit
            )
            state.released = state.released + charge
            end = busy.max(axis=1)
        elif placement.waves == 1:
            end = (slot_ready[:, placement.slot_of_trial] + durations).max(axis=1)
        else:
            end = (slot_ready + durations @ placement.gather).max(axis=1)
        if trace is not None:
            trace.stage(stage, placement, durations[0], slot_ready[0], pool.ids)
        if state.drain is not None:  # the stage ends with its trials that ran in flight too
            end = np.maximum(end, state.drain)
            state.busy = state.drain = None
        state.pool = pool
        state.starts.append(slot_ready.min(axis=1))
        state.ends.append(end)
        state.lost.append(hits)
        state.now = end

    def _layout(self, stage: StagePlan, instance: InstanceType) -> StageLayout:
        key = (stage, instance.name)
        if key not in self._layouts:
            self._layouts[key] = stage_layout(self.profile, self.packed(stage, instance), instance)
        return self._layouts[key]

    def packed(self, stage: StagePlan, instance: InstanceType) -> StagePlan:
        """The stage as this simulator runs it: :func:`.layout.packed` with packing, else as
        planned."""
        return packed(self.profile, stage, instance) if self.packing else stage
