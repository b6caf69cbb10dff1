"""Fluid: packing a TrialGroup onto the pool (ALGORITHMS.md §6).

A segment is a rectangle: its **width** is its GPU share ``w`` and its **height** the time it
runs at that width. Widths above 1 are data-parallel training on ``w`` GPUs of one node
(speed ``S(w)`` from the profile); widths ``1/c`` share one GPU between ``c`` segments (speed
``sigma(c)`` each). The packer picks widths by water-filling (§6.3, and a water-level
variant that avoids its rounding loss) and places rectangles on the nodes over time, keeping
one trial's workers on one node.

Two policies share one event engine:

* :class:`StaticFluid` fixes each segment's width when its group arrives and list-schedules
  the rectangles (tallest first, any that fits starts).
* :class:`DynamicFluid` re-fills on every event (§6.4): widths are recomputed from the work
  *left*, queued segments may start narrower than planned rather than wait, and a running
  segment is widened only when the time saved exceeds the profile's rescale cost.

An executor calls :meth:`Packer.submit`, :meth:`Packer.on_segment_done` and
:meth:`Packer.on_pool_change` with its clock; each returns the :class:`Assignment` changes
to apply. A simulator that only needs a stage's makespan calls :meth:`Packer.pack`.

The speeds come from the job's speed profile (:class:`planners.cost.profile.Profile`).

Example (the §6.3 worked example):
    >>> from planners.cost.profile import Profile
    >>> profile = Profile.from_speeds({2: 1.8, 4: 3.2})
    >>> packer = StaticFluid(profile, gpus=8)
    >>> group = [Work(t, resource=h, seconds_per_unit=60.0) for t, h in enumerate([40, 20, 10, 10])]
    >>> schedule = packer.pack(group)
    >>> schedule.widths
    {0: 4.0, 1: 2.0, 2: 1.0, 3: 1.0}
    >>> round(schedule.makespan / 60, 2), round(schedule.lower_bound / 60, 2)
    (12.5, 12.5)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from planners.schedulers.base import Result

if TYPE_CHECKING:  # a type only: importing planners.cost loads its planners, which use this
    from planners.cost.profile import Profile

# Widths are Fractions: 1/3 must compare and add exactly (three of them make one GPU).
_EPS = 1e-9


def _show(width: Fraction) -> str:
    return str(width.numerator) if width.denominator == 1 else f"1/{width.denominator}"


def _as_width(value: float | Fraction) -> Fraction:
    # 1/3 arrives as 0.333..; the nearest fraction with a small denominator is the intent.
    return Fraction(value).limit_denominator(1000)


@dataclass(frozen=True)
class Work:
    """One segment as the packer sees it: ``resource`` left to train for ``trial``, at
    ``seconds_per_unit`` per resource unit on one whole GPU (from the profile)."""

    trial: int
    resource: float
    seconds_per_unit: float

    def __post_init__(self) -> None:
        if not self.resource > 0:
            raise ValueError(f"resource of trial {self.trial} must be > 0, got {self.resource}")
        if not self.seconds_per_unit > 0:
            raise ValueError(
                f"seconds_per_unit of trial {self.trial} must be > 0, got {self.seconds_per_unit}"
            )

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
class Placement:
    """One rectangle of a schedule: ``trial`` ran at ``width`` on ``gpus`` from ``start`` to
    ``end``, spending its first ``overhead`` seconds restarting."""

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

    placements: tuple[Placement, ...]
    lower_bound: float

    @property
    def makespan(self) -> float:
        return max((p.end for p in self.placements), default=0.0)

    @property
    def ratio(self) -> float:
        """Makespan over the lower bound (1 is optimal; Fluid proves at most 2)."""
        return self.makespan / self.lower_bound if self.lower_bound > 0 else 1.0

    @property
    def widths(self) -> dict[int, float]:
        """Each trial's width in its last rectangle (the one that finished it)."""
        last = {p.trial: p.width for p in sorted(self.placements, key=lambda p: p.end)}
        return dict(sorted(last.items()))


@dataclass
class _Run:
    width: Fraction
    node: int
    gpus: tuple[int, ...]
    start: float
    overhead: float
    resource: float  # left when the run's training (after the overhead) began


