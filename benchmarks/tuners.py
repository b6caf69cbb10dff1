"""elastune's default tuner against the multi-fidelity state of the art, each peer through
its own library, on LCBench's surrogate in simulated time.

Protocol. Every method proposes configurations from the whole LCBench space
(``examples/lcbench.yaml``) and YAHPO's surrogate gives each its learning curve (52 epochs)
and its epochs' cost; elastune's simulator (``elastune.planners.sim``) runs ``--workers``
virtual workers asynchronously and stops every run at the same simulated deadline:
``--horizon`` (10) times the task's median 52-epoch training time (the median over the
1000 configurations of LCBench's table). The peers (``benchmarks/peers/``) are driven by
their own ask/tell interfaces: DEHB and SMAC3 evaluate each fidelity from scratch, so a
configuration they promote is trained again from epoch 0 and pays for it; Optuna's and Syne
Tune's pruning trains a trial on until it is stopped; elastune's default pauses a trial at
a rung and resumes it from its checkpoint. Every trained epoch counts as an observation at
the moment it ends.

Metrics, per task (target and normalisation from LCBench's table of 1000
configurations: ``best``/``worst`` are its best and worst accuracy at epoch 52):

- normalized regret at 1, 3 and 10 times the median training time: ``(best - seen) /
  (best - worst)`` of the best validation accuracy seen by then (1 before any; below 0 where
  a run beat the table's best), the mean over tasks and seeds;
- mean rank: on each task and seed the methods ranked by the best accuracy seen by each
  budget (1 = best, ties share), averaged over tasks and seeds;
- runs reaching 99% of ``best`` by the deadline, and the median time to it over all runs
  (in median training times; "never" counts as infinite).

Methods (``benchmarks/peers/__init__.py``): elastune's default (a job file with no
scheduler and no sampler: bloom + mf-tpe), Optuna's TPE with its HyperbandPruner, SMAC3's
multi-fidelity facade with Hyperband, DEHB, Syne Tune's BOHB and ASHA, and the one-epoch
baseline (random configurations screened one epoch, 100 a round, the best 3 trained on). A
peer whose library is missing is skipped with the reason; the ones that cannot run here at
all are listed at the end of the output. ``VARIANTS`` are the default with one setting
changed, run only when ``--methods`` names them; each is ranked against the peers alone.

    python benchmarks/tuners.py                                  # everything (hours)
    python benchmarks/tuners.py --tasks evaluation --seeds 10 --workers 4 --jobs 2
    python benchmarks/tuners.py --tasks 3945 --seeds 1 --methods elastune DEHB
    python benchmarks/tuners.py --methods "the default" --merge benchmarks/results/tuners.json
    python benchmarks/tuners.py --report benchmarks/results/tuners.json --tasks held-out

Results: ``benchmarks/results/tuners.json`` and ``tuners.png`` (the anytime curves), or
``tuners_<name>.json`` with ``--name``; ``--merge FILE...`` adds the runs of earlier results
files (e.g. the peers' runs to a new run of the default alone). Each finished run goes to
``tuners[_<name>].runs.jsonl`` as it ends, so a command stopped half way and started again
the same way runs only what is missing; the file is removed once the results are written.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import optuna

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from lcbench_default import EPOCHS, TASK_SETS, job  # noqa: E402  (benchmarks/lcbench_default.py)

from benchmarks.peers import PEERS, UNAVAILABLE, missing  # noqa: E402
from elastune.planners.sim import LCBenchSurrogate, LCBenchTable, simulate  # noqa: E402
from elastune.planners.sim.lcbench import tasks  # noqa: E402
from elastune.planners.spec import distributions  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
DEFAULT = "elastune default (bloom + mf-tpe)"
METHODS = [DEFAULT, *PEERS]
# The default with one setting changed: run only when --methods names them, and each ranked
# among the peers alone, as if it stood in the default's place.
VARIANTS = {"the default, mf-tpe gamma 0.15": {"name": "mf-tpe", "gamma": 0.15}}
ORDER = [DEFAULT, *VARIANTS, *PEERS]  # the tables' rows
BUDGETS = (1.0, 3.0, 10.0)  # in median 52-epoch training times
TARGET = 0.99
GRID = 41  # points of each run's stored anytime curve, over [0, horizon]
DEFAULT_JOB = {"max_resource": EPOCHS, "max_trials": None}  # no name: the default scheduler
PEER_JOB = {"name": "random", "max_resource": EPOCHS, "max_trials": None}


def error(loss: float) -> float:
    """The validation error a peer minimises, from elastune's loss (minus the accuracy in
    percent); kept above 0 for SMAC3's model of log costs."""
    return max(1e-9, 1.0 + loss / 100.0)


