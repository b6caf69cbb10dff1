"""``elastune simulate``: a job on a named benchmark, once per seed, as JSON-ready data and
as a plain-text table.

Example:
    >>> from elastune.planners.spec import parse_job
    >>> spec = parse_job({"name": "d", "trainable": "m:f", "metric": "acc",
    ...     "space": {"x": {"type": "float", "low": 0, "high": 1}}})
    >>> simulate_job(spec, "nasbench:1", workers=4)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    elastune.planners.spec.model.SpecError: --benchmark nasbench:1: unknown benchmark (known: ...)
    >>> print(format_report({"job": "d", "benchmark": "toy", "scheduler": "asha",
    ...     "workers": 4, "metric": "acc", "mode": "max", "seeds": [{"seed": 0,
    ...     "final_best": 0.91, "simulated_seconds": 120.0, "gpu_seconds": 400.0,
    ...     "trials_started": 30, "segments_run": 45}]}))
    d on toy: asha, 4 workers, acc (max)
     seed  final best  sim. time s       GPU-s  trials  segments
        0        0.91        120.0       400.0      30        45
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from elastune.planners.sim.benchmark import Benchmark
from elastune.planners.sim.engine import Preemption
from elastune.planners.sim.lcbench import LCBenchSurrogate, LCBenchTable
from elastune.planners.sim.simulator import simulate
from elastune.planners.spec import JobSpec, SpecError

BENCHMARKS = "lcbench:TASK_ID (surrogate), lcbench-table:TASK_ID (the 1000-config table)"


def load_benchmark(name: str, metric: str, root: str | Path | None = None) -> Benchmark:
    """``lcbench:TASK_ID`` or ``lcbench-table:TASK_ID``; SpecError names anything unknown."""
    family, _, task = name.partition(":")
    if family not in ("lcbench", "lcbench-table") or not task:
        raise SpecError(f"--benchmark {name}: unknown benchmark (known: {BENCHMARKS})")
    kind = LCBenchTable if family == "lcbench-table" else LCBenchSurrogate
    return kind(task, metric=metric, root=root)


def simulate_job(
    spec: JobSpec,
    benchmark_name: str,
    workers: int,
    seeds: int = 1,
    *,
    deadline: float | None = None,
    root: str | Path | None = None,
    preemption: Preemption | None = None,
) -> dict[str, Any]:
    """``elastune simulate``: the job on a named benchmark, once per seed, as JSON-ready data.

    Seeds run ``sampler.seed, sampler.seed + 1, ...``; ``deadline`` (simulated seconds)
    defaults to the job's ``budget.deadline``. Bad input raises SpecError naming the flag
    or field.
    """
    if workers < 1:
        raise SpecError(f"--workers must be >= 1, got {workers}")
    if seeds < 1:
        raise SpecError(f"--seeds must be >= 1, got {seeds}")
    benchmark = load_benchmark(benchmark_name, spec.metric, root)
    benchmark.check(spec)
    deadline = spec.budget.deadline if deadline is None else deadline
    endless = getattr(spec.scheduler, "max_trials", 0) is None
    if endless and benchmark.table is None and deadline is None:
        raise SpecError(
            "scheduler.max_trials: null runs until the deadline, and the job has no "
            "budget.deadline; set one of them"
        )
    base = spec.sampler.seed or 0
    runs = [
        simulate(spec, benchmark, workers, base + i, deadline=deadline, preemption=preemption)
        for i in range(seeds)
    ]
    finals = [r.final_best for r in runs if r.final_best is not None]
    return {
        "job": spec.name,
        "benchmark": benchmark.name,
        "scheduler": spec.scheduler.name,
        "metric": spec.metric,
        "mode": spec.mode,
        "workers": workers,
        "deadline": deadline,
        "seeds": [r.to_dict() for r in runs],
        "summary": {
            "median_final_best": statistics.median(finals) if finals else None,
            "median_gpu_seconds": statistics.median(r.gpu_seconds for r in runs),
            "median_simulated_seconds": statistics.median(r.simulated_seconds for r in runs),
        },
    }


def format_report(report: dict[str, Any]) -> str:
    """A plain-text table of :func:`simulate_job`'s result, one row per seed."""
    lines = [
        f"{report['job']} on {report['benchmark']}: {report['scheduler']}, "
        f"{report['workers']} workers, {report['metric']} ({report['mode']})",
        f"{'seed':>5} {'final best':>11} {'sim. time s':>12} {'GPU-s':>11} "
        f"{'trials':>7} {'segments':>9}",
    ]
    for run in report["seeds"]:
        best = "-" if run["final_best"] is None else f"{run['final_best']:.4g}"
        lines.append(
            f"{run['seed']:>5} {best:>11} {run['simulated_seconds']:>12.1f} "
            f"{run['gpu_seconds']:>11.1f} {run['trials_started']:>7} {run['segments_run']:>9}"
        )
    return "\n".join(lines)
