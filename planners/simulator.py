"""A whole tuning job in simulated time: the real scheduler, N virtual workers, and a
learning-curve benchmark in place of training.

The simulator drives the job's scheduler through :class:`planners.loop.TuningLoop`, exactly
as the Prefect flow does: whenever a virtual worker is free it asks for the next segment;
the benchmark says what the metric is after each epoch of that segment and how many seconds
each epoch takes, so the segment's result is due at ``now + its epochs' cost`` on an event
queue (a heap ordered by due time, then by submission). Results reach the scheduler and
Optuna in simulated-time order. Every trained epoch counts as an observation of the anytime
curve at the moment it would have finished, even inside a segment that a deadline cuts off.

Where configurations come from:

- a benchmark without a table (e.g. the LCBench surrogate) answers for any configuration,
  so the job's own Optuna sampler proposes them, seeded per run;
- a benchmark with a finite ``table`` bypasses the sampler cleanly: the in-memory study gets
  a :class:`TableSampler` that hands trial number ``i`` the ``i``-th row of a permutation
  drawn from the run's seed (without replacement; ``replace=True`` draws rows with
  replacement). Schedulers with ``max_trials`` are capped at the table's size. The one
  exception is the model-based ``mf-tpe`` sampler: it chooses among the rows not tried
  yet (:func:`table_sampler`).

A PBT exploit continues on the curve of its new configuration from the donor's resource: a
learning-curve benchmark knows configurations and epochs, not inherited weights.

Packing (``packing=Packing(...)``, synchronous SHA and Hyperband only): ``workers`` are the
pool's GPUs, and the segments the scheduler hands out at once form one TrialGroup per
(bracket, rung), submitted to a Fluid packer (ALGORITHMS.md §6, :mod:`planners.packing`).
The packer chooses each segment's width, ``w`` GPUs training ``S(w)`` times as fast (the
profile's speedup), and when it starts; DynamicFluid also widens running segments as others
finish, paying the profile's rescale cost. A segment's work is its epochs' cost on one GPU,
spread evenly over its wall time (its epochs' observations are placed pro rata), and
``gpu_seconds`` counts width times wall time. Without ``packing`` every segment takes one
worker (the default, unchanged).

Preemption (``preemption=Preemption(per_hour, restart_seconds)``, one worker per segment):
each worker is an instance interrupted as a Poisson process (seeded by the run's seed). A
segment checkpoints after every epoch, so an interruption loses the part of the epoch in
progress; the segment resumes from its checkpoint on a replacement after
``restart_seconds``, as the executor's retries do. Lost work counts in ``gpu_seconds``;
the epochs' observations are stretched over the longer wall time.

Fast path (``fast=True``): a stand-in for the Optuna study that draws configurations
directly (table rows, or uniform draws from the space) and drops reports, for runs of
100,000 trials where Optuna's bookkeeping would dominate. Schedulers and the loop are the
same objects either way.

Example:
    >>> from planners.spec import parse_job
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

import heapq
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.study import StudyDirection

from planners.cost.profile import Profile
from planners.explore import draw
from planners.loop import TuningLoop
from planners.mftpe import MultiFidelityTpeSampler
from planners.packing import Assignments, DynamicFluid, Packer, StaticFluid, Work
from planners.schedulers import make_scheduler
from planners.schedulers.base import Result, Scheduler, Segment
from planners.space import distributions, make_sampler
from planners.spec import (
    AshaSpec,
    BloomSpec,
    FifoSpec,
    HyperbandSpec,
    JobSpec,
    MedianSpec,
    PbtSpec,
    ShaSpec,
    SpecError,
)

BENCHMARKS = "lcbench:TASK_ID (surrogate), lcbench-table:TASK_ID (the 1000-config table)"


@dataclass(frozen=True)
class Curve:
    """One configuration's learning curve: the metric after each epoch ``1..E`` and the
    cumulative seconds up to each epoch (non-decreasing)."""

    metric: Sequence[float]
    seconds: Sequence[float]


class Benchmark(Protocol):
    """What the simulator needs from a learning-curve benchmark."""

    name: str
    max_resource: int  # epochs a curve has
    # Finite configurations to draw from, or None when any configuration can be evaluated.
    table: Sequence[Mapping[str, Any]] | None

    def curve(self, config: Mapping[str, Any]) -> Curve: ...


# --- where configurations come from -------------------------------------------------------


class RowDraw:
    """Row indices of a table for trial numbers 0, 1, 2, ...: a seeded permutation, or
    independent draws with ``replace=True``."""

    def __init__(self, size: int, seed: int, replace: bool = False):
        self.size = size
        self.replace = replace
        self._rng = np.random.default_rng(seed)
        self._rows: list[int] = [] if replace else self._rng.permutation(size).tolist()

    def __call__(self, number: int) -> int:
        if self.replace:
            while len(self._rows) <= number:
                self._rows.extend(self._rng.integers(self.size, size=1024).tolist())
        elif number >= self.size:
            raise ValueError(f"the table has only {self.size} configurations to draw")
        return self._rows[number]


class TableSampler(optuna.samplers.BaseSampler):
    """An Optuna sampler that hands out whole rows of a finite table (no search at all)."""

    def __init__(self, table: Sequence[Mapping[str, Any]], rows: RowDraw):
        self.table = table
        self.rows = rows

    def infer_relative_search_space(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        search_space: dict[str, BaseDistribution],
    ) -> dict[str, Any]:
        return {}

    def sample_independent(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self.table[self.rows(trial.number)][param_name]


class _LightTrial:
    __slots__ = ("number", "params")

    def __init__(self, number: int, params: dict[str, Any]):
        self.number, self.params = number, params

    def report(self, value: float, step: int) -> None:
        """The fast path keeps no intermediate values."""

    def set_user_attr(self, key: str, value: Any) -> None:
        """Nor attributes."""


class _LightStudy:
    """The part of ``optuna.Study`` that TuningLoop uses, without storage (fast path)."""

    def __init__(self, direction: StudyDirection, propose: Callable[[int], dict[str, Any]]):
        self.direction = direction
        self._propose = propose
        self._asked = 0

    def get_trials(self, deepcopy: bool = True) -> list[Any]:
        return []  # a fresh run: nothing to resume

    def ask(self, fixed_distributions: Mapping[str, BaseDistribution]) -> _LightTrial:
        trial = _LightTrial(self._asked, self._propose(self._asked))
        self._asked += 1
        return trial

    def tell(self, trial: _LightTrial, value: float | None = None, state: Any = None) -> None:
        """Nothing to learn from: the fast path has no model-based sampler."""


def _study(
    spec: JobSpec,
    benchmark: Benchmark,
    seed: int,
    use_optuna: bool,
    replace: bool,
    sampler: optuna.samplers.BaseSampler | None,
) -> Any:
    direction = StudyDirection.MAXIMIZE if spec.mode == "max" else StudyDirection.MINIMIZE
    table = benchmark.table
    rows = RowDraw(len(table), seed, replace) if table is not None else None
    if sampler is not None or use_optuna:
        if sampler is None:
            sampler = table_sampler(spec, table, rows, seed) if rows else make_sampler(spec, seed)
        return optuna.create_study(direction=direction, sampler=sampler)
    if rows is not None:
        names = list(spec.space)

        def row(number: int) -> dict[str, Any]:
            values = table[rows(number)]
            return {k: values[k] for k in names}

        return _LightStudy(direction, row)
    space, rng = distributions(spec), np.random.default_rng(seed)
    return _LightStudy(direction, lambda n: {k: draw(d, rng) for k, d in space.items()})


def table_sampler(
    spec: JobSpec, table: Sequence[Mapping[str, Any]], rows: RowDraw, seed: int
) -> optuna.samplers.BaseSampler:
    """Where a table's rows come from: the seeded permutation (:class:`TableSampler`); for
    the ``mf-tpe`` sampler (rows drawn without replacement), the model's choice among the
    rows not tried yet. It scores rows by their hyperparameters only; the curves of rows
    not tried are never read, so it learns what random search would see."""
    if spec.sampler.name == "mf-tpe" and not rows.replace:
        options = {k: v for k, v in spec.sampler.options.items() if k != "candidates"}
        return MultiFidelityTpeSampler(seed=seed, candidates=table, **options)
    return TableSampler(table, rows)


def fit_to_table(spec: JobSpec, size: int) -> JobSpec:
    """The job with ``max_trials`` capped at the table's size, or a SpecError if it needs more."""
    s = spec.scheduler
    if isinstance(s, PbtSpec):
        raise SpecError(
            "scheduler: pbt perturbs configurations, which a finite table cannot look up; "
            "use the surrogate (lcbench:TASK_ID)"
        )
    if isinstance(s, ShaSpec):
        if s.max_trials is not None and s.max_trials > size:
            raise SpecError(
                f"scheduler.max_trials: {s.max_trials} exceeds the table's {size} configurations"
            )
        return spec
    if isinstance(s, AshaSpec | BloomSpec | FifoSpec | MedianSpec) and (
        s.max_trials is None or s.max_trials > size
    ):
        return spec.model_copy(update={"scheduler": s.model_copy(update={"max_trials": size})})
    return spec


