"""Benchmark of the cost planner: RubberBand against brute force and static pools.

For every scenario (job size, scaling, billing, instance types, tight or loose deadline)
it prints and records:

- the plan's mean cost over the brute-force optimum: every plan of the same plan space
  (per stage: instance type, GPUs per trial, node count per wave count), priced by the
  same simulator on the same draws, where the space is small enough to enumerate;
- the static baselines' cost over the plan's (static-max: the GPU quota for the whole job;
  static-min: the fewest nodes meeting the deadline, both on their cheapest type);
- the deadline hit rate of the chosen plan under stragglers, simulated again with fresh
  seeds and many samples;
- the planning time of ``plan_job`` (planner, baselines and trace).

A tight deadline is 1.25x the p95 JCT of the fastest plan on the job's types; a loose one
is 4x. Run: ``python benchmarks/planner.py`` (a few minutes: the brute force); writes
``benchmarks/results/planner.json``.

``python benchmarks/planner.py --spot`` plans a subset of the scenarios with
``compute.spot`` on, twice: on the default catalog's spot market and on a stressed one
(every interruption rate x50). It prints the spot plan's mean cost against the on-demand
plan, the static baselines (on-demand) and the cheapest static spot pool that meets the
deadline by the planner's rule, the interruptions expected, and the deadline hit rate of
both plans simulated again with fresh seeds, interruptions included; writes
``benchmarks/results/planner_static_spot.json``.
"""

from __future__ import annotations

import itertools
import json
import math
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from elastune.planners.cost import plan_job
from elastune.planners.cost.montecarlo.simulate import PlanSimulator
from elastune.planners.cost.planning.rubberband import RubberBand
from elastune.planners.cost.price_job import job_profile
from elastune.planners.cost.pricing.billing import BillingRule
from elastune.planners.cost.pricing.catalog import Catalog, read_catalog
from elastune.planners.cost.pricing.stage_shapes import chains_of
from elastune.planners.spec import JobSpec, parse_job
from elastune.planners.staging import compile_plan

SAMPLES = 200  # what plan_job uses
FRESH_SAMPLES = 5000
BRUTE_FORCE_LIMIT = 300_000  # plans
SUBLINEAR = {2: 1.8, 4: 3.2, 8: 5.6}
LINEAR = {2: 2.0, 4: 4.0, 8: 8.0}


@dataclass(frozen=True)
class Scenario:
    name: str
    scheduler: dict[str, Any]
    types: tuple[str, ...]
    speedup: dict[int, float]
    seconds: float  # per resource unit on one GPU
    billing: str  # "second" or "hour"
    deadline: str  # "tight" or "loose"
    max_gpus: int
    segment_cv: float = 0.05


def sha(trials: int, top: int, eta: int = 3) -> dict[str, Any]:
    return {"name": "sha", "eta": eta, "min_resource": 1, "max_resource": top, "max_trials": trials}


def hyperband(top: int, eta: int = 3) -> dict[str, Any]:
    return {"name": "hyperband", "eta": eta, "min_resource": 1, "max_resource": top}


G5 = ("g5.xlarge", "g5.12xlarge")
P3 = ("p3.2xlarge", "p3.8xlarge", "p3.16xlarge")
SCENARIOS = (
    [
        Scenario("sha9-p38-sub", sha(9, 9), ("p3.8xlarge",), SUBLINEAR, 300, "second", d, 16)
        for d in ("tight", "loose")
    ]
    + [
        Scenario("sha9-g5-lin", sha(9, 9), G5, LINEAR, 300, "second", d, 16)
        for d in ("tight", "loose")
    ]
    + [
        Scenario("sha9-g5-sub-hourly", sha(9, 9), G5, SUBLINEAR, 300, "hour", d, 16)
        for d in ("tight", "loose")
    ]
    + [
        Scenario(
            "sha8-eta2-p38-sub", sha(8, 4, eta=2), ("p3.8xlarge",), SUBLINEAR, 720, "second", d, 32
        )
        for d in ("tight", "loose")
    ]
    + [
        Scenario("sha27-p3-sub", sha(27, 27), P3, SUBLINEAR, 120, "second", d, 64)
        for d in ("tight", "loose")
    ]
    + [
        Scenario("sha27-g5-lin", sha(27, 27), G5, LINEAR, 120, "second", d, 32)
        for d in ("tight", "loose")
    ]
    + [
        Scenario(
            "sha27-p38-sub-hourly", sha(27, 27), ("p3.8xlarge",), SUBLINEAR, 120, "hour", d, 64
        )
        for d in ("tight", "loose")
    ]
    + [
        Scenario("sha81-g5-sub", sha(81, 27), G5, SUBLINEAR, 60, "second", d, 128)
        for d in ("tight", "loose")
    ]
    + [
        Scenario("hb27-g5-sub", hyperband(27), G5, SUBLINEAR, 120, "second", d, 64)
        for d in ("tight", "loose")
    ]
    + [
        Scenario("hb81-p3-sub", hyperband(81), P3, SUBLINEAR, 60, "second", d, 128)
        for d in ("tight", "loose")
    ]
    + [
        Scenario("hb81-g5-lin-hourly", hyperband(81), G5, LINEAR, 60, "hour", d, 128)
        for d in ("tight", "loose")
    ]
    + [
        Scenario("sha27-g5-sub-noisy", sha(27, 27), G5, SUBLINEAR, 120, "second", d, 32, 0.15)
        for d in ("tight", "loose")
    ]
)


