"""SEER: the most configurations a deadline and a budget can explore (docs/algorithms.md §4.2-4.3).

Elastic SHA in wall-clock time: ``K`` stages of ``T = D/K - o`` hours; ``N_1`` trials start
on ``u(1)`` GPUs and after every stage the best ``N_k = floor(N_1/eta^(k-1))`` survive. A
survivor's tier ``u(f)`` is fixed by its projected last stage ``f`` (projected finalists get
the biggest), tiers ascend, and each is the smallest GPU count that still trains a trial
whose last stage is ``f`` to ``R/eta^(K-f)`` in time. Spending no more GPUs than that on
scale-out leaves the budget for exploration, which is SEER's argument under sublinear
scaling. The solver enumerates ``K`` and takes the largest ``N_1`` within the budget (and
the GPU quota); ties go to the lower cost, then to the finalist's higher progress.

:func:`solve` is the pure arithmetic of §4.3 in GPU-hours. :class:`Seer` turns it into an
allocation plan on an instance type and prices it with the simulator: provisioning,
stragglers and whole-node billing make the real plan longer and dearer than the
arithmetic, so the deadline and budget it solves for are tightened until the simulated
p95 JCT and p95 cost fit.

Example (docs/algorithms.md §4.5):
    >>> table = solve(12, 150, max_resource=27, eta=3,
    ...               units_per_hour={1: 1.0, 2: 1.8, 4: 3.2, 8: 5.6})
    >>> best = table.best
    >>> best.stages, best.units, best.trials, best.gpu_hours, round(best.finalist_progress, 1)
    (4, (1.0, 1.0, 1.0, 4.0), (28, 9, 3, 1), 150.0, 31.8)
    >>> [(row.stages, row.trials) for row in table.rows if row.feasible]
    [(1, (3,)), (2, (8, 2)), (3, (17, 5, 1)), (4, (28, 9, 3, 1))]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from elastune.planners.cost.montecarlo.outcome import Outcome
from elastune.planners.cost.montecarlo.simulate import PlanSimulator
from elastune.planners.cost.pricing.allocation import AllocationPlan, GpuTier, StagePlan
from elastune.planners.cost.pricing.catalog import InstanceType
from elastune.planners.spec import SpecError
from elastune.planners.staging import nodes_needed

_SLACK = 1e-9  # progress exactly on target (3 + 6 = 9 epochs) meets it


@dataclass(frozen=True)
class SeerRow:
    """The best plan with ``stages`` stages, or why there is none."""

    stages: int
    stage_hours: float
    units: tuple[float, ...] = ()  # u(1..K): GPUs per trial by projected last stage
    trials: tuple[int, ...] = ()  # N_1..N_K
    gpu_hours: float = 0.0
    finalist_progress: float = 0.0
    stage_gpus: tuple[float, ...] = ()
    reason: str = ""  # why infeasible; empty when feasible

    @property
    def feasible(self) -> bool:
        return not self.reason


@dataclass(frozen=True)
class SeerTable:
    rows: tuple[SeerRow, ...]

    @property
    def best(self) -> SeerRow | None:
        feasible = [r for r in self.rows if r.feasible]
        if not feasible:
            return None
        return max(feasible, key=lambda r: (r.trials[0], -r.gpu_hours, r.finalist_progress))


def survivors(first: int, stages: int, eta: int) -> tuple[int, ...]:
    """``N_k = floor(N_1 / eta^(k-1))`` for k = 1..K."""
    alive, out = first, []
    for _ in range(stages):
        out.append(alive)
        alive //= eta
    return tuple(out)


def stage_gpus(trials: Sequence[int], units: Sequence[float]) -> tuple[float, ...]:
    """GPUs per stage: stage 1 all on u(1); stage k >= 2, rank i on u(f(i, k)) (§4.2 rule 5)."""
    k_max = len(trials)
    nxt = [*trials[1:], 0]
    gpus = [trials[0] * units[0]]
    for k in range(1, k_max):
        gpus.append(sum((trials[f] - nxt[f]) * units[f] for f in range(k, k_max)))
    return tuple(gpus)


def solve(
    deadline_h: float,
    budget_gpu_h: float,
    *,
    max_resource: float,
    eta: int,
    units_per_hour: Mapping[float, float],
    overhead_h: float = 0.0,
    min_resource: float = 1.0,
    max_gpus: float | None = None,
) -> SeerTable:
    """Enumerate ``K`` and solve §4.3 exactly. ``units_per_hour`` is ``S(g)`` per count."""
    if not units_per_hour:
        raise ValueError("units_per_hour must list at least one GPU count")
    speed = {float(g): s for g, s in units_per_hour.items()}
    rows = []
    k = 1
    while (first_target := max_resource / eta ** (k - 1)) >= min_resource * (1 - _SLACK):
        hours = deadline_h / k - overhead_h
        if hours <= 0:
            rows.append(SeerRow(k, hours, reason="no time left per stage after the overhead"))
        else:
            rows.append(_best_with(k, hours, budget_gpu_h, max_resource, eta, speed, max_gpus))
        k += 1
    rows.append(SeerRow(k, 0.0, reason=f"stage-1 target {first_target:.3g} < min_resource"))
    return SeerTable(tuple(rows))


def _best_with(
    stages: int,
    hours: float,
    budget_gpu_h: float,
    max_resource: float,
    eta: int,
    speed: Mapping[float, float],
    max_gpus: float | None,
) -> SeerRow:
    """The most trials ``stages`` stages of ``hours`` allow, or why none fit."""
    units = _units(hours, stages, max_resource, eta, sorted(speed), speed)
    if units is None:
        reason = f"a finalist cannot reach {max_resource:g} in {stages} stages of {hours:.3g} h"
        return SeerRow(stages, hours, reason=reason)

    def spend(n: int) -> tuple[float, float]:
        gpus = stage_gpus(survivors(n, stages, eta), units)
        return hours * sum(gpus), max(gpus)

    def fits(n: int) -> bool:
        total, peak = spend(n)
        return total <= budget_gpu_h * (1 + _SLACK) and (max_gpus is None or peak <= max_gpus)

    least = eta ** (stages - 1)  # so that N_K >= 1
    if not fits(least):
        reason = f"{least} trials need {spend(least)[0]:.4g} GPU-h or more GPUs than allowed"
        return SeerRow(stages, hours, units, reason=reason)
    high = least
    while fits(high * 2):  # spend grows with n: double, then bisect
        high *= 2
    low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    trials = survivors(low, stages, eta)
    progress = hours * speed[units[0]] + (stages - 1) * hours * speed[units[-1]]
    gpus = stage_gpus(trials, units)
    return SeerRow(stages, hours, units, trials, hours * sum(gpus), progress, gpus)


def _units(
    hours: float,
    stages: int,
    max_resource: float,
    eta: int,
    counts: Sequence[float],
    speed: Mapping[float, float],
) -> tuple[float, ...] | None:
    """The smallest non-decreasing ``u(f)`` whose progress meets every target, or None."""
    units: list[float] = []
    for f in range(1, stages + 1):
        target = max_resource / eta ** (stages - f)
        floor = units[-1] if units else counts[0]
        for g in (c for c in counts if c >= floor):
            first = speed[units[0]] if units else speed[g]
            progress = hours * first + (f - 1) * hours * speed[g]
            if progress >= target * (1 - _SLACK):
                units.append(g)
                break
        else:
            return None
    return tuple(units)


@dataclass(frozen=True)
class SeerResult:
    """A SEER solution turned into a priced plan on one instance type."""

    plan: AllocationPlan
    outcome: Outcome
    solution: SeerRow
    instance_type: str
    feasible: bool
    smallest_deadline: float | None = None  # seconds, when the deadline cannot be met
    smallest_budget: float | None = None  # dollars, when the budget cannot be met


def to_plan(
    row: SeerRow,
    instance: InstanceType,
    units_per_hour: Mapping[float, float],
    max_resource: float = math.inf,
) -> AllocationPlan:
    """One stage per SEER stage, one tier per GPU count (projected finalists first); a
    trial trains ``T * S(u)`` in a stage, which takes ``T`` on average, but never past
    ``max_resource``: a trial that is done stops and frees its GPUs."""
    hours, units, trials, k_max = row.stage_hours, row.units, row.trials, row.stages
    nxt = [*trials[1:], 0]
    first = min(hours * units_per_hour[units[0]], max_resource)  # everyone, after stage 1
    stages = []
    for k in range(k_max):
        groups: dict[float, list[float]] = {}  # u -> [trials, start]; same u, same tier
        if k == 0:
            groups[units[0]] = [trials[0], 0.0]
        for f in reversed(range(max(k, 1), k_max)):
            if k and trials[f] > nxt[f]:
                start = first + (k - 1) * hours * units_per_hour[units[f]]
                groups.setdefault(units[f], [0, start])[0] += trials[f] - nxt[f]
        tiers = tuple(
            GpuTier(int(n), u, min(hours * units_per_hour[u], max_resource - start), start)
            for u, (n, start) in groups.items()
            if start < max_resource
        )
        if not tiers:
            break
        sizes = tuple(t.gpus for t in tiers for _ in range(t.trials))
        stages.append(StagePlan(0, k, tiers, instance.name, nodes_needed(sizes, instance.gpus)))
    return AllocationPlan((tuple(stages),))


class Seer:
    """SEER planner priced by the simulator (see the module docstring).

    Args:
        simulator: Prices plans; its quantile is the feasibility level.
        instance_types: Types to try; the plan uses one of them for every stage.
        deadline: Seconds for the whole job.
        budget: Dollars for the whole job.
        max_gpus: GPUs the job may hold at once; None: no quota.
    """

    def __init__(
        self,
        simulator: PlanSimulator,
        instance_types: Sequence[str],
        *,
        deadline: float,
        budget: float,
        max_gpus: int | None = None,
    ):
        if not deadline > 0:
            raise ValueError(f"deadline must be positive, got {deadline}")
        if not budget > 0:
            raise ValueError(f"budget must be positive, got {budget}")
        self.simulator = simulator
        self.profile = simulator.profile
        self.types = simulator.catalog.select(instance_types)
        self.deadline = deadline
        self.budget = budget
        self.max_gpus = max_gpus

    def plan(self, max_resource: float, eta: int, min_resource: float = 1.0) -> SeerResult:
        usable, problems = [], []
        for instance in self.types:
            try:
                self.profile.check(instance)
                usable.append(instance)
            except SpecError as problem:
                problems.append(problem)
        if not usable:
            raise problems[0]
        results = [self._on(t, max_resource, eta, min_resource) for t in usable]
        feasible = [r for r in results if r.feasible]
        if feasible:
            return max(feasible, key=lambda r: (r.solution.trials[0], -r.outcome.cost_mean))
        late = [r for r in results if r.smallest_deadline is not None]
        if len(late) == len(results):
            return min(late, key=lambda r: r.smallest_deadline or 0.0)
        return min(results, key=lambda r: r.smallest_budget or math.inf)

    def _on(
        self, instance: InstanceType, max_resource: float, eta: int, min_resource: float
    ) -> SeerResult:
        speed = {
            g: self.profile.units_per_hour(g, instance) for g in self.profile.counts_for(instance)
        }

        def solve_for(deadline_h: float, budget_h: float) -> SeerTable:
            return solve(
                deadline_h,
                budget_h,
                max_resource=max_resource,
                eta=eta,
                units_per_hour=speed,
                overhead_h=self.profile.overhead_s / 3600,
                min_resource=min_resource,
                max_gpus=self.max_gpus,
            )

        # Provisioning happens once, before stage 1 (later pools only shrink).
        first_deadline_h = (
            self.deadline - instance.queueing.mean_s - instance.startup.mean_s
        ) / 3600
        best = self._fit(instance, speed, solve_for, first_deadline_h, max_resource)
        if best is not None:
            return best

        # The arithmetic found nothing that fits once priced: try the smallest plans, one
        # per stage count (N_1 = eta^(K-1)), and one trial on the fastest GPU count.
        fastest = max(speed, key=lambda g: speed[g])
        rows = [SeerRow(1, max_resource / speed[fastest], (fastest,), (1,))]
        for row in solve_for(first_deadline_h, 0.0).rows:  # no budget: every row says why,
            if row.units:  # and those with units met the deadline
                least = survivors(eta ** (row.stages - 1), row.stages, eta)
                rows.append(SeerRow(row.stages, row.stage_hours, row.units, least))
        priced = []
        for row in rows:
            plan = to_plan(row, instance, speed, max_resource)
            priced.append((plan, self.simulator.run(plan), row))
        on_time = [p for p in priced if p[1].jct_q <= self.deadline]
        within = [p for p in on_time if p[1].cost_q <= self.budget]
        if within:
            plan, outcome, row = max(within, key=lambda p: (p[2].trials[0], -p[1].cost_mean))
            return SeerResult(plan, outcome, row, instance.name, True)
        if not on_time:
            plan, outcome, row = priced[0]
            smallest = math.ceil(outcome.jct_q)
            return SeerResult(plan, outcome, row, instance.name, False, smallest_deadline=smallest)
        plan, outcome, row = min(on_time, key=lambda p: p[1].cost_q)
        smallest = math.ceil(outcome.cost_q * 100) / 100
        return SeerResult(plan, outcome, row, instance.name, False, smallest_budget=smallest)

    def _fit(
        self,
        instance: InstanceType,
        speed: Mapping[float, float],
        solve_for: Callable[[float, float], SeerTable],
        deadline_h: float,
        max_resource: float,
    ) -> SeerResult | None:
        """Solve, price, adjust: the deadline shrinks by what the simulated p95 JCT
        overshoots; the budget (GPU-hours) is bisected against the simulated p95 cost,
        which node granularity raises and early finishers (capped at R) lower. The plan
        with the most trials that fits wins."""
        budget_h = self.budget / instance.price_per_gpu_hour
        fits_at, fails_at = 0.0, math.inf  # budgets known to fit and to overspend
        best: SeerResult | None = None
        for _ in range(16):
            row = solve_for(deadline_h, budget_h).best if deadline_h > 0 else None
            if row is None:
                break
            plan = to_plan(row, instance, speed, max_resource)
            outcome = self.simulator.run(plan)
            late = outcome.jct_q - self.deadline
            if late > 0:
                deadline_h -= late / 3600 * 1.05
                continue
            if outcome.cost_q > self.budget:
                fails_at = budget_h
                budget_h = (
                    (fits_at + budget_h) / 2
                    if fits_at
                    else budget_h * self.budget / outcome.cost_q * 0.99
                )
            else:
                result = SeerResult(plan, outcome, row, instance.name, True)
                if best is None or (row.trials[0], -outcome.cost_mean) > (
                    best.solution.trials[0],
                    -best.outcome.cost_mean,
                ):
                    best = result
                fits_at = budget_h
                if math.isinf(fails_at) and outcome.cost_q < 0.99 * self.budget:
                    budget_h *= min(2.0, self.budget / outcome.cost_q)  # money left: spend it
                elif math.isinf(fails_at):
                    break
                else:
                    budget_h = (budget_h + fails_at) / 2
            if fails_at < math.inf and fits_at and fails_at / fits_at < 1.01:
                break
        return best