# --- packing ---------------------------------------------------------------------------------

POLICIES: dict[str, type[Packer]] = {"static": StaticFluid, "dynamic": DynamicFluid}


@dataclass(frozen=True)
class Packing:
    """Run each synchronous stage as a Fluid TrialGroup (see the module docstring).

    Args:
        policy: ``static`` (StaticFluid: widths fixed when a group arrives) or ``dynamic``
            (DynamicFluid: re-filled on every event).
        profile: Speed-up per width, GPU sharing and the rescale cost.
        gpus_per_node: GPUs per node (a trial's workers stay on one); default all of them.
        max_share: Most segments sharing one GPU (1: no sharing).
    """

    policy: str = "dynamic"
    profile: Profile = field(default_factory=Profile.from_speeds)
    gpus_per_node: int | None = None
    max_share: int = 1

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(
                f"packing policy must be one of {', '.join(POLICIES)}, got {self.policy!r}"
            )

    def packer(self, gpus: int) -> Packer:
        return POLICIES[self.policy](
            self.profile, gpus, gpus_per_node=self.gpus_per_node, max_share=self.max_share
        )


class _Segments:
    """Segments evaluated on the benchmark (each configuration's curve fetched once)."""

    def __init__(self, loop: TuningLoop, benchmark: Benchmark, maximise: bool):
        self.loop, self.benchmark, self.maximise = loop, benchmark, maximise
        self.curves: dict[int, tuple[Mapping[str, Any], Curve]] = {}

    def evaluate(self, job: Segment) -> tuple[Result, list[tuple[float, float]]]:
        """The segment's result (``seconds``: its epochs' cost on one GPU) and its running
        best at each improvement, as (seconds into the segment, value)."""
        config = self.loop.configs[job.trial]
        cached = self.curves.get(job.trial)
        if cached is None or cached[0] is not config:  # new trial, or PBT changed it
            cached = self.curves[job.trial] = (config, self.benchmark.curve(config))
        metric, seconds = cached[1].metric, cached[1].seconds
        a, b = _epoch(job.start, self.benchmark), _epoch(job.stop, self.benchmark)
        base = seconds[a - 1] if a else 0.0
        maximise = self.maximise
        best = -math.inf if maximise else math.inf
        seen = []
        for e in range(a, b):
            value = metric[e]
            if value > best if maximise else value < best:
                best = value
                seen.append((seconds[e] - base, value))
        sign = -1.0 if maximise else 1.0  # the scheduler minimises
        history = tuple((e + 1, sign * metric[e]) for e in range(a, b - 1))
        duration = seconds[b - 1] - base if b else 0.0
        return Result(job.trial, b, sign * metric[b - 1], history=history, seconds=duration), seen