def catalog_for(billing: str) -> Catalog:
    catalog = read_catalog()
    if billing == "second":
        return catalog
    hourly = BillingRule(quantum_s=3600, min_charge_s=3600)
    types = {
        name: t.model_copy(update={"billing": hourly}) for name, t in catalog.instance_types.items()
    }
    return catalog.model_copy(update={"instance_types": types})


def spec_for(scenario: Scenario, deadline: float | None) -> JobSpec:
    return parse_job(
        {
            "name": scenario.name,
            "trainable": "m:f",
            "metric": "acc",
            "space": {"x": {"type": "float", "low": 0, "high": 1}},
            "scheduler": scenario.scheduler,
            "budget": {"deadline": deadline} if deadline else {},
            "compute": {"instance_types": list(scenario.types), "max_gpus": scenario.max_gpus},
            "profile": {
                "seconds_per_unit": {1: scenario.seconds},
                "speedup": scenario.speedup,
                "segment_cv": scenario.segment_cv,
            },
        }
    )


def fastest_p95(spec: JobSpec, catalog: Catalog) -> float:
    simulator = PlanSimulator(catalog, job_profile(spec), samples=SAMPLES)
    planner = RubberBand(
        simulator, list(spec.compute.instance_types), max_gpus=spec.compute.max_gpus
    )
    chains = chains_of(compile_plan(spec).stages)
    caps = planner.usable(chains)
    return min(simulator.run(planner.fastest(chains, catalog.get(name))).jct_q for name in caps)


def brute_force(spec: JobSpec, catalog: Catalog, deadline: float) -> tuple[float | None, int]:
    """The cheapest p95-feasible plan of the planner's plan space (one bracket only)."""
    simulator = PlanSimulator(catalog, job_profile(spec), samples=SAMPLES)
    planner = RubberBand(
        simulator,
        list(spec.compute.instance_types),
        deadline=deadline,
        max_gpus=spec.compute.max_gpus,
    )
    chains = chains_of(compile_plan(spec).stages)
    if len(chains) != 1:
        return None, 0
    caps = planner.usable(chains)
    options = [planner.options(stage, 0, caps) for stage in chains[0]]
    size = math.prod(len(o) for o in options)
    if size > BRUTE_FORCE_LIMIT:
        return None, size
    best = math.inf
    for chain in itertools.product(*options):  # lexicographic: shared prefixes are cached
        run = simulator.chain(tuple(chain), keep=False)
        if run.total_mean < best and float(np.quantile(run.end, simulator.quantile)) <= deadline:
            best = run.total_mean
    return best, size


def run_scenario(scenario: Scenario) -> dict[str, Any]:
    catalog = catalog_for(scenario.billing)
    fastest = fastest_p95(spec_for(scenario, None), catalog)
    deadline = math.ceil(fastest * (1.25 if scenario.deadline == "tight" else 4.0))
    spec = spec_for(scenario, deadline)

    started = time.perf_counter()
    report = plan_job(spec, catalog=catalog)
    seconds = time.perf_counter() - started

    cost = report.outcome.cost_mean
    optimum, space = brute_force(spec, catalog, deadline)
    fresh = PlanSimulator(catalog, job_profile(spec), samples=FRESH_SAMPLES, seed=20_240_601)
    again = fresh.run(report.plan)
    static_max, static_min = report.baselines
    return {
        "scenario": f"{scenario.name}-{scenario.deadline}",
        "scheduler": scenario.scheduler["name"],
        "trials": sum(a.trials for a in report.allocations if a.rung == 0),
        "stages": len(report.allocations),
        "instance_types": list(scenario.types),
        "scaling": "linear" if scenario.speedup == LINEAR else "sublinear",
        "billing": scenario.billing,
        "deadline": scenario.deadline,
        "deadline_s": deadline,
        "feasible": report.feasible,
        "plan_cost_usd": round(cost, 4),
        "plan_jct_p95_s": round(report.outcome.jct_q, 1),
        "optimum_cost_usd": None if optimum is None else round(optimum, 4),
        "plan_space": space,
        "cost_over_optimum": None if optimum is None else round(cost / optimum, 4),
        "static_max_over_plan": _ratio(static_max, cost),
        "static_min_over_plan": _ratio(static_min, cost),
        "deadline_hit_rate": round(float(np.mean(again.jct <= deadline)), 4),
        "planning_s": round(seconds, 3),
    }


