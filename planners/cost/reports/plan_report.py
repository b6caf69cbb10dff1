"""The plan report: what ``elastune plan`` prints, ``--json`` emits and the flow executes.

Example:
    >>> format_duration(1755), format_duration(43200), format_duration(59.2)
    ('29m15s', '12h', '1m')
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from elastune.planners.cost.montecarlo.outcome import Outcome
from elastune.planners.cost.montecarlo.trace import Trace
from elastune.planners.cost.planning.baselines import Baseline
from elastune.planners.cost.pricing.allocation import AllocationPlan
from elastune.planners.cost.pricing.catalog import Catalog
from elastune.planners.cost.pricing.this_machine import LOCAL
from elastune.planners.spec import SpecError
from elastune.planners.staging import place


class InfeasibleError(SpecError):
    """The deadline or budget cannot be met; the message names the field and the smallest
    value that works (the CLI exits 2)."""


def format_duration(seconds: float) -> str:
    """``1h2m3s`` style, rounded up to whole seconds; parseable by the job file."""
    total = math.ceil(seconds - 1e-9)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(hours, "h"), (minutes, "m"), (secs, "s")]
    text = "".join(f"{value}{unit}" for value, unit in parts if value)
    return text or "0s"


@dataclass(frozen=True)
class StageAllocation:
    """What the staged flow needs to run one stage (one tier of a SEER stage): run
    ``trials`` segments, ``concurrent`` at a time, each on ``gpus_per_trial`` GPUs, on a
    pool of ``instances`` x ``instance_type`` bought on ``market`` (on-demand or spot)."""

    bracket: int
    rung: int
    tier: int
    trials: int
    gpus_per_trial: float
    instance_type: str
    instances: int
    concurrent: int
    market: str = "on-demand"


@dataclass(frozen=True)
class StageRow:
    """One row of the stage table: a stage's tier with its predicted times and cost."""

    allocation: StageAllocation
    resource_start: float
    resource_stop: float
    start_s: float  # median training start (after provisioning), seconds from submission
    end_s: float  # median end
    cost_usd: float  # mean, the tier's share of its stage
    interruptions: float = 0.0  # mean spot instances of the stage lost while it trains

    @property
    def name(self) -> str:
        a = self.allocation
        return f"b{a.bracket}-r{a.rung}" + (f"-t{a.tier}" if a.tier else "")

    def to_dict(self) -> dict[str, Any]:
        a = self.allocation
        return {
            "stage": self.name,
            "bracket": a.bracket,
            "rung": a.rung,
            "tier": a.tier,
            "trials": a.trials,
            "resource": {"start": self.resource_start, "stop": self.resource_stop},
            "gpus_per_trial": a.gpus_per_trial,
            "instance_type": a.instance_type,
            "instances": a.instances,
            "market": a.market,
            "expected_interruptions": round(self.interruptions, 4),
            "concurrent": a.concurrent,
            "start_s": round(self.start_s, 1),
            "end_s": round(self.end_s, 1),
            "cost_usd": round(self.cost_usd, 4),
        }


@dataclass(frozen=True)
class Problem:
    """Why the plan is infeasible: ``field`` cannot be met; ``smallest`` would work."""

    field: str
    message: str
    smallest: float


def rows_for(plan: AllocationPlan, outcome: Outcome, catalog: Catalog) -> tuple[StageRow, ...]:
    """The stage table of a priced plan, one row per tier."""
    rows = []
    for stage, times in zip(plan.stages, outcome.stages, strict=True):
        gpus_per_node = catalog.get(stage.instance_type).gpus
        slots = place(stage.sizes, gpus_per_node, stage.instances).slots
        start, end = (float(np.median(x)) for x in (times.start, times.end))
        for index, tier in enumerate(stage.tiers):
            concurrent = min(tier.trials, sum(abs(s.gpus - tier.gpus) < 1e-9 for s in slots))
            share = tier.trials * tier.gpus / stage.gpus
            allocation = StageAllocation(
                stage.bracket,
                stage.rung,
                index,
                tier.trials,
                tier.gpus,
                stage.instance_type,
                stage.instances,
                concurrent,
                stage.market,
            )
            cost = times.cost * share
            row = StageRow(allocation, tier.start, tier.stop, start, end, cost, times.interruptions)
            rows.append(row)
    return tuple(rows)


