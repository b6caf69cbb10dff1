"""Schedulers side by side on LCBench in simulated time.

Protocol: the first 10 tasks of the LCBench table (YAHPO Gym surrogate, 1000 configurations
x 52 epochs), 32 virtual workers, 5 seeds. Configurations are drawn from the table without
replacement, one permutation per seed, shared by every method (common random numbers);
an epoch costs the difference of the monotone cumulative time; every trained epoch counts
as an observation of the anytime curve.

Per task: target = 99% of the best val_accuracy of the 1000 at epoch 52 ("within 1%");
oracle = that configuration's own 52-epoch time; budget for the regret = 3 x the task's
median 52-epoch time; each run stops at the horizon, 10 x that median.

Methods: random search (full 52 epochs); synchronous SHA (one bracket of 27, rungs at
2/6/17/52 epochs) and synchronous Hyperband (its 4 brackets), both repeated so that idle
workers start the next bracket; promotion-type ASHA with 1 bracket and with all 4
(asynchronous Hyperband); the median stopping rule (checked every epoch after a grace
period of 2); and Optuna's own SuccessiveHalvingPruner / HyperbandPruner (min_resource=2,
reduction_factor=3), stopping-type, through the same simulator.

    python benchmarks/schedulers.py            # the table, JSON and plot (a few minutes)
    python benchmarks/schedulers.py --scale    # 100,000 ASHA trials on 500 workers

Results go to ``benchmarks/results/schedulers.json`` / ``.png`` (``schedulers_scale.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import optuna

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.baselines import PrunerScheduler, Repeat  # noqa: E402
from elastune.planners.search import Scheduler  # noqa: E402
from elastune.planners.search.schedulers import Hyperband, SuccessiveHalving  # noqa: E402
from elastune.planners.sim import LCBenchTable, SimulatedRun, simulate  # noqa: E402
from elastune.planners.sim.lcbench import tasks  # noqa: E402
from elastune.planners.spec import JobSpec, load_job  # noqa: E402
from elastune.planners.spec.geometry import hyperband_brackets, sha_bracket  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
JOB = ROOT / "examples" / "lcbench.yaml"
WORKERS, SEEDS, TASKS = 32, 5, 10
ETA, MIN_R, MAX_R = 3, 1, 52
TABLE_SIZE = 1000
BUDGET, HORIZON = 3.0, 10.0  # in units of the task's median 52-epoch time
PRUNER_STEPS = [2, 6, 18, 52]  # every rung of both Optuna pruners at min_resource=2, rf=3

# name -> (job-file overrides, or a factory of the scheduler for a seed)
Method = list[str] | Callable[[int], Scheduler]


def _sha(seed: int) -> Scheduler:
    bracket = sha_bracket(ETA**3, MIN_R, MAX_R, ETA)
    return Repeat(lambda: SuccessiveHalving(bracket), bracket.trials, TABLE_SIZE)


def _hyperband(seed: int) -> Scheduler:
    per_copy = sum(b.trials for b in hyperband_brackets(MIN_R, MAX_R, ETA))
    return Repeat(lambda: Hyperband(MIN_R, MAX_R, ETA), per_copy, TABLE_SIZE)


def _optuna_sha(seed: int) -> Scheduler:
    pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=2, reduction_factor=ETA)
    return PrunerScheduler(pruner, MAX_R, steps=PRUNER_STEPS, max_trials=TABLE_SIZE)


def _optuna_hyperband(seed: int) -> Scheduler:
    pruner = optuna.pruners.HyperbandPruner(
        min_resource=2, max_resource=MAX_R, reduction_factor=ETA
    )
    return PrunerScheduler(
        pruner, MAX_R, steps=PRUNER_STEPS, max_trials=TABLE_SIZE, study_name=f"hb-{seed}"
    )


ASHA = "scheduler={name: asha, eta: 3, min_resource: 1, max_resource: 52, max_trials: null}"
METHODS: dict[str, Method] = {
    "random (full 52 epochs)": ["scheduler={name: random, max_resource: 52, max_trials: null}"],
    "SHA, synchronous": _sha,
    "Hyperband, synchronous": _hyperband,
    "ASHA, 1 bracket": [ASHA],
    "ASHA, 4 brackets": [ASHA, "scheduler.brackets=4"],
    "median stopping": [
        "scheduler={name: median, min_resource: 1, max_resource: 52, grace_period: 2, "
        "max_trials: null}"
    ],
    "Optuna SuccessiveHalvingPruner": _optuna_sha,
    "Optuna HyperbandPruner": _optuna_hyperband,
}


def task_facts(table: LCBenchTable) -> dict[str, float]:
    final = table.values[:, -1]
    best = int(np.argmax(final))
    median_time = float(np.median(table.seconds[:, -1]))
    return {
        "best": float(final[best]),
        "target": 0.99 * float(final[best]),
        "oracle_seconds": float(table.seconds[best, -1]),
        "median_full_seconds": median_time,
        "budget_seconds": BUDGET * median_time,
        "horizon_seconds": HORIZON * median_time,
    }


def run_one(task: str, method: str, seed: int) -> dict[str, Any]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    table = LCBenchTable(task)
    facts = task_facts(table)
    recipe = METHODS[method]
    spec: JobSpec = load_job(JOB, recipe if isinstance(recipe, list) else [ASHA])
    scheduler = None if isinstance(recipe, list) else recipe(seed)
    run: SimulatedRun = simulate(
        spec, table, WORKERS, seed, deadline=facts["horizon_seconds"], scheduler=scheduler
    )
    reached = run.time_to(facts["target"])
    trained = run.time_to(facts["target"], trained=True)
    grid = np.linspace(0, HORIZON, 101) * facts["median_full_seconds"]
    return {
        "task": task,
        "method": method,
        "seed": seed,
        "time_to_target": reached,
        "ratio_to_oracle": None if reached is None else reached / facts["oracle_seconds"],
        "time_to_target_trained": trained,
        "ratio_to_oracle_trained": None if trained is None else trained / facts["oracle_seconds"],
        "best_at_budget": run.best_at(facts["budget_seconds"]),
        "final_best": run.final_best,
        "trials_started": run.trials_started,
        "segments_run": run.segments_run,
        "gpu_seconds": run.gpu_seconds,
        "curve": [run.best_at(t) for t in grid],  # best so far on a grid, for the plot
        "wall_seconds": run.wall_seconds,
    }


def _median(values: list[float]) -> float:
    """Median where None (never reached) counts as +inf."""
    return statistics.median(math.inf if v is None else v for v in values)


def summarise(runs: list[dict[str, Any]], facts: dict[str, dict[str, float]]) -> dict:
    summary: dict[str, Any] = {}
    for method in METHODS:
        mine = [r for r in runs if r["method"] == method]
        regrets = [facts[r["task"]]["best"] - (r["best_at_budget"] or 0.0) for r in mine]
        summary[method] = {
            "reached": sum(r["time_to_target"] is not None for r in mine),
            "runs": len(mine),
            "median_ratio_to_oracle": _median([r["ratio_to_oracle"] for r in mine]),
            "reached_trained": sum(r["time_to_target_trained"] is not None for r in mine),
            "median_ratio_to_oracle_trained": _median([r["ratio_to_oracle_trained"] for r in mine]),
            "median_regret_at_budget": statistics.median(regrets),
            "median_time_to_target_per_task": {
                task: _median([r["time_to_target"] for r in mine if r["task"] == task])
                for task in facts
            },
        }
    return summary


def compare_asha(runs: list[dict[str, Any]], chosen: list[str]) -> dict[str, Any]:
    """Tasks where ASHA's median time to the target (over seeds) is no later than both
    synchronous SHA's and Hyperband's, by either way of counting the target."""

    def per_task(method: str, key: str) -> dict[str, float]:
        return {
            task: _median([r[key] for r in runs if r["method"] == method and r["task"] == task])
            for task in chosen
        }

    out: dict[str, Any] = {}
    for key, label in (("time_to_target", "any epoch"), ("time_to_target_trained", "trained")):
        sha = per_task("SHA, synchronous", key)
        hb = per_task("Hyperband, synchronous", key)
        for asha in ("ASHA, 1 bracket", "ASHA, 4 brackets"):
            mine = per_task(asha, key)
            no_later = [t for t in chosen if mine[t] <= sha[t] and mine[t] <= hb[t]]
            out[f"{asha} ({label})"] = {
                "tasks_no_later_than_sha_and_hyperband": len(no_later),
                "of_which_none_reached": sum(math.isinf(mine[t]) for t in no_later),
                "tasks": len(chosen),
            }
    return out


def _fmt(value: float) -> str:
    return "never" if math.isinf(value) else f"{value:.2f}"


def print_table(summary: dict[str, Any], comparison: dict[str, Any]) -> None:
    print(
        "\nmedians over 10 tasks x 5 seeds; time/oracle = time to the target / the best "
        "configuration's own 52-epoch time ('never': the median run did not reach it)"
    )
    print(
        f"{'':<32} {'any trained epoch':^22} {'trial trained to 52':^22}\n"
        f"{'method':<32} {'reached':>9} {'time/oracle':>12} {'reached':>9} {'time/oracle':>12}"
        f" {'regret@3x':>10}"
    )
    for method, row in summary.items():
        print(
            f"{method:<32} {row['reached']:>5}/{row['runs']:<3} "
            f"{_fmt(row['median_ratio_to_oracle']):>12} "
            f"{row['reached_trained']:>5}/{row['runs']:<3} "
            f"{_fmt(row['median_ratio_to_oracle_trained']):>12} "
            f"{row['median_regret_at_budget']:>10.2f}"
        )
    print("regret@3x: table best minus best val_accuracy seen by 3 x the median 52-epoch time")
    for asha, row in comparison.items():
        print(
            f"{asha}: no later than both synchronous SHA and Hyperband on "
            f"{row['tasks_no_later_than_sha_and_hyperband']}/{row['tasks']} tasks "
            f"({row['of_which_none_reached']} of them ties where no median run reached it)"
        )


def plot(runs: list[dict[str, Any]], facts: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(facts)
    fig, axes = plt.subplots(2, 5, figsize=(22, 8), sharex=True)
    grid = np.linspace(0, HORIZON, 101)
    for ax, task in zip(axes.flat, names, strict=True):
        for method in METHODS:
            curves = [r["curve"] for r in runs if r["task"] == task and r["method"] == method]
            values = np.array(
                [[np.nan if v is None else v for v in c] for c in curves], dtype=float
            )
            with warnings.catch_warnings():  # before a run's first epoch there is no best yet
                warnings.simplefilter("ignore", RuntimeWarning)
                median = np.nanmedian(values, axis=0)
            ax.plot(grid, 100 * median / facts[task]["best"], label=method)
        ax.axhline(99, color="grey", lw=0.8, ls="--")
        ax.axvline(BUDGET, color="grey", lw=0.8, ls=":")
        ax.set_ylim(90, 100.5)
        ax.set_title(f"lcbench {task}")
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("simulated time / median 52-epoch time")
    for ax in axes[:, 0]:
        ax.set_ylabel("best val_accuracy, % of table best")
    axes.flat[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Anytime curves, median of {SEEDS} seeds, {WORKERS} workers")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main_table(processes: int) -> None:
    chosen = list(tasks())[:TASKS]
    facts = {task: task_facts(LCBenchTable(task)) for task in chosen}
    jobs = [(t, m, s) for t in chosen for m in METHODS for s in range(SEEDS)]
    started = time.perf_counter()
    with ProcessPoolExecutor(processes) as pool:
        runs = list(pool.map(run_one, *zip(*jobs, strict=True), chunksize=4))
    wall = time.perf_counter() - started
    summary = summarise(runs, facts)
    comparison = compare_asha(runs, chosen)
    print_table(summary, comparison)
    print(f"\n{len(runs)} simulated runs in {wall:.0f} s wall clock ({processes} processes)")
    RESULTS.mkdir(exist_ok=True)
    plot(runs, facts, RESULTS / "schedulers.png")
    for run in runs:
        del run["curve"]
    payload = {
        "protocol": {
            "tasks": chosen,
            "workers": WORKERS,
            "seeds": SEEDS,
            "eta": ETA,
            "resources": [MIN_R, MAX_R],
            "target": "0.99 x best val_accuracy of the 1000 table configs at epoch 52",
            "budget": f"{BUDGET} x median 52-epoch time",
            "horizon": f"{HORIZON} x median 52-epoch time",
        },
        "tasks": facts,
        "summary": summary,
        "asha_vs_synchronous": comparison,
        "runs": runs,
        "wall_seconds": wall,
    }
    text = json.dumps(payload, indent=1, default=lambda v: None)
    (RESULTS / "schedulers.json").write_text(text.replace("Infinity", "null"))
    print(f"wrote {RESULTS / 'schedulers.json'} and schedulers.png")


def main_scale(trials: int, workers: int) -> None:
    """ASHA at the paper's scale, through the fast path and through an in-memory Optuna
    study (table rows drawn with replacement: 100,000 trials, 1000 rows)."""
    spec = load_job(JOB, [ASHA, f"scheduler.max_trials={trials}"])
    table = LCBenchTable(tasks()[0])
    out: dict[str, Any] = {"trials": trials, "workers": workers}
    for path, fast in (("fast path", True), ("in-memory Optuna study", False)):
        run = simulate(spec, table, workers, seed=0, fast=fast, replace=True)
        rate = run.results / run.wall_seconds
        print(
            f"ASHA, {run.trials_started:,} trials on {workers} workers, {path}: "
            f"{run.results:,} segment results in {run.wall_seconds:.1f} s wall clock = "
            f"{rate:,.0f} events/s (simulated {run.simulated_seconds:,.0f} s, "
            f"best {run.final_best:.2f})"
        )
        out[path] = {
            "trials_started": run.trials_started,
            "results": run.results,
            "segments_run": run.segments_run,
            "wall_seconds": run.wall_seconds,
            "events_per_second": rate,
            "simulated_seconds": run.simulated_seconds,
            "under_60_s": run.wall_seconds < 60,
        }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "schedulers_scale.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", action="store_true", help="the 100,000-trial check only")
    parser.add_argument("--trials", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=500)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()
    if args.scale:
        main_scale(args.trials, args.workers)
    else:
        main_table(args.processes)