@functools.cache  # read once per process: a process runs many runs of each task
def task_facts(task: str) -> dict[str, float]:
    """The table's best and worst accuracy at epoch 52, and its median 52-epoch time."""
    table = LCBenchTable(task)
    final = table.values[:, -1]
    return {
        "best": float(final.max()),
        "worst": float(final.min()),
        "median_full_seconds": float(np.median(table.seconds[:, -1])),
    }


@functools.cache  # its model loads in about 0.3 s; a process runs one simulation at a time
def surrogate_of(task: str) -> LCBenchSurrogate:
    return LCBenchSurrogate(task)


def run_one(task: str, method: str, seed: int, workers: int, horizon: float) -> dict[str, Any]:
    """One simulated run of ``method`` on ``task`` up to ``horizon`` median training times."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    facts = task_facts(task)
    unit = facts["median_full_seconds"]
    surrogate = surrogate_of(task)
    started, cpu = time.perf_counter(), time.process_time()
    if method == DEFAULT or method in VARIANTS:
        spec = job(DEFAULT_JOB, VARIANTS.get(method))  # None: the default sampler
        run = simulate(spec, surrogate, workers, seed, deadline=horizon * unit)
    else:
        spec = job(PEER_JOB, {"name": "random", "seed": seed})
        scheduler, close = PEERS[method].build(distributions(spec), EPOCHS, seed, error)
        try:
            run = simulate(
                spec, surrogate, workers, seed, deadline=horizon * unit, scheduler=scheduler,
                fast=True,
            )  # fmt: skip
        finally:
            close()
    reached = run.time_to(TARGET * facts["best"])
    grid = np.linspace(0.0, horizon, GRID)
    return {
        "task": task,
        "method": method,
        "seed": seed,
        "workers": workers,
        "best_at": {f"{b:g}": run.best_at(b * unit) for b in BUDGETS if b <= horizon},
        "curve": [_rounded(run.best_at(t * unit)) for t in grid],
        "reached": reached is not None,
        "time_to_target": math.inf if reached is None else reached / unit,
        "trials_started": run.trials_started,
        "segments_run": run.segments_run,
        "seconds": time.perf_counter() - started,
        "cpu_seconds": time.process_time() - cpu,
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def regret(value: float | None, facts: dict[str, float]) -> float:
    """Normalized regret of a best accuracy seen (1 before any observation)."""
    if value is None:
        return 1.0
    return (facts["best"] - value) / (facts["best"] - facts["worst"])


def mean_ranks(runs: list[dict[str, Any]], methods: list[str], budget: str) -> dict[str, float]:
    """Each method's rank among ``methods`` by the best seen at ``budget``, on each (task,
    seed) that every method ran (1 = best; ties share their mean rank), averaged."""
    from scipy.stats import rankdata

    cells: dict[tuple[str, int], dict[str, float]] = {}
    for r in runs:
        value = r["best_at"].get(budget)
        cells.setdefault((r["task"], r["seed"]), {})[r["method"]] = (
            -math.inf if value is None else value
        )
    ranks: dict[str, list[float]] = {m: [] for m in methods}
    for cell in cells.values():
        if set(methods) <= set(cell):
            order = rankdata([-cell[m] for m in methods])  # higher accuracy ranks first
            for m, rank in zip(methods, order, strict=True):
                ranks[m].append(float(rank))
    return {m: statistics.fmean(v) if v else math.nan for m, v in ranks.items()}


def summarise(
    runs: list[dict[str, Any]], methods: list[str], facts: dict[str, dict[str, float]]
) -> dict[str, Any]:
    """Per method: mean rank and mean normalized regret at each budget, the runs reaching
    99% of the task best, the median time to it, and the CPU the runs took."""
    budgets = sorted(runs[0]["best_at"], key=float)
    field = [m for m in methods if m not in VARIANTS]
    peers = [m for m in field if m != DEFAULT]
    ranks = {b: mean_ranks(runs, field, b) for b in budgets}
    for variant in (m for m in methods if m in VARIANTS):
        for b in budgets:
            ranks[b][variant] = mean_ranks(runs, [variant, *peers], b)[variant]
    summary: dict[str, Any] = {}
    for method in methods:
        mine = [r for r in runs if r["method"] == method]
        summary[method] = {
            "runs": len(mine),
            "mean_rank": {b: ranks[b][method] for b in budgets},
            "normalized_regret": {
                b: statistics.fmean(regret(r["best_at"][b], facts[r["task"]]) for r in mine)
                for b in budgets
            },
            "reached": sum(r["reached"] for r in mine),
            "median_time_to_target": statistics.median(r["time_to_target"] for r in mine),
            "median_time_to_target_where_reached": statistics.median(
                [r["time_to_target"] for r in mine if r["reached"]] or [math.inf]
            ),
            "median_best_at_deadline_pct": statistics.median(
                100 * (r["best_at"][budgets[-1]] or 0.0) / facts[r["task"]]["best"] for r in mine
            ),
            "cpu_seconds": sum(r["cpu_seconds"] for r in mine),
        }
    return summary


def head_to_head(runs: list[dict[str, Any]], methods: list[str]) -> dict[str, dict[str, int]]:
    """Against each peer, on the (task, seed) cells both ran: the runs where the default's
    best at the deadline is higher, and those where it is lower."""
    deadline = max(runs[0]["best_at"], key=float)
    best = {(r["task"], r["seed"], r["method"]): r["best_at"][deadline] or 0.0 for r in runs}
    counts: dict[str, dict[str, int]] = {}
    for peer in (m for m in methods if m != DEFAULT):
        pairs = [
            (value, best[(task, seed, peer)])
            for (task, seed, method), value in best.items()
            if method == DEFAULT and (task, seed, peer) in best
        ]
        counts[peer] = {
            "better": sum(mine > theirs for mine, theirs in pairs),
            "worse": sum(mine < theirs for mine, theirs in pairs),
        }
    return counts


def table_text(summary: dict[str, Any], workers: int, cells: int) -> str:
    """The summary as a Markdown table."""
    budgets = list(next(iter(summary.values()))["mean_rank"])
    lines = [
        f"\n{workers} worker{'s' if workers > 1 else ''}, {cells} (task, seed) cells",
        "| method | "
        + " | ".join(f"rank at {b}x" for b in budgets)
        + " | "
        + " | ".join(f"regret at {b}x" for b in budgets)
        + f" | best at {budgets[-1]}x, % | reach 99% | time to 99% | where reached | CPU s |",
        "|---|" + "---|" * (2 * len(budgets) + 5),
    ]
    for method, row in summary.items():
        lines.append(
            f"| {'**' + method + '**' if method == DEFAULT else method} | "
            + " | ".join(f"{row['mean_rank'][b]:.2f}" for b in budgets)
            + " | "
            + " | ".join(f"{row['normalized_regret'][b]:.4f}" for b in budgets)
            + f" | {row['median_best_at_deadline_pct']:.2f}"
            + f" | {row['reached']}/{row['runs']} | "
            + _time(row["median_time_to_target"])
            + f" | {_time(row['median_time_to_target_where_reached'])}"
            + f" | {row['cpu_seconds']:.0f} |"
        )
    return "\n".join(lines)


def _time(median_trainings: float) -> str:
    return "never" if math.isinf(median_trainings) else f"{median_trainings:.2f}"


def mean_curves(
    runs: list[dict[str, Any]], facts: dict[str, dict[str, float]], methods: list[str]
) -> dict[str, dict[str, list[float]]]:
    """Mean normalized regret on the time grid, per worker count and method."""
    curves: dict[str, dict[str, list[float]]] = {}
    for workers in sorted({r["workers"] for r in runs}):
        curves[str(workers)] = {}
        for method in methods:
            mine = [r for r in runs if r["method"] == method and r["workers"] == workers]
            if mine:
                values = [[regret(v, facts[r["task"]]) for v in r["curve"]] for r in mine]
                curves[str(workers)][method] = np.mean(values, axis=0).round(5).tolist()
    return curves


def plot(curves: dict[str, dict[str, list[float]]], horizon: float, path: Path) -> None:
    """Mean normalized regret against time, one panel per worker count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(6.5 * len(curves), 4.6), squeeze=False)
    grid = np.linspace(0.0, horizon, GRID)
    for ax, (workers, by_method) in zip(axes[0], curves.items(), strict=True):
        for method, curve in by_method.items():
            style = {"lw": 2.4, "color": "black"} if method == DEFAULT else {"lw": 1.2}
            ax.plot(grid[1:], np.maximum(curve[1:], 1e-4), label=method, **style)
        for b in BUDGETS:
            ax.axvline(b, color="grey", lw=0.6, ls=":")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("simulated time / task's median 52-epoch training time")
        ax.set_ylabel("mean normalized regret of the best validation accuracy")
        ax.set_title(f"{workers} worker{'s' if workers != '1' else ''}")
        ax.grid(alpha=0.3, which="both")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("LCBench surrogate, whole space: anytime regret (mean over tasks and seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def chosen_tasks(names: list[str]) -> list[str]:
    """Task ids from set names (``all``, ``evaluation``, ``tuning``, ``held-out``) or ids."""
    every = {"all": list(tasks()), **TASK_SETS}
    chosen: list[str] = []
    for name in names:
        if name not in every and name not in tasks():
            raise SystemExit(f"--tasks: {name!r} is neither a task set nor an LCBench task id")
        chosen += [t for t in every.get(name, [name]) if t not in chosen]
    return chosen


def chosen_methods(prefixes: list[str] | None) -> list[str]:
    """Methods by leading words (the default's variants only so); a peer whose library is
    missing is left out, said why."""
    offered = ORDER if prefixes else METHODS
    methods = [m for m in offered if not prefixes or any(m.startswith(p) for p in prefixes)]
    if prefixes and not methods:
        raise SystemExit(f"--methods: none of {prefixes} starts a method name ({offered})")
    runnable = []
    for method in methods:
        why = missing(PEERS[method]) if method in PEERS else None
        if why is None:
            runnable.append(method)
        else:
            print(f"skipped {method}: {why}")
    return runnable


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["all"], help="sets or task ids")
    parser.add_argument("--methods", nargs="*", help="a subset, by leading words of the names")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 1])
    parser.add_argument("--horizon", type=float, default=max(BUDGETS), help="median trainings")
    parser.add_argument("--jobs", type=int, default=2, help="processes running runs")
    parser.add_argument("--name", default="", help="results go to tuners_<name>.json/.png")
    parser.add_argument(
        "--merge", nargs="*", default=[], type=Path, help="results files whose runs join these"
    )
    parser.add_argument(
        "--report", type=Path, help="print the tables of this file's runs on --tasks; run nothing"
    )
    args = parser.parse_args(argv)
    for field in ("seeds", "jobs"):
        if getattr(args, field) < 1:
            parser.error(f"--{field.replace('_', '-')} must be >= 1, got {getattr(args, field)}")
    if min(args.workers) < 1:
        parser.error(f"--workers must be >= 1, got {min(args.workers)}")
    if not args.horizon > 0:
        parser.error(f"--horizon must be > 0, got {args.horizon}")
    return args


