"""The simulator's event engine: segments evaluated on a benchmark's curves, and the
event loops that deliver their results in simulated-time order.

Each segment's result is due at ``now + its epochs' cost`` on an event queue (a heap
ordered by due time, then by submission). Every trained epoch counts as an observation of
the anytime curve at the moment it would have finished, even inside a segment that a
deadline cuts off. A PBT exploit continues on the curve of its new configuration from the
donor's resource: a learning-curve benchmark knows configurations and epochs, not
inherited weights.

Packing (:class:`Packing`, synchronous SHA and Hyperband only): the workers are the pool's
GPUs, and the segments the scheduler hands out at once form one TrialGroup per (bracket,
rung), submitted to a Fluid packer (docs/algorithms.md §6, :mod:`elastune.planners.staging.fluid`).
The packer chooses each segment's width, ``w`` GPUs training ``S(w)`` times as fast (the
profile's speedup), and when it starts; DynamicFluid also widens running segments as others
finish, paying the profile's rescale cost. A segment's work is its epochs' cost on one GPU,
spread evenly over its wall time (its epochs' observations are placed pro rata), and
``gpu_seconds`` counts width times wall time. Without packing every segment takes one
worker.

Preemption (:class:`Preemption`, one worker per segment): each worker is an instance
interrupted as a Poisson process (seeded by the run's seed). A segment checkpoints after
every epoch, so an interruption loses the part of the epoch in progress; the segment
resumes from its checkpoint on a replacement after ``restart_seconds``, as the executor's
retries do. Lost work counts in ``gpu_seconds``; the epochs' observations are stretched
over the longer wall time.

Example (an instance interrupted about once an hour, on a 10-epoch segment of two hours):
    >>> import numpy as np
    >>> wall, busy, count = Preemption(1.0, 180.0).run(7200.0, 10, np.random.default_rng(0))
    >>> count > 0, wall == busy + 180.0 * count, busy >= 7200.0
    (True, True, True)
    >>> best_so_far([(3.0, 0.5), (1.0, 0.4), (2.0, 0.3), (4.0, 0.9)], horizon=3.5, maximise=True)
    [(1.0, 0.4), (3.0, 0.5)]
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from elastune.planners.search import Result, Segment, TuningLoop
from elastune.planners.sim.benchmark import Benchmark, Curve
from elastune.planners.staging import DynamicFluid, Packer, Profile, StaticFluid, Work
from elastune.planners.staging.packing import Assignments

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


class CurveSegments:
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


def _epoch(resource: float, benchmark: Benchmark) -> int:
    epoch = round(resource)
    if abs(resource - epoch) > 1e-9 or not 0 <= epoch <= benchmark.max_resource:
        raise ValueError(
            f"segment boundary {resource:g} is not a whole epoch in 0..{benchmark.max_resource} "
            f"of {benchmark.name}; use integer resources"
        )
    return epoch


@dataclass
class RunTally:
    """What a run observed: anytime points, top-resource results and busy GPU time."""

    points: list[tuple[float, float]] = field(default_factory=list)
    trained: list[tuple[float, float]] = field(default_factory=list)
    gpu_seconds: float = 0.0
    submitted: int = 0
    results: int = 0
    end: float = 0.0
    preemptions: int = 0


def run_workers(
    loop: TuningLoop,
    segments: CurveSegments,
    workers: int,
    horizon: float,
    top: float,
    preemption: Preemption | None = None,
    rng: np.random.Generator | None = None,
) -> RunTally:
    """The event loop with one worker per segment."""
    tally = RunTally()
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
                tally.preemptions += count
            stretch = wall / result.seconds if result.seconds > 0 else 1.0
            tally.points.extend((now + dt * stretch, value) for dt, value in seen)
            heapq.heappush(queue, (now + wall, tally.submitted, now, busy, job.gpus, result))
            tally.submitted += 1
        if not queue:
            break
        due, _, start, busy, gpus, result = queue[0]
        if due > horizon:
            break
        heapq.heappop(queue)
        now = due
        tally.gpu_seconds += busy * gpus
        loop.record(result)
        tally.results += 1
        if result.resource >= top and not math.isnan(result.loss):
            tally.trained.append((due, -result.loss if segments.maximise else result.loss))
    for due, _, start, busy, gpus, _ in queue:  # cut off by the deadline
        share = (min(due, horizon) - start) / (due - start) if due > start else 0.0
        tally.gpu_seconds += busy * share * gpus
    tally.end = now if not queue else horizon
    return tally


def run_packed(
    loop: TuningLoop, segments: CurveSegments, packer: Packer, horizon: float, top: float
) -> RunTally:
    """The event loop with a Fluid packer in place of one worker per segment."""
    tally = RunTally()
    waiting: dict[int, tuple[Result, list[tuple[float, float]]]] = {}
    began: dict[int, float] = {}  # trial -> when its segment first started
    width: dict[int, tuple[float, float]] = {}  # running trial -> (width, since)
    now = 0.0

    def account(trial: int, until: float) -> None:
        w, since = width.pop(trial)
        tally.gpu_seconds += w * (until - since)

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
        tally.points.extend((start + dt * scale, value) for dt, value in seen)

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
            tally.submitted += 1
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
        tally.results += 1
        if result.resource >= top and not math.isnan(result.loss):
            tally.trained.append((now, -result.loss if segments.maximise else result.loss))
    tally.end = now if not width else horizon
    for trial in list(width):  # cut off by the deadline
        observe(trial, packer.finish_time(trial))
        account(trial, horizon)
    return tally


def best_so_far(
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