@dataclass(frozen=True)
class Preemption:
    """Instances interrupted ``per_hour`` times an hour on average; a replacement is ready
    ``restart_seconds`` later."""

    per_hour: float
    restart_seconds: float = 180.0

    def __post_init__(self) -> None:
        if not self.per_hour >= 0:
            raise ValueError(f"per_hour must be >= 0, got {self.per_hour}")
        if not self.restart_seconds >= 0:
            raise ValueError(f"restart_seconds must be >= 0, got {self.restart_seconds}")

    def run(
        self, seconds: float, epochs: int, rng: np.random.Generator
    ) -> tuple[float, float, int]:
        """(wall time, busy time, interruptions) of a segment of ``epochs`` epochs costing
        ``seconds`` when nothing interrupts it."""
        if self.per_hour == 0 or seconds <= 0:
            return seconds, seconds, 0
        epoch = seconds / max(epochs, 1)
        left, wall, busy, count = seconds, 0.0, 0.0, 0
        while True:
            up = rng.exponential(3600.0 / self.per_hour)
            if up >= left:
                return wall + left, busy + left, count
            kept = math.floor(up / epoch) * epoch  # checkpointed epochs survive
            left -= kept
            wall += up + self.restart_seconds
            busy += up
            count += 1


@dataclass
class _Trace:
    """What a run observed: anytime points, top-resource results and busy GPU time."""

    points: list[tuple[float, float]] = field(default_factory=list)
    trained: list[tuple[float, float]] = field(default_factory=list)
    gpu_seconds: float = 0.0
    submitted: int = 0
    results: int = 0
    end: float = 0.0
    preemptions: int = 0


