"""Benchmark of the cost planner with Fluid packing: predicted JCT and cost when
each stage's trials are packed onto the stage's nodes at Fluid widths, against the planner's
fixed GPUs per trial.

For every scenario of ``benchmarks/planner.py`` (same jobs, profiles, catalogs and deadlines) it
plans the job twice with ``plan_job``: as today (``packing=False``) and with a simulator that packs
every stage (``packing=True``: StaticFluid widths over the stage's ``instances x GPUs per node``,
see ``elastune.planners.cost.montecarlo.simulate.PlanSimulator.packed``). It records

- the unpacked plan priced again with packing: how much sooner the same nodes finish when
  the survivors of a stage take the GPUs its node count leaves idle (``same_plan_jct_ratio``:
  packed p95 JCT over unpacked, and the same for mean cost);
- the packing-aware plan against the unpacked one: its mean cost and p95 JCT over theirs
  (the planner may now buy fewer or cheaper nodes and still meet the deadline);
- the packing-aware plan's deadline hit rate, simulated again with fresh seeds;
- the static-max pool (the GPU quota held for the whole job, each stage at the one width
  that finishes it soonest) priced with packing over without: a fixed pool is where a
  stage's survivors leave GPUs idle.

Run: ``python benchmarks/planner_packing.py``; writes
``benchmarks/results/planner_packing.json``.
"""

from __future__ import annotations

import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.planner import (
    FRESH_SAMPLES,
    SAMPLES,
    SCENARIOS,
    Scenario,
    catalog_for,
    fastest_p95,
    spec_for,
)
from elastune.planners.cost import plan_job
from elastune.planners.cost.montecarlo.simulate import PlanSimulator
from elastune.planners.cost.price_job import job_profile


def run_scenario(scenario: Scenario) -> dict[str, Any]:
    catalog = catalog_for(scenario.billing)
    fastest = fastest_p95(spec_for(scenario, None), catalog)
    deadline = math.ceil(fastest * (1.25 if scenario.deadline == "tight" else 4.0))
    spec = spec_for(scenario, deadline)
    profile = job_profile(spec)

    plain = plan_job(spec, catalog=catalog)
    started = time.perf_counter()
    packed = plan_job(spec, catalog=catalog, packing=True)
    seconds = time.perf_counter() - started
    # The unpacked plan run as the flow's stage packer runs it: same nodes, Fluid widths.
    same = PlanSimulator(catalog, profile, samples=SAMPLES, packing=True).run(plain.plan)
    fresh = PlanSimulator(catalog, profile, samples=FRESH_SAMPLES, seed=20_240_601, packing=True)
    again = fresh.run(packed.plan)
    static = plain.baselines[0]
    assert static.plan is not None and static.outcome is not None
    static_packed = PlanSimulator(catalog, profile, samples=SAMPLES, packing=True).run(static.plan)
    return {
        "scenario": f"{scenario.name}-{scenario.deadline}",
        "scheduler": scenario.scheduler["name"],
        "scaling": "linear" if max(scenario.speedup.values()) == 8 else "sublinear",
        "billing": scenario.billing,
        "deadline_s": deadline,
        "plan": {
            "feasible": plain.feasible,
            "gpus_per_trial": [list(c) for c in plain.plan.gpus_per_trial],
            "jct_p95_s": round(plain.outcome.jct_q, 1),
            "cost_usd": round(plain.outcome.cost_mean, 4),
            "packed_jct_p95_s": round(same.jct_q, 1),
            "packed_cost_usd": round(same.cost_mean, 4),
        },
        "packing_plan": {
            "feasible": packed.feasible,
            "gpus_per_trial": [list(c) for c in packed.plan.gpus_per_trial],
            "jct_p95_s": round(packed.outcome.jct_q, 1),
            "cost_usd": round(packed.outcome.cost_mean, 4),
            "deadline_hit_rate": round(float(np.mean(again.jct <= deadline)), 4),
            "planning_s": round(seconds, 3),
        },
        "static_max": {
            "instance_type": static.instance_type,
            "nodes": static.nodes,
            "jct_p95_s": round(static.outcome.jct_q, 1),
            "cost_usd": round(static.outcome.cost_mean, 4),
            "packed_jct_p95_s": round(static_packed.jct_q, 1),
            "packed_cost_usd": round(static_packed.cost_mean, 4),
        },
        "static_max_jct_ratio": round(static_packed.jct_q / static.outcome.jct_q, 4),
        "static_max_cost_ratio": round(static_packed.cost_mean / static.outcome.cost_mean, 4),
        "same_plan_jct_ratio": round(same.jct_q / plain.outcome.jct_q, 4),
        "same_plan_cost_ratio": round(same.cost_mean / plain.outcome.cost_mean, 4),
        "packing_plan_cost_ratio": round(packed.outcome.cost_mean / plain.outcome.cost_mean, 4),
        "packing_plan_jct_ratio": round(packed.outcome.jct_q / plain.outcome.jct_q, 4),
    }


def main() -> None:
    rows = []
    header = (
        f"{'scenario':<30} {'same plan JCT':>13} {'same cost':>9} "
        f"{'packing plan cost':>17} {'its JCT':>8} {'hit rate':>8} "
        f"{'static-max JCT':>14} {'its cost':>8}"
    )
    print(header)
    for scenario in SCENARIOS:
        row = run_scenario(scenario)
        rows.append(row)
        print(
            f"{row['scenario']:<30} {row['same_plan_jct_ratio']:>13.3f} "
            f"{row['same_plan_cost_ratio']:>9.3f} {row['packing_plan_cost_ratio']:>17.3f} "
            f"{row['packing_plan_jct_ratio']:>8.3f} "
            f"{row['packing_plan']['deadline_hit_rate']:>8.3f} "
            f"{row['static_max_jct_ratio']:>14.3f} {row['static_max_cost_ratio']:>8.3f}",
            flush=True,
        )

    def summary(key: str) -> dict[str, float]:
        values = [r[key] for r in rows]
        return {
            "mean": round(statistics.fmean(values), 4),
            "min": round(min(values), 4),
            "max": round(max(values), 4),
        }

    totals = {
        key: summary(key)
        for key in (
            "same_plan_jct_ratio",
            "same_plan_cost_ratio",
            "packing_plan_cost_ratio",
            "packing_plan_jct_ratio",
            "static_max_jct_ratio",
            "static_max_cost_ratio",
        )
    }
    print("\nratio (packed / as planned): mean [min, max]")
    for key, s in totals.items():
        print(f"  {key:<26} {s['mean']:.3f} [{s['min']:.3f}, {s['max']:.3f}]")
    out = Path(__file__).resolve().parent / "results" / "planner_packing.json"
    out.write_text(
        json.dumps(
            {
                "benchmark": "planner_packing",
                "python": platform.python_version(),
                "samples": SAMPLES,
                "summary": totals,
                "scenarios": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