def _ratio(baseline: Any, cost: float) -> float | None:
    return None if baseline.outcome is None else round(baseline.outcome.cost_mean / cost, 3)


def main() -> None:
    rows = []
    header = (
        f"{'scenario':32} {'cost $':>9} {'/opt':>6} {'space':>7} {'max/plan':>8} "
        f"{'min/plan':>8} {'hit':>6} {'plan s':>6}"
    )
    print(header)
    print("-" * len(header))
    for scenario in SCENARIOS:
        row = run_scenario(scenario)
        rows.append(row)
        opt = "n/a" if row["cost_over_optimum"] is None else f"{row['cost_over_optimum']:.3f}"
        print(
            f"{row['scenario']:32} {row['plan_cost_usd']:9.2f} {opt:>6} {row['plan_space']:7d} "
            f"{row['static_max_over_plan'] or float('nan'):8.2f} "
            f"{row['static_min_over_plan'] or float('nan'):8.2f} "
            f"{row['deadline_hit_rate']:6.1%} {row['planning_s']:6.2f}"
        )

    ratios = [r["cost_over_optimum"] for r in rows if r["cost_over_optimum"] is not None]
    tight = [r["static_max_over_plan"] for r in rows if r["deadline"] == "tight"]
    tight_hourly = [
        r["static_max_over_plan"]
        for r in rows
        if r["deadline"] == "tight" and r["billing"] == "hour"
    ]
    tight_second = [
        r["static_max_over_plan"]
        for r in rows
        if r["deadline"] == "tight" and r["billing"] == "second"
    ]
    summary = {
        "scenarios": len(rows),
        "optimum_computed": len(ratios),
        "worst_cost_over_optimum": max(ratios),
        "mean_cost_over_optimum": round(float(np.mean(ratios)), 4),
        "within_5pct_of_optimum": sum(r <= 1.05 for r in ratios),
        "mean_static_max_over_plan_tight": round(float(np.mean(tight)), 3),
        "mean_static_max_over_plan_tight_per_second": round(float(np.mean(tight_second)), 3),
        "mean_static_max_over_plan_tight_hourly": round(float(np.mean(tight_hourly)), 3),
        "mean_static_min_over_plan": round(
            float(np.mean([r["static_min_over_plan"] for r in rows if r["static_min_over_plan"]])),
            3,
        ),
        "min_deadline_hit_rate": min(r["deadline_hit_rate"] for r in rows),
        "hit_rate_at_least_95pct": sum(r["deadline_hit_rate"] >= 0.95 for r in rows),
        "max_planning_s": max(r["planning_s"] for r in rows),
        "all_feasible": all(r["feasible"] for r in rows),
    }
    targets = {
        "cost_over_optimum <= 1.05": summary["worst_cost_over_optimum"] <= 1.05,
        "static_max / plan >= 1.5 at tight deadlines (mean)": (
            summary["mean_static_max_over_plan_tight"] >= 1.5
        ),
        "deadline hit >= 95%": summary["min_deadline_hit_rate"] >= 0.95,
        "planning <= 2 s": summary["max_planning_s"] <= 2.0,
    }
    publish("planner.json", "cost planner", summary, targets, rows)


def publish(
    name: str,
    title: str,
    summary: dict[str, Any],
    targets: dict[str, bool],
    rows: list[dict[str, Any]],
    **extra: Any,
) -> None:
    """Print the summary and which targets were met; write everything to results/NAME."""
    print()
    for key, value in summary.items():
        print(f"{key:48} {value}")
    print()
    for key, met in targets.items():
        print(f"{'MET   ' if met else 'MISSED'} {key}")
    out = Path(__file__).parent / "results" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": title,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "samples": SAMPLES,
        "fresh_samples": FRESH_SAMPLES,
        "catalog_prices_read": read_catalog().prices_read,
        **extra,
        "summary": summary,
        "targets": targets,
        "scenarios": rows,
    }
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {out}")