class _Pool:
    """GPUs ``0..total-1``, ``gpus_per_node`` to a node (the last node may be smaller).

    A GPU is free, held whole by one trial, or shared by trials of widths ``1/c``: ``n`` of
    them fit while ``n <= c`` for each, so every one runs at ``sigma(n) >= sigma(c)``, at least
    the speed the packer assumed for it (sigma never rises with ``c``)."""

    def __init__(self, total: int, gpus_per_node: int):
        self.total = total
        self.gpus_per_node = gpus_per_node
        self.holders: dict[int, set[int]] = {}
        self.share: dict[int, int] = {}  # trial -> c, for trials of width 1/c

    @property
    def largest_node(self) -> int:
        return min(self.total, self.gpus_per_node)

    def _nodes(self) -> dict[int, list[int]]:
        nodes: dict[int, list[int]] = {}
        for gpu in range(self.total):
            nodes.setdefault(gpu // self.gpus_per_node, []).append(gpu)
        return nodes

    def find(self, width: Fraction, mover: int | None = None) -> tuple[int, tuple[int, ...]] | None:
        """Best fit for ``width``, as if ``mover`` (a running trial) had left; None if none."""

        def others(gpu: int) -> set[int]:
            return self.holders.get(gpu, set()) - {mover}

        if width < 1:
            c = width.denominator
            shared = []
            for gpu in range(self.total):
                sharers = others(gpu)
                caps = [self.share.get(t, 0) for t in sharers]
                if sharers and len(sharers) + 1 <= min([c, *caps]):
                    shared.append(gpu)
            if shared:
                # Join the fullest shared GPU, so the others stay whole for wide trials.
                gpu = min(shared, key=lambda g: (-len(others(g)), g))
                return gpu // self.gpus_per_node, (gpu,)
            width = Fraction(1)
        need = int(width)
        best = None
        for node, gpus in self._nodes().items():
            idle = [g for g in gpus if not others(g)]
            # Best fit: the node left with the fewest free GPUs keeps big holes for wide trials.
            if len(idle) >= need and (best is None or len(idle) < len(best[1])):
                best = (node, idle)
        return None if best is None else (best[0], tuple(best[1][:need]))

    def occupy(self, trial: int, width: Fraction, gpus: tuple[int, ...]) -> None:
        for gpu in gpus:
            self.holders.setdefault(gpu, set()).add(trial)
        if width < 1:
            self.share[trial] = width.denominator

    def release(self, trial: int, gpus: Iterable[int]) -> None:
        for gpu in gpus:
            self.holders.get(gpu, set()).discard(trial)
        self.share.pop(trial, None)

    def resize(self, total: int) -> set[int]:
        """Grow or shrink to ``total`` GPUs (highest ids go first); the trials displaced."""
        displaced = {t for g, hs in self.holders.items() if g >= total for t in hs}
        self.holders = {g: hs for g, hs in self.holders.items() if g < total}
        self.total = total
        return displaced


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
        >>> group = [Work(t, resource=1, seconds_per_unit=3600) for t in range(8)]
        >>> from planners.cost.profile import Profile
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
        self._pool = _Pool(gpus, gpus_per_node)
        self._work: dict[int, Work] = {}  # every unfinished trial's segment
        self._left: dict[int, float] = {}  # resource left, for trials not running
        self._restarts: set[int] = set()  # trials that pay the rescale cost when they start
        self._groups: list[list[int]] = []
        self._running: dict[int, _Run] = {}
        self._log: list[Placement] = []
        self._now = 0.0

    # --- the model ------------------------------------------------------------------------

    @property
    def gpus(self) -> int:
        return self._pool.total

    def _placeable(self) -> tuple[Fraction, ...]:
        return tuple(w for w in self.widths if w <= self._pool.largest_node)

    def height(self, work: Work, width: float | Fraction) -> float:
        """Seconds ``work`` takes at ``width``."""
        return work.seconds / self.profile.speed(_as_width(width))

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
            return max((w for w in widths if w <= x + _EPS), default=narrowest)

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
            fits = tall[None] <= chunk[:, None, None] * (1 + _EPS)  # level x trial x width
            # argmin takes the first of equal areas: the narrowest width.
            pick = np.where(fits, area[None], np.inf).argmin(axis=2)  # level x trial
            rows = np.arange(len(trials))
            used, height = span[pick].sum(axis=1), tall[rows, pick].max(axis=1)
            spread = np.maximum(area[rows, pick].sum(axis=1) / gpus, height)
            predicted = np.where(used <= gpus + _EPS, height, spread)
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
        displaced = self._pool.resize(gpus)
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
        if now < self._now - _EPS:
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
        overhead = self.profile.overhead_s if trial in self._restarts else 0.0
        self._restarts.discard(trial)
        self._pool.occupy(trial, width, gpus)
        self._running[trial] = _Run(width, node, gpus, self._now, overhead, self._left[trial])
        return Assignment(float(width), node, gpus)

    def _stop(self, trial: int) -> None:
        """Log the running rectangle up to now and free its GPUs."""
        left = self._remaining(trial)
        run = self._running.pop(trial)
        self._pool.release(trial, run.gpus)
        self._left[trial] = left
        self._log.append(
            Placement(
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


class StaticFluid(Packer):
    """StaticFluid (§6.3): widths chosen once per group over the pool size ``M``, then
    rectangles list-scheduled tallest first; a width never changes once chosen.

    The widths are §6.3's water-filling or, where it packs shorter, the water-level
    allotment (:meth:`Packer.level_fill`): each is list-scheduled on an empty pool and the
    shorter kept, so this is never worse than §6.3's rule alone.

    Example (§6.4's group: §6.3 runs all three at once, 6 h; the level allotment runs the
    tall trial on all 4 GPUs first, then the others on 2 each, 5 h):
        >>> from planners.cost.profile import Profile
        >>> packer = StaticFluid(Profile.linear(4), gpus=4)
        >>> group = [Work(t, h, 3600.0) for t, h in enumerate([12, 4, 4])]
        >>> packer.water_fill({x.trial: x.seconds for x in group}, 4)
        {0: Fraction(2, 1), 1: Fraction(1, 1), 2: Fraction(1, 1)}
        >>> schedule = packer.pack(group)
        >>> schedule.widths, schedule.makespan / 3600
        ({0: 4.0, 1: 2.0, 2: 2.0}, 5.0)
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._targets: dict[int, Fraction] = {}

    def submit(
        self, group: Sequence[Work], *, now: float, widths: Mapping[int, float] | None = None
    ) -> Assignments:
        """As :meth:`Packer.submit`; ``widths`` fixes some trials' widths (e.g. a plan's
        ``g`` per stage) instead of water-filling them."""
        fixed = self._check_widths(group, widths or {})
        if not self._placeable():
            raise ValueError("the pool has no GPUs; widths are chosen when a group arrives")
        options = self._options(group, fixed)
        if len(options) > 1:
            fixed = min(options, key=lambda o: self._rigid(group, o).makespan)
        else:
            fixed = options[0]
        self._admit(group, now)
        self._targets |= fixed
        return self._fill()

    def pack(self, group: Sequence[Work], widths: Mapping[int, float] | None = None) -> Schedule:
        """As :meth:`Packer.pack`, with ``widths`` fixed as in :meth:`submit`."""
        fixed = self._check_widths(group, widths or {})
        return min((self._rigid(group, o) for o in self._options(group, fixed)), key=_makespan)

    def _options(
        self, group: Sequence[Work], fixed: dict[int, Fraction]
    ) -> list[dict[int, Fraction]]:
        """Candidate widths for a group: §6.3's first, so it wins ties."""
        free = {x.trial: x.seconds for x in group if x.trial not in fixed}
        options = [
            fixed | self.water_fill(free, self.gpus),
            fixed | self.level_fill(free, self.gpus),
        ]
        return options[:1] if options[0] == options[1] else options

    def _rigid(self, group: Sequence[Work], widths: Mapping[int, Fraction]) -> Schedule:
        """List-schedule ``group`` at exactly ``widths`` on an empty pool."""
        sim = self._fresh()
        assert isinstance(sim, StaticFluid)
        sim._admit(group, 0.0)
        sim._targets = dict(widths)
        sim._fill()
        return sim._run_out(self.lower_bound(group))

    def _check_widths(
        self, group: Sequence[Work], widths: Mapping[int, float]
    ) -> dict[int, Fraction]:
        trials = {x.trial for x in group}
        checked = {}
        for t, value in widths.items():
            if t not in trials:
                raise ValueError(f"widths names trial {t}, which is not in the group")
            w = _as_width(value)
            if w > self.gpus:
                raise ValueError(
                    f"width {value} of trial {t} is more GPUs than the pool has ({self.gpus})"
                )
            if w > self._pool.largest_node:
                raise ValueError(
                    f"width {value} of trial {t} is more GPUs than a node has "
                    f"({self._pool.largest_node}); a trial's workers stay on one node"
                )
            if w not in self.widths:
                raise ValueError(
                    f"width {value} of trial {t} is not covered by the profile "
                    f"(allowed widths: {', '.join(_show(x) for x in self.widths)})"
                )
            checked[t] = w
        return checked

    def _fill(self) -> Assignments:
        changes: Assignments = {}
        cap = self._placeable()[-1]
        self._targets = {t: w for t, w in self._targets.items() if t in self._work}
        for trial in self._queue(self._targets):
            width = min(self._targets[trial], cap)  # the pool may have shrunk since
            spot = self._pool.find(width)
            if spot is not None:
                changes[trial] = self._start(trial, width, *spot)
        return changes


class DynamicFluid(Packer):
    """DynamicFluid (§6.4): on every event, re-fill widths from the work left (earlier
    groups first, later groups get what they leave), start waiting trials at the widest width
    that fits, and widen a running trial when that saves more than the rescale cost.

    Example (§6.4 with ``S = {2: 1.8, 4: 3.2}``: trial 0 widens to 4 GPUs at t = 4 h):
        >>> group = [Work(t, h, 3600.0) for t, h in enumerate([12, 4, 4])]
        >>> from planners.cost.profile import Profile
        >>> schedule = DynamicFluid(Profile.from_speeds({2: 1.8, 4: 3.2}), gpus=4).pack(group)
        >>> [(p.trial, p.width, round(p.start / 3600, 2), round(p.end / 3600, 2))
        ...  for p in schedule.placements]
        [(1, 1.0, 0.0, 4.0), (2, 1.0, 0.0, 4.0), (0, 2.0, 0.0, 4.0), (0, 4.0, 4.0, 5.5)]
    """

    def _targets(self) -> dict[int, Fraction]:
        targets: dict[int, Fraction] = {}
        left: float = self.gpus
        for group in self._groups:
            heights = {t: self._remaining(t) * self._work[t].seconds_per_unit for t in group}
            widths = self.water_fill(heights, left)
            targets |= widths
            # Running trials are never narrowed, so they hold at least their current width.
            held = (
                max(w, self._running[t].width) if t in self._running else w
                for t, w in widths.items()
            )
            left -= float(sum(held))
        return targets

    def _fill(self) -> Assignments:
        changes: Assignments = {}
        targets = self._targets()
        placeable = self._placeable()
        for trial in self._queue(targets):
            # Waiting costs more than starting narrow: a later event can still widen it.
            for width in reversed([w for w in placeable if w <= targets[trial]]):
                spot = self._pool.find(width)
                if spot is not None:
                    changes[trial] = self._start(trial, width, *spot)
                    break
        tallest_first = sorted(self._running, key=lambda t: (-(self._end(t)), t))
        for trial in tallest_first:
            run = self._running[trial]
            for width in reversed([w for w in placeable if run.width < w <= targets[trial]]):
                spot = self._pool.find(width, mover=trial)
                if spot is None:
                    continue
                work = self._work[trial]
                left = self._remaining(trial)
                saved = (
                    self._end(trial)
                    - self._now
                    - left * work.seconds_per_unit / self.profile.speed(width)
                )
                if saved > self.profile.overhead_s + _EPS:
                    self._stop(trial)
                    self._restarts.add(trial)
                    changes[trial] = self._start(trial, width, *spot)
                break
        return changes


def _makespan(schedule: Schedule) -> float:
    return schedule.makespan


def fifo_makespan(group: Sequence[Work], gpus: int) -> float:
    """Baseline: one GPU per trial, started in submission order as GPUs free up."""
    free = [0.0] * gpus
    for work in group:
        i = min(range(gpus), key=free.__getitem__)
        free[i] += work.seconds
    return max(free) if group else 0.0


def best_rigid(packer: StaticFluid, group: Sequence[Work]) -> Schedule:
    """The shortest of :meth:`StaticFluid.pack` and every uniform width (all of ``group`` at
    one allowed width, in waves), as predicted on an empty pool of the packer's shape.

    A synchronous stage's segments are equal, and there whole waves at one width can beat
    the water level, whose prediction ``max(area / M, T)`` ignores that 9 segments on 8 GPUs
    take two waves. Ties keep StaticFluid's packing.

    Example (9 equal segments on 8 GPUs: StaticFluid's two waves at width 1 take 2 h; at
    width 4, two run at a time and five waves take 5/3.2 = 1.56 h):
        >>> from planners.cost.profile import Profile
        >>> packer = StaticFluid(Profile.from_speeds({2: 1.8, 4: 3.2}), gpus=8, gpus_per_node=4)
        >>> group = [Work(t, 1, 3600.0) for t in range(9)]
        >>> packer.pack(group).makespan / 3600, round(best_rigid(packer, group).makespan / 3600, 2)
        (2.0, 1.56)
    """
    best = packer.pack(group)
    for width in packer._placeable():
        uniform = packer.pack(group, widths={x.trial: float(width) for x in group})
        if uniform.makespan < best.makespan - _EPS:
            best = uniform
    return best