def _key(run: dict[str, Any]) -> tuple[str, str, int, int]:
    return (run["task"], run["method"], run["seed"], run["workers"])


def run_all(jobs: list[tuple[Any, ...]], processes: int, log: Path) -> list[dict[str, Any]]:
    """The runs, in ``processes`` processes (in this one for 1). Each finished run is
    appended to ``log`` (one JSON line), and runs already there are not run again: an
    interrupted command, started again the same way, goes on where it stopped."""
    done = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    have = {_key(r) for r in done}
    todo = [j for j in jobs if (j[0], j[1], j[2], j[3]) not in have]
    with log.open("a") as out:

        def keep(run: dict[str, Any]) -> None:
            out.write(json.dumps(run, default=lambda v: None) + "\n")
            out.flush()
            done.append(run)

        if processes == 1:
            for j in todo:
                keep(run_one(*j))
        else:
            with ProcessPoolExecutor(processes) as pool:
                for run in pool.map(run_one, *zip(*todo, strict=True), chunksize=1):
                    keep(run)
    wanted = {(j[0], j[1], j[2], j[3]) for j in jobs}
    return [_fix_infinity(r) for r in done if _key(r) in wanted]


def _fix_infinity(run: dict[str, Any]) -> dict[str, Any]:
    """JSON has no infinity: a run that never reached the target is written with null."""
    if run["time_to_target"] is None:
        run["time_to_target"] = math.inf
    return run