# --- spot capacity: ``python benchmarks/planner.py --spot`` ----------------------

SPOT_SCENARIOS = (
    "sha9-g5-lin",
    "sha9-g5-sub-hourly",
    "sha27-p3-sub",
    "sha27-g5-sub-noisy",
    "sha81-g5-sub",
    "hb27-g5-sub",
    "hb81-p3-sub",
)
STRESS = 50  # the stressed market: every interruption rate times this


def spot_catalog(billing: str, stress: float) -> Catalog:
    """The default catalog (its spot discounts and rates) with rates scaled by ``stress``."""
    catalog = catalog_for(billing)
    types = {}
    for name, t in catalog.instance_types.items():
        if t.spot is not None:
            rate = {"interruptions_per_hour": t.spot.interruptions_per_hour * stress}
            t = t.model_copy(update={"spot": t.spot.model_copy(update=rate)})
        types[name] = t
    return catalog.model_copy(update={"instance_types": types})


def with_spot(spec: JobSpec, spot: bool) -> JobSpec:
    return spec.model_copy(update={"compute": spec.compute.model_copy(update={"spot": spot})})


def static_spot(
    planner: RubberBand, simulator: PlanSimulator, plan: Any, deadline: float
) -> tuple[float | None, str | None]:
    """Mean cost of the cheapest static spot pool (of the job's quota at most) that meets
    the deadline by the planner's rule for spot plans, and its type; None when none does."""
    from elastune.planners.cost.planning.baselines import static_pool

    best: tuple[float, str] | None = None
    quota = planner.max_gpus or 10**6
    for instance in planner.types:
        if instance.spot is None:
            continue
        top = quota // instance.gpus
        low, high, found = 1, top, None
        while low <= high:  # JCT falls as nodes grow: bisect the fewest that meet it
            mid = (low + high) // 2
            pool = static_pool(simulator, plan, instance.name, mid, market="spot")
            outcome = None if pool is None else simulator.run(pool)
            if outcome is not None and planner.judged(outcome.jct, True) <= deadline:
                found, high = outcome.cost_mean, mid - 1
            else:
                low = mid + 1
        if found is not None and (best is None or found < best[0]):
            best = (found, instance.name)
    return (None, None) if best is None else best


def run_spot_scenario(scenario: Scenario, market: str, stress: float) -> dict[str, Any]:
    catalog = spot_catalog(scenario.billing, stress)
    fastest = fastest_p95(spec_for(scenario, None), catalog)
    deadline = math.ceil(fastest * (1.25 if scenario.deadline == "tight" else 4.0))
    spec = spec_for(scenario, deadline)

    started = time.perf_counter()
    on_demand = plan_job(with_spot(spec, False), catalog=catalog)
    od_seconds = time.perf_counter() - started
    started = time.perf_counter()
    spot = plan_job(with_spot(spec, True), catalog=catalog)
    seconds = time.perf_counter() - started

    fresh = PlanSimulator(catalog, job_profile(spec), samples=FRESH_SAMPLES, seed=20_240_607)
    again, again_od = fresh.run(spot.plan), fresh.run(on_demand.plan)
    simulator = PlanSimulator(catalog, job_profile(spec), samples=SAMPLES)
    planner = RubberBand(
        simulator, list(scenario.types), deadline=deadline, max_gpus=scenario.max_gpus, spot=True
    )
    static_spot_cost, static_spot_type = static_spot(planner, simulator, spot.plan, deadline)
    cost, od_cost = spot.outcome.cost_mean, on_demand.outcome.cost_mean
    static_max, static_min = spot.baselines
    stages = spot.plan.stages
    return {
        "scenario": f"{scenario.name}-{scenario.deadline}-{market}",
        "market": market,
        "interruption_scale": stress,
        "billing": scenario.billing,
        "deadline": scenario.deadline,
        "deadline_s": deadline,
        "feasible": spot.feasible,
        "spot_stages": sum(s.market == "spot" for s in stages),
        "stages": len(stages),
        "expected_interruptions": round(float(spot.outcome.interruptions.mean()), 3),
        "spot_plan_cost_usd": round(cost, 4),
        "on_demand_plan_cost_usd": round(od_cost, 4),
        "spot_over_on_demand": round(cost / od_cost, 3),
        "static_max_over_spot_plan": _ratio(static_max, cost),
        "static_min_over_spot_plan": _ratio(static_min, cost),
        "static_spot_over_spot_plan": (
            None if static_spot_cost is None else round(static_spot_cost / cost, 3)
        ),
        "static_spot_type": static_spot_type,
        "spot_plan_jct_p95_s": round(spot.outcome.jct_q, 1),
        "deadline_hit_rate": round(float(np.mean(again.jct <= deadline)), 4),
        "on_demand_deadline_hit_rate": round(float(np.mean(again_od.jct <= deadline)), 4),
        "fresh_interruptions": round(float(again.interruptions.mean()), 3),
        "planning_s": round(seconds, 3),
        "on_demand_planning_s": round(od_seconds, 3),
    }


