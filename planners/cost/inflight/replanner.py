"""Re-planning in flight (docs/algorithms.md §5.8): at each stage barrier, and inside a stage
once its first wave has reported, whether to keep the plan of the work left, under the
profile learnt from the job's own segments (``elastune.planners.cost.inflight.estimate``).

:class:`Replanner` decides, given the plan, the trials finished per stage, the seconds elapsed and
the dollars spent, the updated profile and the nodes each chain holds
(:class:`~elastune.planners.cost.montecarlo.held.Held`: those of the stage it is running or has just
finished, and the trials still running on them). The trials not begun are the work left: inside a
stage, its trials not begun are a stage of their own, whose concurrency the new plan may change,
while those running end where they are. It prices the plan of the work left with
:class:`~elastune.planners.cost.montecarlo.simulate.PlanSimulator` and lets
:class:`~elastune.planners.cost.planning.rubberband.RubberBand` plan it afresh against what is left
of the deadline, each chain on the nodes it holds (a next stage that keeps them pays no startup, and
starts on a GPU once the trial running there has ended). The greedy runs from its usual starts, from
the kept plan (a kept plan that meets the deadline is the dearest the new one can be) and from the
plan it makes as if no node were held: a one-stage move off held nodes pays a startup they do not,
so the greedy can stay on the held type while a pool of another type for several stages is cheaper.
Then:

- ``deadline_at_risk``: no plan meets the remaining deadline at the quantile: decide as
  below at the highest of :data:`AT_RISK_QUANTILES` at which one does, else go on at the
  fastest plan (RubberBand's infeasible answer); say so. Not the fastest at any price: a
  few scattered segments can read a speed as late that is not;
- ``late``: the kept plan misses the deadline left at the quantile, the new one meets it: switch;
- ``over_budget``: the kept plan's cost at the quantile exceeds the budget left and the new
  plan (which meets the deadline) costs less: switch;
- ``cheaper``: the new plan meets both and its mean cost is below the kept plan's by more
  than ``margin`` (a re-plan moves nodes, so a small saving is not worth it): switch;
- ``on_track``: keep the plan.

Example (the profile said 720 s per unit; the first stage measured twice that):
    >>> from elastune.planners.cost.pricing.catalog import parse_catalog
    >>> from elastune.planners.cost.inflight.estimate import ProfileEstimate
    >>> from elastune.planners.cost.montecarlo.held import Held
    >>> from elastune.planners.staging import Profile, Stage
    >>> catalog = parse_catalog({"instance_types": {"p3.8xlarge": {
    ...     "gpus": 4, "gpu": "V100", "price_per_hour": 12.24, "startup": {"mean_s": 180}}}})
    >>> prior = Profile.from_scaling(720, speedup={2: 1.8, 4: 3.2})
    >>> job = [Stage(0, 0, 8, 0, 1), Stage(0, 1, 4, 1, 3), Stage(0, 2, 2, 3, 7)]
    >>> replanner = Replanner(catalog, ["p3.8xlarge"], job, deadline=80 * 60, samples=50)
    >>> plan = replanner.plan(prior).plan
    >>> plan.gpus_per_trial
    (('1', '1', '2'),)
    >>> estimate = ProfileEstimate(prior)
    >>> for _ in range(8):
    ...     estimate.observe(1, 1.0, 1440.0)
    >>> held = {0: Held(plan.chains[0][0])}  # the nodes of the stage just finished
    >>> finished = {(0, 0): 8}  # trials done per stage
    >>> decision = replanner.decide(plan, finished, 1600.0, 20.0, estimate.profile(), held)
    >>> decision.reason, decision.plan.gpus_per_trial, decision.meets_at
    (<Reason.LATE: 'late'>, (('4', '4'),), 0.95)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from elastune.planners.cost.montecarlo.held import Held
from elastune.planners.cost.montecarlo.outcome import Outcome
from elastune.planners.cost.montecarlo.simulate import PlanSimulator
from elastune.planners.cost.planning.rubberband import RubberBand, RubberBandResult
from elastune.planners.cost.pricing.allocation import AllocationPlan, StagePlan
from elastune.planners.cost.pricing.catalog import Catalog
from elastune.planners.staging import Profile, Stage, place

# The quantiles a plan may meet the deadline at when none meets it at the replanner's own,
# highest first: the plan chosen then is the cheapest with the best chance at it.
AT_RISK_QUANTILES = (0.9, 0.8, 0.7, 0.6, 0.5)


class Reason(StrEnum):
    """Why a re-planning decision kept or changed the plan (module docstring)."""

    ON_TRACK = "on_track"
    LATE = "late"
    OVER_BUDGET = "over_budget"
    CHEAPER = "cheaper"
    DEADLINE_AT_RISK = "deadline_at_risk"


@dataclass(frozen=True)
class Forecast:
    """A plan of the remaining stages, priced: JCT and cost at the quantile, mean cost."""

    jct_s: float
    cost_q: float
    cost_mean: float


@dataclass(frozen=True)
class Decision:
    """What to run for the remaining stages, and why. ``plan`` holds only the work not
    finished, ``outcome`` is its simulation from now; ``kept`` and ``chosen`` forecast the
    old and the chosen plan; ``meets_at`` is the quantile at which the chosen plan meets
    the deadline left (None: no deadline, or at risk and not even at the median)."""

    reason: Reason
    plan: AllocationPlan
    outcome: Outcome
    changed: bool
    kept: Forecast
    chosen: Forecast
    deadline_left_s: float | None
    budget_left_usd: float | None
    meets_at: float | None

    @property
    def deadline_at_risk(self) -> bool:
        return self.reason is Reason.DEADLINE_AT_RISK

    def to_dict(self) -> dict[str, object]:
        """The decision as the plan artifact and ``run --json`` list it."""
        return {
            "reason": self.reason.value,
            "changed": self.changed,
            "deadline_at_risk": self.deadline_at_risk,
            "deadline_left_s": self.deadline_left_s,
            "meets_at": self.meets_at,
            "kept": dataclasses.asdict(self.kept),
            "chosen": dataclasses.asdict(self.chosen),
            "gpus_per_trial": [list(chain) for chain in self.plan.gpus_per_trial],
        }

    def describe(self) -> str:
        """One line for a log: the reason and the two forecasts."""
        left = "" if self.deadline_left_s is None else f" of {self.deadline_left_s:.0f} s left"
        if self.deadline_left_s is None:
            meets = ""
        elif self.meets_at is None:
            meets = ", the fastest plan (misses it even at p50)"
        else:
            meets = f", meets it at p{self.meets_at * 100:g}"
        return (
            f"{self.reason.value}: kept plan p-JCT {self.kept.jct_s:.0f} s{left}, "
            f"${self.kept.cost_mean:.2f}; chosen {self.chosen.jct_s:.0f} s, "
            f"${self.chosen.cost_mean:.2f}{meets}"
        )


class Replanner:
    """Re-plans a job's remaining stages at its barriers (module docstring).

    Args:
        catalog: Instance types and prices.
        instance_types: Types a stage may use.
        stages: Every stage of the job (the scheduler's geometry).
        deadline: Seconds from the job's start; None: no deadline.
        budget: Dollars for the whole job; None: no budget.
        max_gpus, spot: As for :class:`RubberBand`.
        samples, seed, quantile: As for :class:`PlanSimulator`.
        margin: Least relative saving in mean cost that a ``cheaper`` re-plan needs.
    """

    def __init__(
        self,
        catalog: Catalog,
        instance_types: Sequence[str],
        stages: Sequence[Stage],
        *,
        deadline: float | None = None,
        budget: float | None = None,
        max_gpus: int | None = None,
        spot: bool = False,
        samples: int = 200,
        seed: int = 0,
        quantile: float = 0.95,
        margin: float = 0.05,
    ):
        if not 0 <= margin < 1:
            raise ValueError(f"margin must lie in [0, 1), got {margin}")
        self.catalog = catalog
        self.instance_types = list(instance_types)
        self.stages = list(stages)
        self.deadline = deadline
        self.budget = budget
        self.max_gpus = max_gpus
        self.spot = spot
        self.samples, self.seed, self.quantile = samples, seed, quantile
        self.margin = margin

    def rubberband(
        self,
        profile: Profile,
        deadline: float | None,
        holding: Mapping[int, Held] | None = None,
    ) -> RubberBand:
        """RubberBand over this job's types and quota, its plans priced under ``profile``
        against ``deadline`` (None: none), each chain starting on the nodes in ``holding``."""
        simulator = PlanSimulator(
            self.catalog,
            profile,
            samples=self.samples,
            seed=self.seed,
            quantile=self.quantile,
            holding=holding,
        )
        return self._rubberband(simulator, deadline)

    def _rubberband(self, simulator: PlanSimulator, deadline: float | None) -> RubberBand:
        return RubberBand(
            simulator,
            self.instance_types,
            deadline=deadline,
            max_gpus=self.max_gpus,
            spot=self.spot,
        )

    def plan(self, profile: Profile) -> RubberBandResult:
        """The plan of the whole job made before it starts (the static plan)."""
        return self.rubberband(profile, self.deadline).plan(self.stages)

    def decide(
        self,
        plan: AllocationPlan,
        finished: Mapping[tuple[int, int], int],
        elapsed: float,
        spent: float,
        profile: Profile,
        holding: Mapping[int, Held] | None = None,
    ) -> Decision:
        """Keep or change ``plan`` for the work left: ``finished`` counts the trials done
        per stage ((bracket, rung); a stage not named has none), ``elapsed`` seconds and
        ``spent`` dollars into the job, timed by ``profile``. ``holding``: per bracket, the
        nodes the chain holds now and the trials running on them (module docstring);
        the decision's plan holds only the trials not begun."""
        started = under_way(finished, holding)
        remaining = left_to_run(self.stages, started)
        if not remaining:
            raise ValueError("every trial has begun: nothing left to re-plan")
        kept_plan = _remaining(plan, self.stages, started)
        # A deadline already passed still gets a plan: the fastest (1 s cannot be met).
        deadline_left = None if self.deadline is None else max(self.deadline - elapsed, 1.0)
        budget_left = None if self.budget is None else self.budget - spent
        rubberband = self.rubberband(profile, deadline_left, holding)
        kept_outcome = rubberband.simulator.run(kept_plan)
        starts = [kept_plan]
        if holding:  # the plan made as if nothing were held
            starts.append(self.rubberband(profile, deadline_left).plan(remaining).plan)
        fresh = rubberband.plan(remaining, also_from=starts)
        judge, meets_at = rubberband, None if deadline_left is None else self.quantile
        if not fresh.feasible:
            meets_at = None
            lower = self._likeliest(rubberband, remaining, deadline_left, [*starts, fresh.plan])
            if lower is not None:
                judge, fresh, meets_at = lower
        reason, switch = self._choice(
            judge, kept_plan, kept_outcome, fresh, deadline_left, budget_left
        )
        if judge is not rubberband:  # the choice was made at a lower quantile
            reason = Reason.DEADLINE_AT_RISK
        # Both forecasts at the replanner's quantile, whichever quantile chose.
        kept = _forecast(rubberband, kept_plan, kept_outcome)
        chosen_plan, outcome = (fresh.plan, fresh.outcome) if switch else (kept_plan, kept_outcome)
        changed = chosen_plan != kept_plan
        chosen = _forecast(rubberband, chosen_plan, outcome) if changed else kept
        return Decision(
            reason,
            chosen_plan,
            outcome,
            changed,
            kept,
            chosen,
            deadline_left,
            budget_left,
            meets_at,
        )

    def _choice(
        self,
        judge: RubberBand,
        kept_plan: AllocationPlan,
        kept_outcome: Outcome,
        fresh: RubberBandResult,
        deadline_left: float | None,
        budget_left: float | None,
    ) -> tuple[Reason, bool]:
        """Why to keep ``kept_plan`` or switch to ``fresh`` (module docstring), both
        judged at ``judge``'s quantile; True: switch."""
        kept = _forecast(judge, kept_plan, kept_outcome)
        chosen = _forecast(judge, fresh.plan, fresh.outcome)
        if not fresh.feasible:
            return Reason.DEADLINE_AT_RISK, True
        if deadline_left is not None and kept.jct_s > deadline_left:
            return Reason.LATE, True
        if budget_left is not None and kept.cost_q > budget_left and chosen.cost_q < kept.cost_q:
            return Reason.OVER_BUDGET, True
        if chosen.cost_mean < kept.cost_mean * (1 - self.margin):
            return Reason.CHEAPER, True
        return Reason.ON_TRACK, False

    def _likeliest(
        self,
        rubberband: RubberBand,
        remaining: list[Stage],
        deadline_left: float | None,
        starts: Sequence[AllocationPlan],
    ) -> tuple[RubberBand, RubberBandResult, float] | None:
        """When ``rubberband`` finds no plan of ``remaining`` that meets the deadline left
        at the quantile: RubberBand at the highest of :data:`AT_RISK_QUANTILES` at which a
        plan meets it (its simulator's runs shared), that plan and the quantile; None when
        none does, even at the lowest."""
        for quantile in (q for q in AT_RISK_QUANTILES if q < self.quantile):
            lower = self._rubberband(rubberband.simulator.judging(quantile), deadline_left)
            result = lower.plan(remaining, also_from=starts)
            if result.feasible:
                return lower, result, quantile
        return None


def under_way(
    finished: Mapping[tuple[int, int], int], holding: Mapping[int, Held] | None
) -> dict[tuple[int, int], int]:
    """The trials finished or running per stage: ``finished`` and the trials ``holding``
    runs (those the work left no longer holds)."""
    out = dict(finished)
    for held in (holding or {}).values():
        out[held.key] = out.get(held.key, 0) + len(held.running)
    return out


def left_to_run(stages: Sequence[Stage], finished: Mapping[tuple[int, int], int]) -> list[Stage]:
    """The stages with trials left, each with only those trials."""
    out = []
    for stage in stages:
        left = stage.trials - finished.get((stage.bracket, stage.rung), 0)
        if left > 0:
            out.append(dataclasses.replace(stage, trials=left))
    return out


def first_wave(stage: StagePlan, catalog: Catalog) -> int:
    """Trials of ``stage`` that start at once on its nodes (its slots)."""
    return len(place(stage.sizes, catalog.get(stage.instance_type).gpus, stage.instances).slots)


def begun(stage: StagePlan, catalog: Catalog) -> int:
    """Trials of ``stage`` begun when as many of its segments have reported as its first
    wave holds (the flow's moment to decide), its slots all started at once: each earlier
    report freed a slot that began the next (the last one's begins after the decision)."""
    return min(stage.trials, 2 * first_wave(stage, catalog) - 1)


def part(stage: StagePlan, skip: int, count: int | None = None) -> StagePlan:
    """``stage`` with only its trials from ``skip`` on (``count`` of them; None: all), in
    rank order, on the same nodes."""
    trials = [tier for tier in stage.tiers for _ in range(tier.trials)]
    kept = trials[skip:] if count is None else trials[skip : skip + count]
    if not kept:
        raise ValueError(f"stage {stage.name} has no trials from {skip} on")
    tiers = tuple(
        dataclasses.replace(tier, trials=kept.count(tier)) for tier in dict.fromkeys(kept)
    )
    return stage.replace(tiers=tiers)


def _forecast(rubberband: RubberBand, plan: AllocationPlan, outcome: Outcome) -> Forecast:
    """``plan``'s forecast, its JCT judged as RubberBand judges it against the deadline."""
    spot = any(stage.market == "spot" for stage in plan.stages)
    return Forecast(rubberband.judged(outcome.jct, spot), outcome.cost_q, outcome.cost_mean)


def _remaining(
    plan: AllocationPlan, stages: Sequence[Stage], finished: Mapping[tuple[int, int], int]
) -> AllocationPlan:
    """``plan`` for the trials of the job's ``stages`` not finished, chains with none left
    dropped. A stage of ``plan`` may hold only the trials that were left when it was
    chosen (a plan chosen inside that stage): its last ones are those left now."""
    left = {(s.bracket, s.rung): s.trials - finished.get((s.bracket, s.rung), 0) for s in stages}
    chains = []
    for chain in plan.chains:
        kept = []
        for stage in chain:
            n = left[stage.bracket, stage.rung]
            if n > 0:
                kept.append(part(stage, stage.trials - n) if n < stage.trials else stage)
        if kept:
            chains.append(tuple(kept))
    return AllocationPlan(tuple(chains), plan.hold)
