"""The profile a job learns from its own segments while it runs (docs/algorithms.md §5.8),
for the re-planner (``elastune.planners.cost.inflight.replanner``).

:class:`ProfileEstimate` holds the profile the plan was made with (the prior) and the
segments measured since. Each segment gives the ratio of its measured seconds (less the
profile's ``overhead_s``, and ``trial_overhead_s`` on a trial's first) to the prior's
``resource x seconds per unit`` at its width; a width's ratio is the resource-weighted mean
of its segments' ratios, shrunk towards the pooled ratio of every width, and a width not
seen yet takes the pooled ratio (the pooled one is shrunk towards 1, the prior, the same
way). The shrinkage weighs by precision: a segment's ratio is off by the straggler spread,
the prior's by ``prior_error`` (0.5), so the prior counts for
``(spread / prior_error) ** 2`` segments: little against steady segments, more against
scattered ones. The straggler spread (``segment_cv``) is the pooled sd of the segments'
ratios around their width's ratio, mixed with the prior's spread by ``prior_weight``
pseudo-segments.

A decision inside a stage comes when as many of its segments have finished as its first
wave holds: the first to finish, the fast ones, while the slow ones still run. Read from
those alone, the speed is fast and the spread narrow (a spread of 0.4 read 0.84x for a true
1x, on average, in the re-planning benchmark). So :meth:`ProfileEstimate.censored` counts
each segment still running too, as it will likely end: its ratio exceeds what it has run
over its forecast, so it takes the normal's mean and variance above that bound (under the
estimate's ratio and spread, re-read with them a few times: expectation-maximisation for
data censored on the right). They move the ratio and the spread, not the unit time's
certainty, which counts the finished segments alone.

Example (the profile said 720 s per unit; eight segments on one GPU took twice that):
    >>> from elastune.planners.staging import Profile
    >>> prior = Profile.from_scaling(720, speedup={2: 1.8, 4: 3.2})
    >>> estimate = ProfileEstimate(prior)
    >>> for _ in range(8):
    ...     estimate.observe(1, 1.0, 1440.0)
    >>> round(estimate.ratio(1), 2), round(estimate.ratio(4), 2)
    (1.99, 1.89)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from elastune.planners.spec.covariance import SIZE
from elastune.planners.staging import Profile, Timing


@dataclass
class _Width:
    """Sums over the segments measured at one width."""

    measured: float = 0.0  # seconds of work (overhead removed)
    forecast: float = 0.0  # the prior's seconds for the same work
    ratios: list[float] = field(default_factory=list)
    censored: int = 0  # of the ratios, those of segments still running (expected)
    excess: float = 0.0  # their ratios' variances given what they have run


class Running(NamedTuple):
    """A segment still running: ``resource`` units on ``gpus`` GPUs, ``seconds`` run so
    far; ``first``: its trial's first."""

    gpus: float
    resource: float
    seconds: float
    first: bool = False


_ROUNDS = 5  # expectation-maximisation rounds of :meth:`ProfileEstimate.censored`


