"""Speed-up of synchronous SHA and Hyperband with Fluid packing and elastic widths.

Protocol: the first 10 LCBench tasks in table mode (``lcbench-table:TASK``: the 1000-config
table, configurations drawn without replacement, one permutation per seed), 3 seeds, a
pool of 32 GPUs on nodes of 8. Each epoch costs the difference of the monotone cumulative
``time_raw``. Schedulers: synchronous SHA (one bracket of 81 configurations, eta = 3,
epochs 1..52) and synchronous Hyperband (its 4 brackets as independent chains), each run
once to its end.

* without packing: one GPU per segment, 32 at once (the simulator's default);
* with packing: every stage (bracket, rung) is a TrialGroup for a Fluid packer on the 32
  GPUs, StaticFluid or DynamicFluid (docs/algorithms.md §6), with elastic widths 1, 2, 4, 8.

LCBench times are single-device, so scaling is modelled as in ``benchmarks/packing.py``:
``S = {2: 1.8, 4: 3.2, 8: 5.6}`` and a rescale cost (checkpoint + restart) of 3 s. Checks
of what the figure rests on: a 30 s rescale cost; weaker scaling (Amdahl's law with a 25%
serial part: ``S = {2: 1.6, 4: 2.29, 8: 2.91}``); and the packer held to width 1, which
isolates what its ordering alone (tallest first) gains over the simulator's FIFO. No GPU
sharing.

Speed-up = JCT without / JCT with packing (JCT: simulated seconds until the last segment
ends), per run, then the mean over seeds per task; the summary gives the mean, min and max
over tasks. GPU time (width x wall time) is reported too: elastic widths finish sooner but
spend more GPU-seconds, since ``S(w) < w``. Packing changes no scheduling decision, so every
pair of runs must find the same best configuration (checked).

Run: ``python benchmarks/fluid_speedup.py [--tasks 34] [--seeds 3]`` (about a minute);
writes ``benchmarks/results/fluid_speedup.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import optuna

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from elastune.planners.sim import LCBenchTable, Packing, simulate  # noqa: E402
from elastune.planners.sim.lcbench import tasks  # noqa: E402
from elastune.planners.spec import load_job  # noqa: E402
from elastune.planners.staging import Profile  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "fluid_speedup.json"
JOB = ROOT / "examples" / "lcbench.yaml"
GPUS, PER_NODE = 32, 8
SPEEDUP = {2: 1.8, 4: 3.2, 8: 5.6}
SCHEDULERS = {
    "SHA": "scheduler={name: sha, eta: 3, min_resource: 1, max_resource: 52, max_trials: 81}",
    "Hyperband": "scheduler={name: hyperband, eta: 3, min_resource: 1, max_resource: 52}",
}
AMDAHL_25 = {w: round(1 / (0.25 + 0.75 / w), 2) for w in (2, 4, 8)}  # 1.6, 2.29, 2.91
VARIANTS = {  # name -> (policy, speed-up per width, rescale seconds)
    "width 1 only": ("static", {}, 0.0),
    "static": ("static", SPEEDUP, 3.0),
    "dynamic": ("dynamic", SPEEDUP, 3.0),
    "dynamic, 30 s rescale": ("dynamic", SPEEDUP, 30.0),
    "dynamic, Amdahl 25%": ("dynamic", AMDAHL_25, 3.0),
}


def packing(policy: str, speedup: dict[int, float], rescale: float) -> Packing:
    profile = Profile.from_speeds(speedup, overhead_s=rescale)
    return Packing(policy, profile, gpus_per_node=PER_NODE)


def measure(task: str, scheduler: str, seeds: int) -> dict[str, Any]:
    """Per variant: mean speed-up and GPU-time ratio over seeds; the baseline's mean JCT."""
    spec = load_job(JOB, [SCHEDULERS[scheduler]])
    table = LCBenchTable(task, metric=spec.metric)
    base_jct, ratios = [], {v: {"speedup": [], "gpu_time": []} for v in VARIANTS}
    for seed in range(seeds):
        alone = simulate(spec, table, GPUS, seed, fast=True)
        base_jct.append(alone.simulated_seconds)
        for name, variant in VARIANTS.items():
            packed = simulate(spec, table, GPUS, seed, fast=True, packing=packing(*variant))
            if packed.best_trial != alone.best_trial:
                raise AssertionError(f"{task} {scheduler} {name} seed {seed}: another best")
            ratios[name]["speedup"].append(alone.simulated_seconds / packed.simulated_seconds)
            ratios[name]["gpu_time"].append(packed.gpu_seconds / alone.gpu_seconds)
    return {
        "baseline_jct_s": statistics.fmean(base_jct),
        **{
            name: {k: statistics.fmean(v) for k, v in values.items()}
            for name, values in ratios.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=10, help="first N LCBench tasks")
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    started = time.perf_counter()
    chosen = tasks()[: args.tasks]
    rows = {s: {t: measure(t, s, args.seeds) for t in chosen} for s in SCHEDULERS}

    summary: dict[str, dict[str, dict[str, float]]] = {}
    print(
        f"speed-up = JCT without / with packing, {GPUS} GPUs on nodes of {PER_NODE}, S = "
        f"{SPEEDUP}; mean of {args.seeds} seeds per task (GPU-time ratio in brackets)"
    )
    for scheduler, by_task in rows.items():
        print(
            f"\n{scheduler:10} {'task':>6} {'JCT alone s':>12}  "
            + "  ".join(f"{v:>22}" for v in VARIANTS)
        )
        for task, row in by_task.items():
            cells = [f"{row[v]['speedup']:6.2f}x ({row[v]['gpu_time']:4.2f})" for v in VARIANTS]
            print(
                f"{'':10} {task:>6} {row['baseline_jct_s']:12.1f}  "
                + "  ".join(f"{c:>22}" for c in cells)
            )
        summary[scheduler] = {}
        for v in VARIANTS:
            speedups = [row[v]["speedup"] for row in by_task.values()]
            summary[scheduler][v] = {
                "mean_speedup": statistics.fmean(speedups),
                "geomean_speedup": statistics.geometric_mean(speedups),
                "min_speedup": min(speedups),
                "max_speedup": max(speedups),
                "mean_gpu_time_ratio": statistics.fmean(
                    row[v]["gpu_time"] for row in by_task.values()
                ),
            }
        cells = [
            f"{s['mean_speedup']:.2f}x ({s['min_speedup']:.2f}-{s['max_speedup']:.2f})"
            for s in summary[scheduler].values()
        ]
        print(f"{'':10} {'mean':>6} {'(min-max)':>12}  " + "  ".join(f"{c:>22}" for c in cells))

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "fluid_speedup",
                "gpus": GPUS,
                "gpus_per_node": PER_NODE,
                "speedup_profile": SPEEDUP,
                "variants": {
                    k: {"policy": p, "speedup": sp, "rescale_seconds": r}
                    for k, (p, sp, r) in VARIANTS.items()
                },
                "seeds": args.seeds,
                "tasks": list(chosen),
                "schedulers": SCHEDULERS,
                "summary": summary,
                "per_task": rows,
                "seconds": time.perf_counter() - started,
            },
            indent=1,
        )
    )
    print(f"\nwrote {RESULTS.relative_to(ROOT)} in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
