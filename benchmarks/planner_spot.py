"""Benchmark of spot with a deadline (docs/algorithms.md §5.9).

For each scenario (a SHA job, an instance-type set, a spot market) the deadline is
``--slack`` times the p95 JCT of the fastest on-demand plan. Every plan is run in the same
``--traces`` worlds (interruption traces, with their stragglers and startup delays: the
simulator with one sample, seeds 0, 1, ...):

- **spot with a deadline**: :func:`~elastune.planners.cost.planning.spot.plan_spot`'s on-demand
plan,
  each stage moved to spot at its barrier while the slack allows;
- **on-demand only**: RubberBand's cheapest on-demand plan meeting the deadline.

It prints the deadline hit rate of both, the spot policy's mean cost over the on-demand
plan's (goal: at most 0.6, i.e. >= 40% cheaper, with >= 99% of deadlines met), and the
planned cost against the static on-demand baselines priced by the planner's simulator:
the smallest static pool meeting the deadline at p95 (static-min; none where no pool up to
the plan's peak does) and static-max (the plan's peak GPUs for the whole job). Markets:
``aws`` is the default catalog's spot discounts and interruption rates; ``aws-x50`` the
same with every interruption rate times 50 (hourly interruptions: a stress test).
Run: ``python benchmarks/planner_spot.py`` (``--quick``: 200 traces, fewer scenarios);
writes ``benchmarks/results/planner_spot.json``. The older benchmark of static spot plans
(``benchmarks/planner.py --spot``) writes ``planner_static_spot.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

from elastune.planners.cost.montecarlo.simulate import PlanSimulator
from elastune.planners.cost.planning.baselines import static_baselines
from elastune.planners.cost.planning.rubberband import RubberBand
from elastune.planners.cost.planning.spot import SpotDeadline, plan_spot
from elastune.planners.cost.pricing.catalog import Catalog, parse_catalog, read_catalog
from elastune.planners.staging import Profile, Stage

SAMPLES = 400
JOBS = {
    "sha27": [
        Stage(0, 0, 27, 0, 1),
        Stage(0, 1, 9, 1, 3),
        Stage(0, 2, 3, 3, 9),
        Stage(0, 3, 1, 9, 27),
    ],
    "sha81": [
        Stage(0, 0, 81, 0, 1),
        Stage(0, 1, 27, 1, 3),
        Stage(0, 2, 9, 3, 9),
        Stage(0, 3, 3, 9, 27),
        Stage(0, 4, 1, 27, 81),
    ],
}
TYPES = {"g5": ["g5.xlarge", "g5.12xlarge"], "g4dn": ["g4dn.xlarge", "g4dn.12xlarge"]}
MARKETS = {"aws": 1.0, "aws-x50": 50.0}
PROFILE = Profile.from_scaling(240.0, speedup={2: 1.8, 4: 3.2}, segment_cv=0.1)


def stressed(scale: float) -> Catalog:
    """The default catalog with every spot interruption rate times ``scale``."""
    if scale == 1.0:
        return read_catalog()
    catalog = read_catalog()
    types = {}
    for name, t in catalog.instance_types.items():
        entry = t.model_dump(exclude={"name"}, exclude_none=True)
        if t.spot is not None:
            entry["spot"]["interruptions_per_hour"] = t.spot.interruptions_per_hour * scale
        types[name] = entry
    return parse_catalog({"instance_types": types})


def play_on_demand(simulator: PlanSimulator, plan: Any, traces: int) -> list[tuple[float, float]]:
    policy = SpotDeadline(simulator, plan, deadline=float("inf"))  # never switches: on-demand
    out = []
    for seed in range(traces):
        world = simulator.world(seed)
        run = world.chain(policy.chain)
        out.append((float(run.end[0]), float((run.released_cost + run.closing_cost)[0])))
    return out


def scenario(job: str, types: str, market: str, slack: float, traces: int) -> dict[str, Any]:
    catalog = stressed(MARKETS[market])
    simulator = PlanSimulator(catalog, PROFILE, samples=SAMPLES)
    names, stages = TYPES[types], JOBS[job]
    fastest = RubberBand(simulator, names, deadline=1.0).plan(stages).smallest_deadline
    assert fastest is not None
    deadline = slack * fastest
    started = time.perf_counter()
    policy = plan_spot(simulator, names, stages, deadline)
    planning_s = time.perf_counter() - started
    on_demand = RubberBand(simulator, names, deadline=deadline).plan(stages).plan
    static_max, static_min = static_baselines(
        simulator, on_demand, names, deadline=deadline, max_gpus=None
    )
    od = np.array(play_on_demand(simulator, on_demand, traces))
    row: dict[str, Any] = {
        "scenario": f"{job}-{types}-{market}",
        "deadline_s": round(deadline, 1),
        "planning_s": round(planning_s, 2),
        "on_demand": {
            "hit_rate": float(np.mean(od[:, 0] <= deadline)),
            "cost_mean_usd": round(float(od[:, 1].mean()), 4),
        },
        "static_min_cost_usd": _cost(static_min, on_time=True),
        "static_max_cost_usd": _cost(static_max, on_time=False),
        "static_max_meets_deadline": static_max.meets_deadline,
    }
    if policy is None:
        row["spot"] = None
        return row
    runs = [policy.play(simulator.world(seed)) for seed in range(traces)]
    jct = np.array([r[0] for r in runs])
    cost = np.array([r[1] for r in runs])
    on_spot = np.mean([m.count("spot") / len(m) for _, _, m in runs])
    row["spot"] = {
        "hit_rate": float(np.mean(jct <= deadline)),
        "cost_mean_usd": round(float(cost.mean()), 4),
        "stages_on_spot": round(float(on_spot), 3),
        "base_plan": [list(c) for c in policy.plan.gpus_per_trial],
    }
    spot_cost = row["spot"]["cost_mean_usd"]
    row["spot_over_on_demand"] = round(spot_cost / row["on_demand"]["cost_mean_usd"], 4)
    for name in ("static_min", "static_max"):
        base = row[f"{name}_cost_usd"]
        row[f"{name}_over_spot"] = None if base is None else round(base / spot_cost, 3)
    return row


def _mean(ratios: list[float | None]) -> float | None:
    """The mean of the ratios that exist (a static pool may meet no deadline)."""
    known = [r for r in ratios if r is not None]
    return round(float(np.mean(known)), 3) if known else None


def _cost(baseline: Any, on_time: bool) -> float | None:
    """A static pool's mean cost; None when there is none, or when ``on_time`` asks for one
    that meets the deadline and it does not."""
    if baseline.outcome is None or (on_time and not baseline.meets_deadline):
        return None
    return round(baseline.outcome.cost_mean, 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=1000, help="interruption traces")
    parser.add_argument("--slack", type=float, default=1.5, help="deadline / fastest p95")
    parser.add_argument("--quick", action="store_true", help="200 traces, sha27 only")
    args = parser.parse_args()
    traces = 200 if args.quick else args.traces
    jobs = ["sha27"] if args.quick else list(JOBS)
    rows = []
    for job in jobs:
        for types in TYPES:
            for market in MARKETS:
                row = scenario(job, types, market, args.slack, traces)
                rows.append(row)
                spot = row["spot"] or {}
                print(
                    f"{row['scenario']:24} hit spot {spot.get('hit_rate', 0):6.1%} on-demand "
                    f"{row['on_demand']['hit_rate']:6.1%}; spot / on-demand "
                    f"{row.get('spot_over_on_demand')}; static-min / spot "
                    f"{row.get('static_min_over_spot')}; static-max / spot "
                    f"{row.get('static_max_over_spot')}",
                    flush=True,
                )
    planned = [r for r in rows if r["spot"] is not None]
    summary = {
        "scenarios": len(rows),
        "traces_per_scenario": traces,
        "deadline_slack": args.slack,
        "planned": len(planned),
        "min_hit_rate_spot": min(r["spot"]["hit_rate"] for r in planned),
        "mean_spot_over_on_demand": round(
            float(np.mean([r["spot_over_on_demand"] for r in planned])), 4
        ),
        "max_spot_over_on_demand": max(r["spot_over_on_demand"] for r in planned),
        **{
            f"mean_{name}_over_spot": _mean([r[f"{name}_over_spot"] for r in planned])
            for name in ("static_min", "static_max")
        },
        "static_min_meeting_the_deadline": sum(
            r["static_min_over_spot"] is not None for r in planned
        ),
    }
    targets = {
        "every scenario planned": len(planned) == len(rows),
        ">= 99% of deadlines met on spot": summary["min_hit_rate_spot"] >= 0.99,
        ">= 40% cheaper than on-demand only (mean)": summary["mean_spot_over_on_demand"] <= 0.6,
    }
    print()
    for key, value in summary.items():
        print(f"{key:40} {value}")
    for key, met in targets.items():
        print(f"{'MET   ' if met else 'MISSED'} {key}")
    out = Path(__file__).parent / "results" / "planner_spot.json"
    payload = {
        "benchmark": "spot with a deadline",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "samples": SAMPLES,
        "markets": {"aws": "default catalog", "aws-x50": "every interruption rate x50"},
        "summary": summary,
        "targets": targets,
        "scenarios": rows,
    }
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