class ProfileEstimate:
    """The prior profile corrected by the job's measured segments (module docstring).

    Args:
        prior: The profile the plan was made with.
        prior_error: How far off the prior's speed may be, as a relative sd (0.5: by half
            either way): against a segment, whose ratio is off by the spread, the prior
            counts for ``(spread / prior_error) ** 2`` segments.
        prior_weight: How many segments the prior's straggler spread counts for.
    """

    def __init__(self, prior: Profile, prior_error: float = 0.5, prior_weight: float = 1.0):
        if not prior_error > 0:
            raise ValueError(f"prior_error must be > 0, got {prior_error}")
        if not prior_weight > 0:
            raise ValueError(f"prior_weight must be > 0, got {prior_weight}")
        self.prior = prior
        self.prior_error = prior_error
        self.prior_weight = prior_weight
        self._widths: dict[float, _Width] = {}

    @property
    def segments(self) -> int:
        """Segments measured so far (finished, not those counted as running)."""
        return sum(len(w.ratios) - w.censored for w in self._widths.values())

    def censored(self, running: Sequence[Running]) -> ProfileEstimate:
        """This estimate with the segments still ``running`` counted as they will likely
        end (module docstring); a new estimate each time, so the running ones are counted
        once, and replaced by what they measure once they finish."""
        out = self
        for _ in range(_ROUNDS if running else 0):
            guess = ProfileEstimate(self.prior, self.prior_error, self.prior_weight)
            guess._widths = {
                g: dataclasses.replace(w, ratios=list(w.ratios)) for g, w in self._widths.items()
            }
            for segment in running:
                guess._expect(segment, out.ratio(segment.gpus), out.spread())
            out = guess
        return out

    def _expect(self, segment: Running, ratio: float, spread: float) -> None:
        """``segment``, still running, as a ratio of its expected end given what it has run,
        the estimate's ``ratio`` and relative ``spread``."""
        forecast = segment.resource * self.prior.timing(segment.gpus).mean
        if not forecast > 0:
            return
        ran = max(segment.seconds - self.prior.segment_overhead(segment.first), 0.0)
        mean, variance = _above(ratio, spread * ratio, ran / forecast)
        width = self._widths.setdefault(float(segment.gpus), _Width())
        width.measured += mean * forecast
        width.forecast += forecast
        width.ratios.append(mean)
        width.censored += 1
        width.excess += variance

    def observe(self, gpus: float, resource: float, seconds: float, first: bool = False) -> None:
        """One finished segment: ``resource`` units on ``gpus`` GPUs took ``seconds``;
        ``first``: it was its trial's first."""
        if not resource > 0:
            return  # a segment that trains nothing says nothing about the speed
        forecast = resource * self.prior.timing(gpus).mean
        measured = max(seconds - self.prior.segment_overhead(first), 0.0)
        width = self._widths.setdefault(float(gpus), _Width())
        width.measured += measured
        width.forecast += forecast
        width.ratios.append(measured / forecast)

    def _shrunk(self, measured: float, forecast: float, count: int, towards: float) -> float:
        if count == 0:
            return towards
        weight = self.pseudo_segments()
        return (count * measured / forecast + weight * towards) / (count + weight)

    def pseudo_segments(self) -> float:
        """How many segments the prior's speed counts for: a segment's ratio is off by the
        spread, the prior's by ``prior_error`` (precision weights). Segments that do not
        scatter give no precision to weigh by: the prior counts for ``prior_weight``."""
        spread = self.spread()
        return (spread / self.prior_error) ** 2 if spread > 0 else self.prior_weight

    def pooled(self) -> float:
        """Measured over forecast seconds across every width, shrunk towards 1."""
        widths = self._widths.values()
        measured, forecast = sum(w.measured for w in widths), sum(w.forecast for w in widths)
        return self._shrunk(measured, forecast or 1.0, sum(len(w.ratios) for w in widths), 1.0)

    def ratio(self, gpus: float) -> float:
        """Seconds per unit at ``gpus`` GPUs relative to the prior (2.0: twice as slow)."""
        width = self._widths.get(float(gpus))
        if width is None:
            return self.pooled()
        return self._shrunk(width.measured, width.forecast, len(width.ratios), self.pooled())

    def spread(self) -> float:
        """Straggler spread: the segments' relative sd around their width's ratio."""
        squares, dof = self._squares()
        prior = self.prior.segment_cv
        if dof <= 0:
            return prior
        return math.sqrt((self.prior_weight * prior**2 + squares) / (self.prior_weight + dof))

    def spread_dof(self) -> float | None:
        """The degrees of freedom :meth:`spread` is read with: the segments' around their
        width's ratio and the prior's ``prior_weight``; the prior's own before any."""
        dof = self._squares()[1]
        return self.prior.segment_cv_dof if dof <= 0 else dof + self.prior_weight

    def _squares(self) -> tuple[float, int]:
        """The squared relative deviations of the segments around their width's ratio,
        and their degrees of freedom."""
        squares, dof = 0.0, 0
        for width in self._widths.values():
            mean = width.measured / width.forecast
            if mean <= 0:  # every segment ended within the overhead: no spread to measure
                continue
            squares += sum((r / mean - 1) ** 2 for r in width.ratios) + width.excess / mean**2
            dof += len(width.ratios) - 1
        return squares, dof

    def profile(self) -> Profile:
        """The prior with every width's timing scaled by its ratio and the measured spread
        (with the degrees of freedom it is read with, so that each simulated run draws a
        spread of its own around it: a few segments read a tail narrow as often as wide);
        once segments are measured, the error in the unit time is theirs to tell: the
        calibration's row of ``calibration_cov`` gives way to the pooled ratio's variance,
        ``spread ** 2 / (segments + pseudo_segments)`` (the overheads' errors stay), which
        the simulator draws once per run, so a plan made on a few segments keeps a margin
        for a speed they may have misread."""
        timings = {
            g: Timing(t.mean * self.ratio(g), t.sd * self.ratio(g))
            for g, t in self.prior.timings.items()
        }
        cov = self.prior.calibration_cov
        if self.segments:
            # The ratio's posterior variance: the prior's precision plus the segments'.
            cov = _with_unit_error(
                cov, self.spread() ** 2 / (self.segments + self.pseudo_segments())
            )
        return dataclasses.replace(
            self.prior,
            timings=timings,
            segment_cv=self.spread(),
            segment_cv_dof=self.spread_dof(),
            calibration_cov=cov,
        )


def _with_unit_error(
    cov: tuple[tuple[float, ...], ...] | None, variance: float
) -> tuple[tuple[float, ...], ...]:
    """``cov`` (None: no errors) with the unit time's error replaced by one of ``variance``,
    uncorrelated with the overheads' errors."""
    unit = SIZE - 1
    rows = [[0.0] * SIZE for _ in range(SIZE)] if cov is None else [list(row) for row in cov]
    for i in range(SIZE):
        rows[i][unit] = rows[unit][i] = 0.0
    rows[unit][unit] = variance
    return tuple(tuple(row) for row in rows)


def _above(mean: float, sd: float, bound: float) -> tuple[float, float]:
    """Mean and variance of a normal (``mean``, ``sd``) given it exceeds ``bound``."""
    if not sd > 0:
        return max(mean, bound), 0.0
    a = (bound - mean) / sd
    tail = 0.5 * math.erfc(a / math.sqrt(2))
    # The inverse Mills ratio; far in the tail, where the tail underflows, its asymptote.
    mills = a + 1 / a if tail <= 0 else math.exp(-a * a / 2) / math.sqrt(2 * math.pi) / tail
    return mean + sd * mills, sd * sd * max(1 + a * mills - mills * mills, 0.0)
