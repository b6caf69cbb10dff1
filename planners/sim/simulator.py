"""A whole tuning job in simulated time: the real scheduler, N virtual workers, and a
learning-curve benchmark in place of training.

:func:`simulate` drives the job's scheduler through :class:`elastune.planners.search.TuningLoop`,
exactly as the Prefect flow does: whenever a virtual worker is free it asks for the next
segment; the benchmark (:mod:`elastune.planners.sim.benchmark`) says what the metric is after each
epoch of that segment and how many seconds each epoch takes, and the event engine
(:mod:`elastune.planners.sim.engine`) delivers the results to the scheduler and Optuna in
simulated-time order. Configurations come from the job's sampler or the benchmark's table
(:mod:`elastune.planners.sim.configs`). Schedulers and the loop are the same objects on every path.

Example:
    >>> from elastune.planners.sim.benchmark import Curve
    >>> from elastune.planners.spec import parse_job
    >>> spec = parse_job({"name": "toy", "trainable": "m:f", "metric": "acc",
    ...     "space": {"x": {"type": "float", "low": 0, "high": 1}},
    ...     "scheduler": {"name": "asha", "min_resource": 1, "max_resource": 9,
    ...                   "max_trials": 30}})
    >>> class Toy:                       # accuracy grows with x and with epochs, 1 s/epoch
    ...     name, max_resource, table = "toy", 9, None
    ...     def curve(self, config):
    ...         return Curve([config["x"] * e / 9 for e in range(1, 10)],
    ...                      [float(e) for e in range(1, 10)])
    >>> run = simulate(spec, Toy(), workers=4, seed=0)
    >>> run.trials_started, run.final_best > 0.9, run.anytime[0][0] > 0
    (30, True, True)
    >>> simulate(spec, Toy(), workers=4, seed=0).to_dict() == run.to_dict()
    True
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna

from elastune.planners.search import Best, Scheduler, TuningLoop, make_scheduler
from elastune.planners.sim.benchmark import Benchmark
from elastune.planners.sim.configs import fit_to_table, study_for
from elastune.planners.sim.engine import (
    CurveSegments,
    Packing,
    Preemption,
    best_so_far,
    run_packed,
    run_workers,
)
from elastune.planners.spec import JobSpec
from elastune.planners.spec.model import HyperbandSpec, ShaSpec


@dataclass
class SimulatedRun:
    """One seed's run. ``anytime`` holds ``(simulated seconds, best metric so far)`` at each
    improvement, counting every trained epoch; ``trained`` counts only the results of trials
    trained to the job's ``max_resource`` (the sense of ASHA's "time to a fully trained
    model", §3.2); ``gpu_seconds`` counts busy worker time up to the end (or the deadline)."""

    seed: int
    workers: int
    mode: str
    anytime: list[tuple[float, float]]
    gpu_seconds: float
    trials_started: int
    segments_run: int
    results: int  # segment results delivered to the scheduler (events)
    simulated_seconds: float
    best_trial: dict[str, Any] | None
    trained: list[tuple[float, float]] = field(default_factory=list)
    preemptions: int = 0
    wall_seconds: float = field(default=0.0, compare=False)  # real time; not in to_dict()

    @property
    def final_best(self) -> float | None:
        return self.anytime[-1][1] if self.anytime else None

    def best_at(self, seconds: float) -> float | None:
        """Best metric observed by simulated time ``seconds``."""
        best = None
        for t, value in self.anytime:
            if t > seconds:
                break
            best = value
        return best

    def time_to(self, target: float, trained: bool = False) -> float | None:
        """First simulated time the best metric reached ``target`` (None: never); with
        ``trained``, the first time a trial trained to ``max_resource`` reached it."""
        for t, value in self.trained if trained else self.anytime:
            if (value >= target) if self.mode == "max" else (value <= target):
                return t
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "workers": self.workers,
            "anytime": [[t, v] for t, v in self.anytime],
            "trained": [[t, v] for t, v in self.trained],
            "final_best": self.final_best,
            "gpu_seconds": self.gpu_seconds,
            "trials_started": self.trials_started,
            "segments_run": self.segments_run,
            "results": self.results,
            "simulated_seconds": self.simulated_seconds,
            "best_trial": self.best_trial,
            "preemptions": self.preemptions,
        }