def _baseline_dict(baseline: Baseline, plan_cost: float) -> dict[str, Any]:
    out: dict[str, Any] = {
        "instance_type": baseline.instance_type,
        "instances": baseline.nodes,
        "gpus": baseline.gpus,
        "meets_deadline": baseline.meets_deadline,
    }
    if baseline.outcome is not None:
        out["jct_s"] = baseline.outcome.summary(baseline.outcome.jct)
        out["cost_usd"] = baseline.outcome.summary(baseline.outcome.cost)
        # A free plan (the local type at price 0) has no cost ratio.
        out["cost_ratio"] = round(baseline.outcome.cost_mean / plan_cost, 3) if plan_cost else None
    if baseline.note:
        out["note"] = baseline.note
    return out


@dataclass
class PlanReport:
    """A priced plan with its baselines. ``allocations`` is what the flow executes."""

    planner: str
    plan: AllocationPlan
    outcome: Outcome
    rows: tuple[StageRow, ...]
    baselines: tuple[Baseline, Baseline]
    catalog: Catalog
    deadline_s: float | None
    budget_usd: float | None
    samples: int
    problems: tuple[Problem, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)  # planner-specific (SEER's K, T…)
    trace: Trace | None = None
    spot_allowed: bool = False  # the job's compute.spot

    @property
    def feasible(self) -> bool:
        return not self.problems

    @property
    def allocations(self) -> tuple[StageAllocation, ...]:
        return tuple(row.allocation for row in self.rows)

    def allocation(self, bracket: int, rung: int) -> StageAllocation:
        """The stage's allocation, for the staged flow (one tier per stage)."""
        found = [a for a in self.allocations if (a.bracket, a.rung) == (bracket, rung)]
        if len(found) != 1:
            raise KeyError(f"plan has {len(found)} allocations for bracket {bracket} rung {rung}")
        return found[0]

    def check(self) -> None:
        """Raise :class:`InfeasibleError` (a SpecError: exit 2) if the plan is infeasible."""
        if self.problems:
            raise InfeasibleError("; ".join(p.message for p in self.problems))

    def to_dict(self) -> dict[str, Any]:
        cost = self.outcome.cost_mean
        static_max, static_min = self.baselines
        return {
            "planner": self.planner,
            "feasible": self.feasible,
            "problems": [
                {"field": p.field, "message": p.message, "smallest": p.smallest}
                for p in self.problems
            ],
            "deadline_s": self.deadline_s,
            "budget_usd": self.budget_usd,
            "quantile": self.outcome.quantile,
            "samples": self.samples,
            "jct_s": self.outcome.summary(self.outcome.jct),
            "cost_usd": self.outcome.summary(self.outcome.cost),
            "stages": [row.to_dict() for row in self.rows],
            "spot": {
                "allowed": self.spot_allowed,
                "stages": [row.name for row in self.rows if row.allocation.market == "spot"],
                "expected_interruptions": round(float(self.outcome.interruptions.mean()), 4),
            },
            "baselines": {
                "static_max": _baseline_dict(static_max, cost),
                "static_min": _baseline_dict(static_min, cost),
            },
            "catalog": {
                "region": self.catalog.region,
                "prices_read": self.catalog.prices_read,
                "source": self.catalog.source,
            },
            **self.details,
        }

    def forecast(self) -> dict[str, Any]:
        """What the plan forecasts, to hold a run against: JCT and cost (p50, p95), and per
        stage its end (seconds from the job's start, p50 and p95), its mean cost and what
        its nodes cost per second (a measured stage time prices the measured cost)."""
        rates = [rate for run, _ in self.outcome.chains for rate in run.rates]
        stages = {}
        for stage, times, rate in zip(self.plan.stages, self.outcome.stages, rates, strict=True):
            p50, p95 = np.quantile(times.end, [0.5, 0.95])
            stages[f"b{stage.bracket}-r{stage.rung}"] = {
                "end_s": {"p50": round(float(p50), 2), "p95": round(float(p95), 2)},
                "cost_usd": round(times.cost, 6),
                "usd_per_s": rate,
            }
        jct, cost = (np.quantile(x, [0.5, 0.95]) for x in (self.outcome.jct, self.outcome.cost))
        return {
            "jct_s": {"p50": round(float(jct[0]), 2), "p95": round(float(jct[1]), 2)},
            "cost_usd": {"p50": round(float(cost[0]), 6), "p95": round(float(cost[1]), 6)},
            "stages": stages,
        }

    @property
    def devices(self) -> str:
        """What the plan's devices are called: this machine's are its slots (its CUDA
        devices, or ``compute.workers`` on a CPU), a catalog's types have GPUs."""
        return "slots" if set(self.catalog.instance_types) == {LOCAL} else "GPUs"

    def _devices(self, one: bool) -> str:
        """The plan's devices named for one of them, or for several."""
        return self.devices[:-1] if one else self.devices

    def to_table(self, narrow: bool = False) -> tuple[list[str], list[list[str]]]:
        """Column names and rows of the stage table, as strings for a rich Table; the market
        and interruptions columns only when a stage runs on spot. ``narrow``: one ``spot``
        column (``yes`` or ``-``) instead of those two, for an 80-column screen (the lines
        under the table give the interruptions of the whole run)."""
        spot = any(row.allocation.market == "spot" for row in self.rows)
        columns = ["stage", "trials", "resource", f"{self.devices}/trial", "instances"]
        if spot:
            columns += ["spot"] if narrow else ["market", "interruptions"]
        columns += ["start", "end", "cost"]
        rows = []
        for row in self.rows:
            on_spot = row.allocation.market == "spot"
            if narrow:
                market = ["yes" if on_spot else "-"]
            else:
                market = [row.allocation.market, f"{row.interruptions:.2f}" if on_spot else "-"]
            rows.append(
                [
                    row.name,
                    str(row.allocation.trials),
                    f"{row.resource_start:g} → {row.resource_stop:g}",
                    f"{row.allocation.gpus_per_trial:g}",
                    f"{row.allocation.instance_type} × {row.allocation.instances}",
                    *(market if spot else []),
                    format_duration(row.start_s),
                    format_duration(row.end_s),
                    f"${row.cost_usd:,.2f}",
                ]
            )
        return columns, rows

    def _own(self, first: dict[str, Any]) -> str:
        """RubberBand's own first stage where the start is another, for the summary."""
        own = first.get("rubberband")
        if own is None:
            return ""
        width = own["gpus_per_trial"]
        return (
            f"; RubberBand's plan starts on {own['instance_type']} × {own['instances']} "
            f"({width} {self._devices(width == '1')} per trial), mean cost "
            f"${own['plan_cost_mean_usd']:,.2f} if the profile is right"
        )

    def summary_lines(self) -> list[str]:
        """The lines under the table: predictions, feasibility, baselines."""
        jct = self.outcome.summary(self.outcome.jct)
        cost = self.outcome.summary(self.outcome.cost)
        lines = [
            f"predicted JCT  p50 {format_duration(jct['p50'])}  p95 {format_duration(jct['p95'])}"
            + (f"  (deadline {format_duration(self.deadline_s)})" if self.deadline_s else ""),
            f"predicted cost p50 ${cost['p50']:,.2f}  p95 ${cost['p95']:,.2f}"
            + (f"  (budget ${self.budget_usd:,.2f})" if self.budget_usd else ""),
            "feasible"
            if self.feasible
            else "INFEASIBLE: " + "; ".join(p.message for p in self.problems),
        ]
        first = self.details.get("first_stage")
        if first is not None:
            lines.append(f"first stage: chosen for {first['chosen_for']}{self._own(first)}")
        spot = sum(row.allocation.market == "spot" for row in self.rows)
        if spot:
            lines.append(
                f"spot: {spot} of {len(self.rows)} stages, "
                f"{self.outcome.interruptions.mean():.2f} interruptions expected per run "
                "(lost work and restarts are in the predictions)"
            )
        elif self.spot_allowed:
            lines.append("spot: allowed, but no stage is cheaper on spot and on time at p95")
        for baseline in self.baselines:
            if baseline.outcome is None:
                lines.append(f"{baseline.name}: {baseline.note}")
                continue
            b_jct = baseline.outcome.jct_q
            plan_cost = self.outcome.cost_mean
            times = baseline.outcome.cost_mean / plan_cost if plan_cost else None
            ratio = "" if times is None else f" ({times:.2f}x the plan)"
            held = f"{baseline.gpus} {self._devices(baseline.gpus == 1)}"
            lines.append(
                f"{baseline.name}: {baseline.instance_type} × {baseline.nodes} ({held}) "
                f"for the whole job, p95 JCT {format_duration(b_jct)}, "
                f"mean cost ${baseline.outcome.cost_mean:,.2f}{ratio}"
                + ("" if baseline.meets_deadline else ", misses the deadline")
            )
        lines.append(
            f"prices: {self.catalog.source} (read {self.catalog.prices_read}); "
            f"{self.samples} Monte Carlo samples"
        )
        return lines
