"""The Fluid packer's event engine and its vocabulary (docs/algorithms.md §6).

A segment is a rectangle: its **width** is its GPU share ``w`` and its **height** the time it
runs at that width. Widths above 1 are data-parallel training on ``w`` GPUs of one node
(speed ``S(w)`` from the profile); widths ``1/c`` share one GPU between ``c`` segments (speed
``sigma(c)`` each). The packer picks widths by water-filling (§6.3, and a water-level
variant that avoids its rounding loss) and places rectangles on the nodes over time, keeping
one trial's workers on one node. The two policies on this engine, StaticFluid and
DynamicFluid, are in :mod:`elastune.planners.staging.fluid`.

An executor calls :meth:`Packer.submit`, :meth:`Packer.on_segment_done` and
:meth:`Packer.on_pool_change` with its clock; each returns the :class:`Assignment` changes
to apply. A simulator that only needs a stage's makespan calls :meth:`Packer.pack`.

The speeds come from the job's speed profile (:class:`elastune.planners.staging.profile.Profile`).

Example (a segment of 40 units at a minute each, and a schedule of two rectangles):
    >>> Work(0, resource=40, seconds_per_unit=60.0).seconds
    2400.0
    >>> schedule = Schedule((Rectangle(0, 2.0, 0, (0, 1), 0.0, 1200.0),
    ...                      Rectangle(1, 1.0, 0, (2,), 0.0, 900.0)), lower_bound=1000.0)
    >>> schedule.makespan, schedule.ratio, schedule.widths
    (1200.0, 1.2, {0: 2.0, 1: 1.0})
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NamedTuple

import numpy as np

from elastune.planners.search import Result
from elastune.planners.staging.occupancy import GpuOccupancy
from elastune.planners.staging.profile import Profile

# Widths are Fractions: 1/3 must compare and add exactly (three of them make one GPU).
EPS = 1e-9


def show_width(width: Fraction) -> str:
    return str(width.numerator) if width.denominator == 1 else f"1/{width.denominator}"


def as_width(value: float | Fraction) -> Fraction:
    # 1/3 arrives as 0.333..; the nearest fraction with a small denominator is the intent.
    return Fraction(value).limit_denominator(1000)


@dataclass(frozen=True)
class Work:
    """One segment as the packer sees it: ``resource`` left to train for ``trial``, at
    ``seconds_per_unit`` per resource unit on one whole GPU (from the profile), after
    ``overhead`` seconds at any width (a staged segment is a task of its own: its start,
    restore and last checkpoint; Fluid's own trials pay only a restart, the profile's
    ``overhead_s``)."""

    trial: int
    resource: float
    seconds_per_unit: float
    overhead: float = 0.0

    def __post_init__(self) -> None:
        if not self.resource > 0:
            raise ValueError(f"resource of trial {self.trial} must be > 0, got {self.resource}")
        if not self.seconds_per_unit > 0:
            raise ValueError(
                f"seconds_per_unit of trial {self.trial} must be > 0, got {self.seconds_per_unit}"
            )
        if not self.overhead >= 0:
            raise ValueError(f"overhead of trial {self.trial} must be >= 0, got {self.overhead}")

    @property
    def seconds(self) -> float:
        """Height at width 1."""
        return self.resource * self.seconds_per_unit


class Assignment(NamedTuple):
    """Run a trial at ``width`` on ``gpus`` (global GPU ids, all on ``node``).

    A width below 1 shares its single GPU with other segments (MPS on NVIDIA)."""

    width: float
    node: int
    gpus: tuple[int, ...]


# trial -> where it runs from now on; None: checkpoint it and wait for GPUs.
Assignments = dict[int, Assignment | None]


@dataclass(frozen=True)
class Rectangle:
    """One rectangle of a schedule: ``trial`` ran at ``width`` on ``gpus`` from ``start`` to
    ``end``, spending its first ``overhead`` seconds outside training (its ``Work.overhead``,
    and a restart's)."""

    trial: int
    width: float
    node: int
    gpus: tuple[int, ...]
    start: float
    end: float
    overhead: float = 0.0


@dataclass(frozen=True)
class Schedule:
    """What :meth:`Packer.pack` predicts for one group."""

    rectangles: tuple[Rectangle, ...]
    lower_bound: float

    @property
    def makespan(self) -> float:
        return max((p.end for p in self.rectangles), default=0.0)

    @property
    def ratio(self) -> float:
        """Makespan over the lower bound (1 is optimal; Fluid proves at most 2)."""
        return self.makespan / self.lower_bound if self.lower_bound > 0 else 1.0

    @property
    def widths(self) -> dict[int, float]:
        """Each trial's width in its last rectangle (the one that finished it)."""
        last = {p.trial: p.width for p in sorted(self.rectangles, key=lambda p: p.end)}
        return dict(sorted(last.items()))


@dataclass
class _Run:
    width: Fraction
    node: int
    gpus: tuple[int, ...]
    start: float
    overhead: float
    resource: float  # left when the run's training (after the overhead) began


class Packer(ABC):
    """Chooses each segment's width and GPUs for groups of segments (Fluid's TrialGroups).

    Args:
        profile: Speed at each width; its ``overhead_s`` is the rescale cost.
        gpus: Pool size ``M``.
        gpus_per_node: GPUs per node (default: one node with all ``gpus``). A trial's
            workers always stay on one node.
        max_width: Most GPUs one trial may use (``d``); default the widest the profile
            covers that fits on a node.
        max_share: Most trials sharing one GPU (``c``); 1 turns sharing off. Sharing is used
            only where it pays, ``c * sigma(c) > 1``.

    Example (multiplexing, §6.3: 8 one-hour trials on 4 GPUs):
        >>> from elastune.planners.staging.fluid import StaticFluid
        >>> group = [Work(t, resource=1, seconds_per_unit=3600) for t in range(8)]
        >>> alone = StaticFluid(Profile.from_speeds(), gpus=4).pack(group)
        >>> shared = StaticFluid(Profile.from_speeds(sharing={2: 0.85}), gpus=4, max_share=2)
        >>> shared = shared.pack(group)
        >>> round(alone.makespan / 3600, 2), round(shared.makespan / 3600, 2)
        (2.0, 1.18)
        >>> StaticFluid(Profile.linear(4), gpus=8, max_width=8)
        Traceback (most recent call last):
        ...
        ValueError: max_width 8 is not covered by the profile (it covers widths 1, 2, 4)
    """

    def __init__(
        self,
        profile: Profile,
        gpus: int,
        gpus_per_node: int | None = None,
        max_width: int | None = None,
        max_share: int = 1,
    ):
        if not isinstance(gpus, int) or gpus < 1:
            raise ValueError(f"gpus must be an integer >= 1, got {gpus!r}")
        gpus_per_node = gpus if gpus_per_node is None else gpus_per_node
        if not isinstance(gpus_per_node, int) or gpus_per_node < 1:
            raise ValueError(f"gpus_per_node must be an integer >= 1, got {gpus_per_node!r}")
        covered = list(profile.speedup)
        if max_width is None:
            max_width = max(g for g in covered if g <= min(gpus, gpus_per_node))
        if max_width not in covered:
            raise ValueError(
                f"max_width {max_width} is not covered by the profile "
                f"(it covers widths {', '.join(map(str, covered))})"
            )
        if max_width > gpus:
            raise ValueError(f"max_width {max_width} is more GPUs than the pool has ({gpus})")
        if max_width > gpus_per_node:
            raise ValueError(
                f"max_width {max_width} is more GPUs than a node has ({gpus_per_node}); "
                "a trial's workers stay on one node"
            )
        if max_share != 1 and max_share not in profile.sharing:
            raise ValueError(
                f"max_share {max_share} is not covered by the profile "
                f"(sharing measured for {sorted(profile.sharing) or 'no counts'})"
            )
        self.profile = profile
        self.gpus_per_node = gpus_per_node
        self.max_width = max_width
        self.max_share = max_share
        shares = [
            Fraction(1, c)
            for c, sigma in profile.sharing.items()
            if c <= max_share and c * sigma > 1  # sharing that does not pay is never chosen
        ]
        self.widths: tuple[Fraction, ...] = tuple(
            sorted(shares + [Fraction(g) for g in covered if g <= max_width])
        )
        self._config: dict[str, Any] = {
            "profile": profile,
            "gpus": gpus,
            "gpus_per_node": gpus_per_node,
            "max_width": max_width,
            "max_share": max_share,
        }
        self._occupancy = GpuOccupancy(gpus, gpus_per_node)
        self._work: dict[int, Work] = {}  # every unfinished trial's segment
        self._left: dict[int, float] = {}  # resource left, for trials not running
        self._restarts: set[int] = set()  # trials that pay the rescale cost when they start
        self._groups: list[list[int]] = []
        self._running: dict[int, _Run] = {}
        self._log: list[Rectangle] = []
        self._now = 0.0

    # --- the model ------------------------------------------------------------------------

    @property
    def gpus(self) -> int:
        return self._occupancy.total

    def _placeable(self) -> tuple[Fraction, ...]:
        return tuple(w for w in self.widths if w <= self._occupancy.largest_node)

    def height(self, work: Work, width: float | Fraction) -> float:
        """Seconds ``work`` takes at ``width``."""
        return work.seconds / self.profile.speed(as_width(width))

    def lower_bound(self, group: Sequence[Work]) -> float:
        """``max(sum_i min_w w*h_i(w) / M, max_i min_w h_i(w))``: no schedule beats it."""
        widths = self._placeable()
        if not widths:
            raise ValueError("the pool has no GPUs, so no group has a lower bound")
        area = sum(min(w * self.height(x, w) for w in widths) for x in group)
        tallest = max((min(self.height(x, w) for w in widths) for x in group), default=0.0)
        return max(float(area) / self.gpus, tallest)

    def water_fill(self, heights: Mapping[int, float], gpus: float) -> dict[int, Fraction]:
        """Widths proportional to work (§6.3): ``w_i = M * h_i / sum h``, rounded down to an
        allowed width, then spare GPUs given one step at a time to the tallest trial."""
        widths = self._placeable()
        narrowest, widest = widths[0], widths[-1]
        total = sum(heights.values())

        def round_down(x: float) -> Fraction:
            return max((w for w in widths if w <= x + EPS), default=narrowest)

        chosen = {
            t: round_down(gpus * h / total) if total > 0 else narrowest for t, h in heights.items()
        }
        left = Fraction(gpus).limit_denominator(1000) - sum(chosen.values())
        while chosen:
            tallest = max(chosen, key=lambda t: heights[t] / self.profile.speed(chosen[t]))
            current = chosen[tallest]
            if current == widest:
                break
            step = widths[widths.index(current) + 1]
            if step - current > left or self.profile.speed(step) <= self.profile.speed(current):
                break
            left -= step - current
            chosen[tallest] = step
        return chosen

    def level_fill(self, heights: Mapping[int, float], gpus: float) -> dict[int, Fraction]:
        """Widths by water *level*: at a level ``T`` each trial takes its least-area width
        whose height is at most ``T``; the level chosen minimises the predicted makespan
        (``T`` when the widths fit the pool at once, else ``max(area / M, T)``).

        Under linear scaling this is §6.3's ``w_i = M * h_i / sum h`` without its rounding
        loss: rounding a share of 3.99 down to 2 halves the tallest trial's speed, and
        lifting many small shares to ``w_min`` over-commits the pool.
        """
        if not heights:
            return {}
        widths = self._placeable()
        span = np.array([float(w) for w in widths])
        trials = list(heights)
        tall = np.array([heights[t] for t in trials])[:, None] / np.array(
            [self.profile.speed(w) for w in widths]
        )  # trial x width
        area = tall * span
        levels = np.unique(tall)
        levels = levels[levels >= tall.min(axis=1).max()]  # every trial can reach the level
        best: tuple[float, np.ndarray] | None = None
        for chunk in np.array_split(levels, max(1, levels.size * tall.size // 200_000)):
            fits = tall[None] <= chunk[:, None, None] * (1 + EPS)  # level x trial x width
            # argmin takes the first of equal areas: the narrowest width.
            pick = np.where(fits, area[None], np.inf).argmin(axis=2)  # level x trial
            rows = np.arange(len(trials))
            used, height = span[pick].sum(axis=1), tall[rows, pick].max(axis=1)
            spread = np.maximum(area[rows, pick].sum(axis=1) / gpus, height)
            predicted = np.where(used <= gpus + EPS, height, spread)
            i = int(predicted.argmin())
            if best is None or predicted[i] < best[0]:
                best = (float(predicted[i]), pick[i])
        assert best is not None
        return {t: widths[j] for t, j in zip(trials, best[1], strict=True)}

    # --- the event interface --------------------------------------------------------------

    def submit(self, group: Sequence[Work], *, now: float) -> Assignments:
        """A new group: the scheduler waits for all of it. Returns the trials to start."""
        self._admit(group, now)
        return self._refill()

    def on_segment_done(
        self, trial: int, result: Result | None = None, *, now: float
    ) -> Assignments:
        """``trial``'s segment finished (or failed): its GPUs go to the others.

        ``result`` completes §6.1's signature; the packer needs only the fact that the
        segment ended, because a finished segment's measured time changes no other width.
        """
        self._advance(now)
        if trial not in self._running:
            raise ValueError(f"trial {trial} is not running")
        self._stop(trial)
        del self._work[trial], self._left[trial]
        self._groups = [g for g in ([t for t in g if t in self._work] for g in self._groups) if g]
        return self._refill()

    def on_pool_change(self, gpus: int, *, now: float) -> Assignments:
        """The pool now has ``gpus`` GPUs; trials on GPUs that left are checkpointed and
        queued again (``None`` in the result unless they restart at once)."""
        self._advance(now)
        if not isinstance(gpus, int) or gpus < 0:
            raise ValueError(f"gpus must be an integer >= 0, got {gpus!r}")
        displaced = self._occupancy.resize(gpus)
        changes: Assignments = {}
        for trial in sorted(displaced):
            self._stop(trial)
            self._restarts.add(trial)
            changes[trial] = None
        return changes | self._refill()

    def finish_time(self, trial: int) -> float:
        """When ``trial``'s running segment ends under the model, at its current width (an
        event that widens it moves this earlier): what a simulator waits for."""
        if trial not in self._running:
            raise ValueError(f"trial {trial} is not running")
        return self._end(trial)

    def pack(self, group: Sequence[Work]) -> Schedule:
        """Predict the schedule of ``group`` alone on an empty pool of this shape, with the
        heights this packer assumes (the simulator's per-stage call)."""
        sim = self._fresh()
        sim.submit(group, now=0.0)
        return sim._run_out(self.lower_bound(group))

    # --- the engine -----------------------------------------------------------------------

    def _fresh(self) -> Packer:
        return type(self)(**self._config)

    def _run_out(self, lower_bound: float) -> Schedule:
        """Finish every running trial when the model says it ends."""
        while self._running:
            trial = min(self._running, key=lambda t: (self._end(t), t))
            self.on_segment_done(trial, now=self._end(trial))
        return Schedule(tuple(self._log), lower_bound)

    def _refill(self) -> Assignments:
        return self._fill() if self._placeable() else {}  # an empty pool starts nothing

    def _admit(self, group: Sequence[Work], now: float) -> None:
        self._advance(now)
        trials = [x.trial for x in group]
        for t in trials:
            if t in self._work:
                raise ValueError(f"trial {t} is already in a group that has not finished")
        if len(set(trials)) != len(trials):
            raise ValueError(f"a group lists a trial twice: {trials}")
        for x in group:
            self._work[x.trial] = x
            self._left[x.trial] = x.resource
        if trials:
            self._groups.append(trials)

    def _advance(self, now: float) -> None:
        if now < self._now - EPS:
            raise ValueError(f"now must not go back in time: {now} < {self._now}")
        self._now = max(now, self._now)

    def _remaining(self, trial: int) -> float:
        """Resource left at the current time, as the packer's model predicts it."""
        run = self._running.get(trial)
        if run is None:
            return self._left[trial]
        work = self._work[trial]
        trained = max(0.0, self._now - run.start - run.overhead)
        rate = self.profile.speed(run.width) / work.seconds_per_unit
        return max(0.0, run.resource - trained * rate)

    def _end(self, trial: int) -> float:
        run = self._running[trial]
        work = self._work[trial]
        return (
            run.start
            + run.overhead
            + run.resource * work.seconds_per_unit / self.profile.speed(run.width)
        )

    def _start(self, trial: int, width: Fraction, node: int, gpus: tuple[int, ...]) -> Assignment:
        restart = self.profile.overhead_s if trial in self._restarts else 0.0
        overhead = self._work[trial].overhead + restart
        self._restarts.discard(trial)
        self._occupancy.occupy(trial, width, gpus)
        self._running[trial] = _Run(width, node, gpus, self._now, overhead, self._left[trial])
        return Assignment(float(width), node, gpus)

    def _stop(self, trial: int) -> None:
        """Log the running rectangle up to now and free its GPUs."""
        left = self._remaining(trial)
        run = self._running.pop(trial)
        self._occupancy.release(trial, run.gpus)
        self._left[trial] = left
        self._log.append(
            Rectangle(
                trial, float(run.width), run.node, run.gpus, run.start, self._now, run.overhead
            )
        )

    def _queue(self, targets: Mapping[int, Fraction]) -> list[int]:
        """Trials waiting for GPUs: earlier groups first, then the tallest first (LPT)."""
        order = []
        for rank, group in enumerate(self._groups):
            for pos, t in enumerate(group):
                if t not in self._running:
                    tall = (
                        self.height(self._work[t], targets[t])
                        * self._left[t]
                        / self._work[t].resource
                    )
                    order.append((rank, -tall, pos, t))
        return [t for *_, t in sorted(order)]

    @abstractmethod
    def _fill(self) -> Assignments:
        """Start (and, for dynamic policies, widen) trials on the free GPUs."""