def _run_packed(
    loop: TuningLoop, segments: _Segments, packer: Packer, horizon: float, top: float
) -> _Trace:
    """The event loop with a Fluid packer in place of one worker per segment."""
    trace = _Trace()
    waiting: dict[int, tuple[Result, list[tuple[float, float]]]] = {}
    began: dict[int, float] = {}  # trial -> when its segment first started
    width: dict[int, tuple[float, float]] = {}  # running trial -> (width, since)
    now = 0.0

    def account(trial: int, until: float) -> None:
        w, since = width.pop(trial)
        trace.gpu_seconds += w * (until - since)

    def apply(changes: Assignments) -> None:
        for trial, assignment in changes.items():
            if trial in width:
                account(trial, now)
            if assignment is not None:
                width[trial] = (assignment.width, now)
                began.setdefault(trial, now)

    def observe(trial: int, end: float) -> None:
        """Place the segment's improvements pro rata between its start and ``end``."""
        result, seen = waiting[trial]
        start = began[trial]
        scale = (end - start) / result.seconds if result.seconds > 0 else 0.0
        trace.points.extend((start + dt * scale, value) for dt, value in seen)

    while True:
        groups: dict[tuple[int, int], list[Work]] = {}
        while now < horizon:
            job = loop.next_segment()
            if job is None:
                break
            result, seen = segments.evaluate(job)
            waiting[job.trial] = (result, seen)
            epochs = job.stop - job.start
            # A segment of no measurable cost still holds its GPUs for an instant.
            work = Work(job.trial, epochs, max(result.seconds, 1e-9) / epochs)
            groups.setdefault((job.bracket, job.rung), []).append(work)
            trace.submitted += 1
        for group in groups.values():
            apply(packer.submit(group, now=now))
        if not width:
            break
        trial = min(width, key=lambda t: (packer.finish_time(t), t))
        due = packer.finish_time(trial)
        if due > horizon:
            break
        now = due
        account(trial, now)
        apply(packer.on_segment_done(trial, now=now))
        observe(trial, now)
        result = replace(waiting.pop(trial)[0], seconds=now - began.pop(trial))
        loop.record(result)
        trace.results += 1
        if result.resource >= top and not math.isnan(result.loss):
            trace.trained.append((now, -result.loss if segments.maximise else result.loss))
    trace.end = now if not width else horizon
    for trial in list(width):  # cut off by the deadline
        observe(trial, packer.finish_time(trial))
        account(trial, horizon)
    return trace


# --- one run --------------------------------------------------------------------------------


@dataclass
class Simulation:
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