def main_spot() -> None:
    by_name = {(s.name, s.deadline): s for s in SCENARIOS}
    rows = []
    header = (
        f"{'scenario':40} {'spot':>5} {'E[int]':>6} {'spot $':>9} {'od $':>9} {'spot/od':>7} "
        f"{'max/spot':>8} {'min/spot':>8} {'sspot/sp':>8} {'hit':>6} {'od hit':>6} {'plan s':>6}"
    )
    print(header)
    print("-" * len(header))
    for market, stress in (("aws", 1.0), (f"aws-x{STRESS}", float(STRESS))):
        for name in SPOT_SCENARIOS:
            for deadline in ("tight", "loose"):
                row = run_spot_scenario(by_name[(name, deadline)], market, stress)
                rows.append(row)

                def show(value: float | None) -> str:
                    return "n/a" if value is None else f"{value:.2f}"

                print(
                    f"{row['scenario']:40} {row['spot_stages']:>2}/{row['stages']:<2} "
                    f"{row['expected_interruptions']:6.2f} {row['spot_plan_cost_usd']:9.2f} "
                    f"{row['on_demand_plan_cost_usd']:9.2f} {row['spot_over_on_demand']:7.3f} "
                    f"{show(row['static_max_over_spot_plan']):>8} "
                    f"{show(row['static_min_over_spot_plan']):>8} "
                    f"{show(row['static_spot_over_spot_plan']):>8} "
                    f"{row['deadline_hit_rate']:6.1%} {row['on_demand_deadline_hit_rate']:6.1%} "
                    f"{row['planning_s']:6.2f}"
                )

    def mean(key: str, where: Any = lambda r: True) -> float:
        values = [r[key] for r in rows if where(r) and r[key] is not None]
        return round(float(np.mean(values)), 3)

    summary = {
        "scenarios": len(rows),
        "all_feasible": all(r["feasible"] for r in rows),
        "with_spot_stages": sum(r["spot_stages"] > 0 for r in rows),
        "mean_spot_over_on_demand_aws": mean("spot_over_on_demand", lambda r: r["market"] == "aws"),
        "mean_spot_over_on_demand_stressed": mean(
            "spot_over_on_demand", lambda r: r["market"] != "aws"
        ),
        "worst_spot_over_on_demand": max(r["spot_over_on_demand"] for r in rows),
        "mean_static_max_over_spot_plan": mean("static_max_over_spot_plan"),
        "mean_static_min_over_spot_plan": mean("static_min_over_spot_plan"),
        "mean_static_spot_over_spot_plan": mean("static_spot_over_spot_plan"),
        "min_static_spot_over_spot_plan": min(
            r["static_spot_over_spot_plan"] for r in rows if r["static_spot_over_spot_plan"]
        ),
        "min_deadline_hit_rate": min(r["deadline_hit_rate"] for r in rows),
        "hit_rate_at_least_95pct": sum(r["deadline_hit_rate"] >= 0.95 for r in rows),
        "max_planning_s": max(r["planning_s"] for r in rows),
        "max_on_demand_planning_s": max(r["on_demand_planning_s"] for r in rows),
    }
    targets = {
        "spot plan never dearer than the on-demand plan": summary["worst_spot_over_on_demand"]
        <= 1.0 + 1e-9,
        "deadline hit >= 95% under interruptions (fresh seeds)": (
            summary["min_deadline_hit_rate"] >= 0.95
        ),
    }
    publish(
        "planner_static_spot.json",
        "cost planner on spot capacity",
        summary,
        targets,
        rows,
        markets={
            "aws": "default catalog: its spot discounts and interruption rates",
            f"aws-x{STRESS}": f"the same with every interruption rate times {STRESS}",
        },
    )


if __name__ == "__main__":
    main_spot() if "--spot" in sys.argv[1:] else main()
