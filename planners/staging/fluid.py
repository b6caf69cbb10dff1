"""The two Fluid policies (docs/algorithms.md §6) on the engine of
:mod:`elastune.planners.staging.packing`:

* :class:`StaticFluid` fixes each segment's width when its group arrives and list-schedules
  the rectangles (tallest first, any that fits starts).
* :class:`DynamicFluid` re-fills on every event (§6.4): widths are recomputed from the work
  *left*, queued segments may start narrower than planned rather than wait, and a running
  segment is widened only when the time saved exceeds the profile's rescale cost.

:func:`best_rigid` adds one width for all to StaticFluid's candidates (a synchronous stage's
equal segments), and :func:`fifo_makespan` is the one-GPU-per-trial baseline.

Example (the §6.3 worked example):
    >>> from elastune.planners.staging.profile import Profile
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

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from elastune.planners.staging.packing import (
    EPS,
    Assignments,
    Packer,
    Schedule,
    Work,
    as_width,
    show_width,
)


class StaticFluid(Packer):
    """StaticFluid (§6.3): widths chosen once per group over the pool size ``M``, then
    rectangles list-scheduled tallest first; a width never changes once chosen.

    The widths are §6.3's water-filling or, where it packs shorter, the water-level
    allotment (:meth:`Packer.level_fill`): each is list-scheduled on an empty pool and the
    shorter kept, so this is never worse than §6.3's rule alone.

    Example (§6.4's group: §6.3 runs all three at once, 6 h; the level allotment runs the
    tall trial on all 4 GPUs first, then the others on 2 each, 5 h):
        >>> from elastune.planners.staging.profile import Profile
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
            w = as_width(value)
            if w > self.gpus:
                raise ValueError(
                    f"width {value} of trial {t} is more GPUs than the pool has ({self.gpus})"
                )
            if w > self._occupancy.largest_node:
                raise ValueError(
                    f"width {value} of trial {t} is more GPUs than a node has "
                    f"({self._occupancy.largest_node}); a trial's workers stay on one node"
                )
            if w not in self.widths:
                raise ValueError(
                    f"width {value} of trial {t} is not covered by the profile "
                    f"(allowed widths: {', '.join(show_width(x) for x in self.widths)})"
                )
            checked[t] = w
        return checked

    def _fill(self) -> Assignments:
        changes: Assignments = {}
        cap = self._placeable()[-1]
        self._targets = {t: w for t, w in self._targets.items() if t in self._work}
        for trial in self._queue(self._targets):
            width = min(self._targets[trial], cap)  # the pool may have shrunk since
            spot = self._occupancy.find(width)
            if spot is not None:
                changes[trial] = self._start(trial, width, *spot)
        return changes


class DynamicFluid(Packer):
    """DynamicFluid (§6.4): on every event, re-fill widths from the work left (earlier
    groups first, later groups get what they leave), start waiting trials at the widest width
    that fits, and widen a running trial when that saves more than the rescale cost.

    Example (§6.4 with ``S = {2: 1.8, 4: 3.2}``: trial 0 widens to 4 GPUs at t = 4 h):
        >>> group = [Work(t, h, 3600.0) for t, h in enumerate([12, 4, 4])]
        >>> from elastune.planners.staging.profile import Profile
        >>> schedule = DynamicFluid(Profile.from_speeds({2: 1.8, 4: 3.2}), gpus=4).pack(group)
        >>> [(p.trial, p.width, round(p.start / 3600, 2), round(p.end / 3600, 2))
        ...  for p in schedule.rectangles]
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
                spot = self._occupancy.find(width)
                if spot is not None:
                    changes[trial] = self._start(trial, width, *spot)
                    break
        tallest_first = sorted(self._running, key=lambda t: (-(self._end(t)), t))
        for trial in tallest_first:
            run = self._running[trial]
            for width in reversed([w for w in placeable if run.width < w <= targets[trial]]):
                spot = self._occupancy.find(width, mover=trial)
                if spot is None:
                    continue
                work = self._work[trial]
                left = self._remaining(trial)
                saved = (
                    self._end(trial)
                    - self._now
                    - left * work.seconds_per_unit / self.profile.speed(width)
                )
                if saved > self.profile.overhead_s + EPS:
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
        >>> from elastune.planners.staging.profile import Profile
        >>> packer = StaticFluid(Profile.from_speeds({2: 1.8, 4: 3.2}), gpus=8, gpus_per_node=4)
        >>> group = [Work(t, 1, 3600.0) for t in range(9)]
        >>> packer.pack(group).makespan / 3600, round(best_rigid(packer, group).makespan / 3600, 2)
        (2.0, 1.56)
    """
    best = packer.pack(group)
    for width in packer._placeable():
        uniform = packer.pack(group, widths={x.trial: float(width) for x in group})
        if uniform.makespan < best.makespan - EPS:
            best = uniform
    return best