def _epoch(resource: float, benchmark: Benchmark) -> int:
    epoch = round(resource)
    if abs(resource - epoch) > 1e-9 or not 0 <= epoch <= benchmark.max_resource:
        raise ValueError(
            f"segment boundary {resource:g} is not a whole epoch in 0..{benchmark.max_resource} "
            f"of {benchmark.name}; use integer resources"
        )
    return epoch


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
) -> Simulation:
    """Run the job once in simulated time.

    Args:
        spec: The job; its metric and mode are the benchmark's metric and direction.
        benchmark: Learning curves and epoch costs (see :class:`Benchmark`).
        workers: Virtual workers (each segment takes one for its duration).
        seed: Seeds the sampler, the table permutation and the scheduler.
        deadline: Simulated seconds after which the run stops (running segments are cut).
        scheduler: Overrides the job's scheduler (e.g. a peer's adapter); the caller then
            sizes it to the table itself.
        fast: Take the fast path (no Optuna study; see the module docstring).
        replace: Draw table rows with replacement (for more trials than rows).
        sampler: Overrides where configurations come from (and implies an Optuna study);
            with a table, it must propose the table's rows.
        packing: Run synchronous stages as Fluid TrialGroups on ``workers`` GPUs (see the
            module docstring); None: one worker per segment.
        preemption: Interrupt workers at random (see the module docstring).
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if packing is not None and preemption is not None:
        raise ValueError("preemption is simulated with one worker per segment, not with packing")
    if packing is not None and not isinstance(spec.scheduler, ShaSpec | HyperbandSpec):
        raise ValueError(
            f"packing runs the stages of synchronous sha or hyperband, not {spec.scheduler.name}"
        )
    started = time.perf_counter()
    if benchmark.table is not None and not replace:
        spec = fit_to_table(spec, len(benchmark.table))
    # TuningLoop reseeds the job's sampler for every trial from ``sampler.seed``: give it this
    # run's seed, or None where the study's own sampler must stay (a table, a sampler passed
    # in, the fast path).
    keep = benchmark.table is not None or sampler is not None or fast
    sampler_spec = spec.sampler.model_copy(update={"seed": None if keep else seed})
    spec = spec.model_copy(update={"sampler": sampler_spec})
    loop = TuningLoop(
        spec,
        _study(spec, benchmark, seed, not fast, replace, sampler),
        scheduler or make_scheduler(spec, seed),
    )
    maximise = spec.mode == "max"
    horizon = math.inf if deadline is None else deadline
    top = spec.scheduler.max_resource - 1e-9
    segments = _Segments(loop, benchmark, maximise)
    if packing is not None:
        trace = _run_packed(loop, segments, packing.packer(workers), horizon, top)
    else:
        rng = np.random.default_rng([seed, 7])  # interruptions: their own stream
        trace = _run(loop, segments, workers, horizon, top, preemption, rng)
    loop.finish()
    best = loop.best()
    return Simulation(
        seed=seed,
        workers=workers,
        mode=spec.mode,
        anytime=_anytime(trace.points, horizon, maximise),
        trained=_anytime(trace.trained, horizon, maximise),
        gpu_seconds=trace.gpu_seconds,
        trials_started=len(loop.configs),
        segments_run=trace.submitted,
        results=trace.results,
        preemptions=trace.preemptions,
        simulated_seconds=trace.end,
        best_trial=None
        if best is None
        else {
            "trial": best.trial,
            "metric": best.metric,
            "resource": best.resource,
            "config": best.config,
        },
        wall_seconds=time.perf_counter() - started,
    )


def _run(
    loop: TuningLoop,
    segments: _Segments,
    workers: int,
    horizon: float,
    top: float,
    preemption: Preemption | None = None,
    rng: np.random.Generator | None = None,
) -> _Trace:
    """The event loop with one worker per segment."""
    trace = _Trace()
    # (due, order, start, busy GPU-seconds per GPU, gpus, result)
    queue: list[tuple[float, int, float, float, float, Result]] = []
    now = 0.0
    while True:
        while now < horizon and len(queue) < workers:
            job = loop.next_segment()
            if job is None:
                break
            result, seen = segments.evaluate(job)
            wall = busy = result.seconds
            if preemption is not None and rng is not None:
                epochs = round(job.stop - job.start)
                wall, busy, count = preemption.run(result.seconds, epochs, rng)
                trace.preemptions += count
            stretch = wall / result.seconds if result.seconds > 0 else 1.0
            trace.points.extend((now + dt * stretch, value) for dt, value in seen)
            heapq.heappush(queue, (now + wall, trace.submitted, now, busy, job.gpus, result))
            trace.submitted += 1
        if not queue:
            break
        due, _, start, busy, gpus, result = queue[0]
        if due > horizon:
            break
        heapq.heappop(queue)
        now = due
        trace.gpu_seconds += busy * gpus
        loop.record(result)
        trace.results += 1
        if result.resource >= top and not math.isnan(result.loss):
            trace.trained.append((due, -result.loss if segments.maximise else result.loss))
    for due, _, start, busy, gpus, _ in queue:  # cut off by the deadline
        share = (min(due, horizon) - start) / (due - start) if due > start else 0.0
        trace.gpu_seconds += busy * share * gpus
    trace.end = now if not queue else horizon
    return trace


def _anytime(
    points: list[tuple[float, float]], horizon: float, maximise: bool
) -> list[tuple[float, float]]:
    """The best metric over time: one point per improvement, observations after the
    horizon dropped. Ties in time keep submission order (the sort is stable)."""
    curve: list[tuple[float, float]] = []
    for t, value in sorted(points, key=lambda p: p[0]):
        if t > horizon:
            break
        if not curve or (value > curve[-1][1] if maximise else value < curve[-1][1]):
            curve.append((t, value))
    return curve


# --- the CLI's entry point --------------------------------------------------------------------


def load_benchmark(name: str, metric: str, root: str | Path | None = None) -> Benchmark:
    """``lcbench:TASK_ID`` or ``lcbench-table:TASK_ID``; SpecError names anything unknown."""
    family, _, task = name.partition(":")
    if family not in ("lcbench", "lcbench-table") or not task:
        raise SpecError(f"--benchmark {name}: unknown benchmark (known: {BENCHMARKS})")
    from planners.lcbench import LCBenchSurrogate, LCBenchTable  # local: reads files

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
