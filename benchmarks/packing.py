"""Makespan / area lower bound of the Fluid packers over a suite of TrialGroups.

Groups:
* synthetic: random heights (log-normal or uniform), 1..64 trials, pools of 8, 16 and 32
  GPUs on 4- or 8-GPU nodes;
* LCBench: every stage (rung) of a synchronous SHA bracket of 81 configurations and of the
  four Hyperband brackets (r = 1, R = 52 epochs, eta = 3) on each of the 34 tasks. A stage's
  group is the survivors of the previous rung, ranked by the surrogate's validation
  accuracy; each trial's seconds per epoch are its own (``time_raw`` differences).

Policies: FIFO (one GPU per trial in submission order, the baseline), StaticFluid and
DynamicFluid. All three are divided by the same lower bound
``max(sum_i min_w w*h_i(w) / M, max_i min_w h_i(w))`` of the elastic widths.

LCBench only gives single-device times, so the scaling profile is modelled:
``S = {2: 1.8, 4: 3.2, 8: 5.6}`` (docs/algorithms.md §4.5), a 3 s rescale cost, and, in the
``+sharing`` suites, two trials per GPU at ``sigma(2) = 0.85`` each. With sharing the bound
is loose (tests/test_packing.py shows a group no schedule brings within 2x), so the 2x
target applies to the suites without it.

The other packing figure, the speed-up of synchronous SHA/Hyperband with packing in the
LCBench simulator, is ``benchmarks/fluid_speedup.py``.

Run: ``python benchmarks/packing.py`` (about a minute); writes benchmarks/results/packing.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from scipy.optimize import linprog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from elastune.planners.search.schedulers.base import ranked
from elastune.planners.sim.lcbench import LCBenchTable, tasks
from elastune.planners.spec.geometry import Bracket, hyperband_brackets, sha_bracket
from elastune.planners.staging import DynamicFluid, Packer, Profile, StaticFluid, Work
from elastune.planners.staging.fluid import fifo_makespan

RESULTS = Path(__file__).resolve().parent / "results" / "packing.json"
SPEEDUP = {2: 1.8, 4: 3.2, 8: 5.6}
RESCALE_SECONDS = 3.0
SHARING = {2: 0.85}
POLICIES = ("fifo", "static", "dynamic")


def profile(sharing: bool) -> Profile:
    return Profile.from_speeds(SPEEDUP, SHARING if sharing else {}, overhead_s=RESCALE_SECONDS)


def packers(gpus: int, per_node: int, sharing: bool) -> dict[str, Packer]:
    share = 2 if sharing else 1
    return {
        kind.__name__: kind(profile(sharing), gpus=gpus, gpus_per_node=per_node, max_share=share)
        for kind in (StaticFluid, DynamicFluid)
    }


def fluid_bound(packer: Packer, group: list[Work]) -> float:
    """A tighter bound than §6.2's, for any schedule (widths may change over time): the
    least ``T`` such that each trial can split at most ``T`` seconds over the widths to do
    its work while the widths' GPU-seconds fit in ``M * T`` (a linear program).

    §6.2's bound takes its area term at the most efficient width and its height term at
    the fastest; this one makes each trial pay for the speed it needs."""
    widths = [float(w) for w in packer.widths]
    speeds = np.array([packer.profile.speed(w) for w in packer.widths])
    n, k = len(group), len(widths)
    cost = np.zeros(n * k + 1)
    cost[-1] = 1.0  # minimise T; variables: seconds of trial i at width j, then T
    work = np.zeros((n, n * k + 1))
    span = np.zeros((n + 1, n * k + 1))
    for i, x in enumerate(group):
        work[i, i * k : (i + 1) * k] = speeds / x.seconds
        span[i, i * k : (i + 1) * k] = 1.0  # trial i runs at most T
        span[i, -1] = -1.0
        span[n, i * k : (i + 1) * k] = widths  # GPU-seconds fit in M * T
    span[n, -1] = -packer.gpus
    solved = linprog(cost, A_ub=span, b_ub=np.zeros(n + 1), A_eq=work, b_eq=np.ones(n))
    assert solved.success, solved.message
    return float(solved.x[-1])


def measure(group: list[Work], gpus: int, per_node: int, sharing: bool) -> dict[str, float]:
    static, dynamic = packers(gpus, per_node, sharing).values()
    bound = static.lower_bound(group)
    static_makespan, dynamic_makespan = static.pack(group).makespan, dynamic.pack(group).makespan
    return {
        "trials": len(group),
        "gpus": gpus,
        "lower_bound": bound,
        "fifo": fifo_makespan(group, gpus) / bound,
        "static": static_makespan / bound,
        "dynamic": dynamic_makespan / bound,
        # The same makespan over the tighter bound: how much of the ratio is the bound's.
        "dynamic_over_lp": dynamic_makespan / max(bound, fluid_bound(static, group)),
    }


def synthetic_groups(seed: int, count: int) -> list[tuple[list[Work], int, int]]:
    rng = np.random.default_rng(seed)
    pools = [(8, 4), (16, 8), (32, 8)]
    groups = []
    for _ in range(count):
        gpus, per_node = pools[rng.integers(len(pools))]
        n = int(rng.integers(1, 65))
        if rng.random() < 0.5:
            heights = rng.lognormal(0.0, rng.choice([0.25, 1.0]), n)
        else:
            heights = rng.uniform(0.1, 1.0, n)
        groups.append(([Work(t, float(h), 60.0) for t, h in enumerate(heights)], gpus, per_node))
    return groups


def lcbench_groups(seed: int, gpus: int, per_node: int) -> list[tuple[str, list[Work]]]:
    """Every stage of SHA(81) and of the Hyperband brackets, on every LCBench task."""
    rng = np.random.default_rng(seed)
    brackets: list[tuple[str, Bracket]] = [("sha81", sha_bracket(81, 1, 52, 3))]
    brackets += [(f"hb-s{b.s}", b) for b in hyperband_brackets(1, 52, 3)]
    groups = []
    for task in tasks():
        # Cumulative seconds per epoch (made monotone) and validation accuracy, [config, epoch].
        table = LCBenchTable(task)
        curve, accuracy = table.seconds, table.values
        configs = iter(rng.permutation(len(table.table)))
        for name, bracket in brackets:
            alive = [int(next(configs)) for _ in range(bracket.trials)]
            start = 0
            for rung in bracket.rungs:
                stop = int(rung.resource)
                before = curve[alive, start - 1] if start else np.zeros(len(alive))
                per_epoch = (curve[alive, stop - 1] - before) / (stop - start)
                group = [
                    Work(c, stop - start, max(1e-3, float(t)))
                    for c, t in zip(alive, per_epoch, strict=True)
                ]
                groups.append((f"{name}-r{stop}", group))
                # The next rung keeps the best by the surrogate's validation accuracy.
                losses = {c: -float(accuracy[c, stop - 1]) for c in alive}
                keep = next((r.trials for r in bracket.rungs if r.resource > stop), 0)
                alive, start = ranked(losses)[:keep], stop
    return groups


def summarise(rows: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    summary = {}
    for policy in POLICIES:
        ratios = sorted(r[policy] for r in rows)
        summary[policy] = {
            "mean": statistics.fmean(ratios),
            "p95": ratios[int(0.95 * (len(ratios) - 1))],
            "max": ratios[-1],
            "above_2": sum(x > 2 + 1e-9 for x in ratios),
        }
    fifo_over = [r["fifo"] / r["dynamic"] for r in rows]
    summary["dynamic_speedup_over_fifo"] = {"mean": statistics.fmean(fifo_over)}
    over_lp = sorted(r["dynamic_over_lp"] for r in rows)
    summary["dynamic_over_lp_bound"] = {"mean": statistics.fmean(over_lp), "max": over_lp[-1]}
    return summary


def _rounded(value: object) -> object:
    return round(value, 4) if isinstance(value, float) else value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--synthetic", type=int, default=300, help="synthetic groups per suite")
    args = parser.parse_args()
    started = time.perf_counter()

    suites: dict[str, list[dict[str, float]]] = {}
    for sharing in (False, True):
        tag = "+sharing" if sharing else ""
        suites[f"synthetic{tag}"] = [
            measure(group, gpus, per_node, sharing)
            for group, gpus, per_node in synthetic_groups(args.seed, args.synthetic)
        ]
        for gpus, per_node in ((8, 4), (32, 8)):
            rows = []
            for stage, group in lcbench_groups(args.seed, gpus, per_node):
                rows.append({"stage": stage} | measure(group, gpus, per_node, sharing))
            suites[f"lcbench-{gpus}gpu{tag}"] = rows

    summaries = {name: summarise(rows) for name, rows in suites.items()}
    print(f"makespan / lower bound (mean, p95, max; groups above 2x); profile S = {SPEEDUP}")
    print(f"{'suite':24} {'groups':>6}  " + "  ".join(f"{p:>26}" for p in POLICIES))
    for name, summary in summaries.items():
        cells = [
            f"{s['mean']:5.3f} {s['p95']:5.3f} {s['max']:5.3f} ({s['above_2']:3d})"
            for s in (summary[p] for p in POLICIES)
        ]
        print(f"{name:24} {len(suites[name]):6d}  " + "  ".join(f"{c:>26}" for c in cells))
    print("\nDynamicFluid: speed-up over FIFO (mean of FIFO/dynamic makespan), and its makespan")
    print("over the tighter LP bound (mean, max):")
    for name, summary in summaries.items():
        lp = summary["dynamic_over_lp_bound"]
        print(
            f"  {name:24} {summary['dynamic_speedup_over_fifo']['mean']:.2f}x"
            f"   {lp['mean']:.3f} {lp['max']:.3f}"
        )

    plain = [s for n, s in summaries.items() if "sharing" not in n]
    verdict = {
        policy: {
            "mean_at_most_1_25": all(s[policy]["mean"] <= 1.25 for s in plain),
            "never_above_2": all(s[policy]["above_2"] == 0 for s in plain),
        }
        for policy in ("static", "dynamic")
    }
    print(f"\ntargets on the suites without sharing (mean <= 1.25, max <= 2): {verdict}")

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "packing",
                "profile": {
                    "speedup": SPEEDUP,
                    "rescale_seconds": RESCALE_SECONDS,
                    "sharing_in_sharing_suites": SHARING,
                },
                "seed": args.seed,
                "summary": summaries,
                "targets_without_sharing": verdict,
                # One row per group: its columns, then its values (rounded; ratios to 4 places).
                "groups": {
                    name: {
                        "columns": list(rows[0]),
                        "rows": [[_rounded(v) for v in row.values()] for row in rows],
                    }
                    for name, rows in suites.items()
                },
                "seconds": time.perf_counter() - started,
            },
            separators=(",", ":"),
        )
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