def simulate(
    spec: JobSpec,
    benchmark: Benchmark,
    workers: int,
    seed: int = 0,
    *,
    deadline: float | None = None,
    scheduler: Scheduler | None = None,
    fast: bool = False,
    replace: bool = False,
    sampler: optuna.samplers.BaseSampler | None = None,
    packing: Packing | None = None,
    preemption: Preemption | None = None,
) -> SimulatedRun:
    """Run the job once in simulated time.

    Args:
        spec: The job; its metric and mode are the benchmark's metric and direction.
        benchmark: Learning curves and epoch costs (see :class:`Benchmark`).
        workers: Virtual workers (each segment takes one for its duration).
        seed: Seeds the sampler, the table permutation and the scheduler.
        deadline: Simulated seconds after which the run stops (running segments are cut).
        scheduler: Overrides the job's scheduler (e.g. a peer's adapter); the caller then
            sizes it to the table itself.
        fast: Take the fast path (no Optuna study; see :mod:`elastune.planners.sim.configs`).
        replace: Draw table rows with replacement (for more trials than rows).
        sampler: Overrides where configurations come from (and implies an Optuna study);
            with a table, it must propose the table's rows.
        packing: Run synchronous stages as Fluid TrialGroups on ``workers`` GPUs (see
            :mod:`elastune.planners.sim.engine`); None: one worker per segment.
        preemption: Interrupt workers at random (see :mod:`elastune.planners.sim.engine`).
    """
    _check(spec, workers, packing, preemption)
    started = time.perf_counter()
    keep = benchmark.table is not None or sampler is not None or fast
    spec = _for_run(spec, benchmark, seed, keep_sampler=keep, replace=replace)
    loop = TuningLoop(
        spec,
        study_for(spec, benchmark, seed, not fast, replace, sampler),
        scheduler or make_scheduler(spec, seed),
    )
    horizon = math.inf if deadline is None else deadline
    top = spec.scheduler.max_resource - 1e-9
    segments = CurveSegments(loop, benchmark, spec.mode == "max")
    if packing is not None:
        tally = run_packed(loop, segments, packing.packer(workers), horizon, top)
    else:
        rng = np.random.default_rng([seed, 7])  # interruptions: their own stream
        tally = run_workers(loop, segments, workers, horizon, top, preemption, rng)
    loop.finish()
    return SimulatedRun(
        seed=seed,
        workers=workers,
        mode=spec.mode,
        anytime=best_so_far(tally.points, horizon, segments.maximise),
        trained=best_so_far(tally.trained, horizon, segments.maximise),
        gpu_seconds=tally.gpu_seconds,
        trials_started=len(loop.configs),
        segments_run=tally.submitted,
        results=tally.results,
        preemptions=tally.preemptions,
        simulated_seconds=tally.end,
        best_trial=_best_trial(loop.best()),
        wall_seconds=time.perf_counter() - started,
    )


def _check(
    spec: JobSpec, workers: int, packing: Packing | None, preemption: Preemption | None
) -> None:
    """Reject arguments :func:`simulate` cannot run with."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if packing is not None and preemption is not None:
        raise ValueError("preemption is simulated with one worker per segment, not with packing")
    if packing is not None and not isinstance(spec.scheduler, ShaSpec | HyperbandSpec):
        raise ValueError(
            f"packing runs the stages of synchronous sha or hyperband, not {spec.scheduler.name}"
        )


def _for_run(
    spec: JobSpec, benchmark: Benchmark, seed: int, *, keep_sampler: bool, replace: bool
) -> JobSpec:
    """The job as one run simulates it: sized to the benchmark's table (unless rows are
    drawn with replacement), its sampler seeded for this run."""
    if benchmark.table is not None and not replace:
        spec = fit_to_table(spec, len(benchmark.table))
    # TuningLoop reseeds the job's sampler for every trial from ``sampler.seed``: give it this
    # run's seed, or None where the study's own sampler must stay (a table, a sampler passed
    # in, the fast path).
    sampler_spec = spec.sampler.model_copy(update={"seed": None if keep_sampler else seed})
    return spec.model_copy(update={"sampler": sampler_spec})


def _best_trial(best: Best | None) -> dict[str, Any] | None:
    if best is None:
        return None
    return {
        "trial": best.trial,
        "metric": best.metric,
        "resource": best.resource,
        "config": best.config,
    }