def merged(paths: list[Path], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``runs`` and the runs of earlier results files that they do not repeat."""
    seen = {_key(r) for r in runs}
    for path in paths:
        for run in json.loads(path.read_text())["runs"]:
            if _key(run) not in seen:
                seen.add(_key(run))
                runs.append(_fix_infinity(run))
    return runs


def write(payload: dict[str, Any], path: Path) -> None:
    """The results as JSON, one line per run."""
    head = json.dumps({k: v for k, v in payload.items() if k != "runs"}, indent=1)
    lines = ",\n".join(json.dumps(r, default=lambda v: None) for r in payload["runs"])
    text = f'{head[:-2]},\n "runs": [\n{lines}\n ]\n}}\n'
    path.write_text(text.replace("Infinity", "null"))


def tables(runs: list[dict[str, Any]], facts: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Print, per worker count, the summary table and the default's head-to-head counts at
    the deadline; return the summaries by worker count."""
    methods = [m for m in ORDER if any(r["method"] == m for r in runs)]
    results: dict[str, Any] = {}
    for workers in sorted({r["workers"] for r in runs}, reverse=True):
        mine = [r for r in runs if r["workers"] == workers]
        results[str(workers)] = summary = summarise(mine, methods, facts)
        cells = len({(r["task"], r["seed"]) for r in mine})
        print(table_text(summary, workers, cells))
        if DEFAULT in methods:
            for peer, count in head_to_head(mine, methods).items():
                print(
                    f"the default's best at the deadline against {peer}: higher in "
                    f"{count['better']} runs, lower in {count['worse']}"
                )
    return results


def report(path: Path, chosen: list[str]) -> dict[str, Any]:
    """The tables of a results file's runs on the ``chosen`` tasks; nothing is run."""
    payload = json.loads(path.read_text())
    runs = [_fix_infinity(r) for r in payload["runs"] if r["task"] in chosen]
    if not runs:
        raise SystemExit(f"--report: {path} holds no run on the tasks chosen by --tasks")
    payload["results"] = tables(runs, payload["tasks"])
    return payload


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    if args.report:
        return report(args.report, chosen_tasks(args.tasks))
    chosen, methods = chosen_tasks(args.tasks), chosen_methods(args.methods)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    jobs = [
        (t, m, s, w, args.horizon) for w in args.workers for t in chosen for s in seeds
        for m in methods
    ]  # fmt: skip
    started = time.perf_counter()
    RESULTS.mkdir(exist_ok=True)
    stem = "tuners" + (f"_{args.name}" if args.name else "")
    log = RESULTS / f"{stem}.runs.jsonl"
    runs = merged(args.merge, run_all(jobs, args.jobs, log))
    wall = time.perf_counter() - started
    every = sorted({r["task"] for r in runs}, key=list(tasks()).index)
    facts = {task: task_facts(task) for task in every}
    payload: dict[str, Any] = {
        "protocol": {
            "tasks": every,
            "seeds": sorted({r["seed"] for r in runs}),
            "horizon": f"{args.horizon:g} x the task's median 52-epoch training time",
            "budgets": [b for b in BUDGETS if b <= args.horizon],
            "target": f"{TARGET} x the table's best val_accuracy at epoch 52",
            "configurations": "the surrogate's whole space (examples/lcbench.yaml)",
        },
        "tasks": facts,
        "unavailable": UNAVAILABLE,
        "results": tables(runs, facts),
    }
    print(f"\n{len(jobs)} simulated runs in {wall:.0f} s wall clock ({args.jobs} processes)")
    for name, why in UNAVAILABLE.items():
        print(f"not run, {name}: {why}")
    methods = [m for m in ORDER if any(r["method"] == m for r in runs)]
    payload["curves"] = mean_curves(runs, facts, methods)
    plot(payload["curves"], args.horizon, RESULTS / f"{stem}.png")
    payload["runs"], payload["wall_seconds"] = runs, wall
    write(payload, RESULTS / f"{stem}.json")
    log.unlink()  # every run is in the results file now
    print(f"wrote {RESULTS / stem}.json and .png")
    return payload


if __name__ == "__main__":
    main()
