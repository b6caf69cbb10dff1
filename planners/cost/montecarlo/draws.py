"""Common random numbers: every candidate plan is priced on the same random draws.

Draws are kept per stream, keyed by (bracket, rung, purpose) and the seed, so plans that
differ in one stage see the same stragglers, startup delays and spot lifetimes everywhere
else, and their difference in JCT or cost is the plans' own, not the dice's.

Example (a plan with one more node sees the same draws for the nodes it shares):
    >>> draws = Draws(seed=0, samples=3)
    >>> two, five = draws.normals(0, 1, DURATION, 2), draws.normals(0, 1, DURATION, 5)
    >>> two.shape, five.shape, bool((five[:, :2] == two).all())
    ((3, 2), (3, 5), True)
    >>> bool((Draws(seed=1, samples=3).normals(0, 1, DURATION, 2) == two).all())
    False

A run's own draws (its overhead, its speed, the calibration's error) are normal where the
profile's spreads are known, and Student-t where they were estimated (``dof``): a band made
from a few repeats widens by what the estimate does not know.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from elastune.planners.cost.montecarlo.nodes import Array
from elastune.planners.cost.pricing.allocation import StagePlan
from elastune.planners.cost.pricing.catalog import InstanceType

# What each stream is for (its purpose).
DURATION, QUEUE, STARTUP, LIFETIME = 0, 1, 2, 3
HELD = 4  # lifetimes of the spot nodes a chain already holds when it is simulated
JOB = 5  # the job's own overhead, one per sample (keyed on bracket 0, for every chain)
RUN = 6  # the run's speed, one per sample (keyed on bracket 0, for every chain)
FIT = 7  # the calibration's error in the profile, one per sample (bracket 0, every chain)
SPOT = 8  # replacement round r of a stage: SPOT + 8r + 0..3 (busy) and + 4..6 (idle)
RUNNING = SPOT + 7  # segments running on held nodes (a purpose SPOT's rounds leave free)


class Draws:
    """Random draws per stream, ``samples`` per column (see the module docstring)."""

    def __init__(self, seed: int, samples: int, dof: float | None = None):
        self.seed = seed
        self.samples = samples
        self._draws: dict[tuple[int, int, int], Array] = {}
        self.scale = np.ones(samples) if dof is None else self._scale(max(1, round(dof)))

    def _scale(self, dof: int, rung: int = 1) -> Array:
        """``sqrt(dof / chi2(dof))`` per sample: the run-to-run spreads were estimated with
        ``dof`` degrees of freedom, so a run's own draws, scaled by it, are Student-t."""
        chi2 = (self.normals(0, rung, RUN, dof) ** 2).sum(axis=1)
        return np.sqrt(dof / chi2)

    def spread(self, dof: float | None) -> Array | None:
        """The factor on the straggler spread per sample (S x 1) where it was read with
        ``dof`` degrees of freedom: each run its own spread, so that a tail a few segments
        read narrow is still drawn; None where the spread is taken as exact."""
        return None if dof is None else self._scale(max(1, round(dof)), rung=2)[:, None]

    def normals(self, bracket: int, rung: int, purpose: int, columns: int) -> Array:
        """``samples x columns`` standard normals, fixed per (bracket, rung, purpose).

        Drawn column by column, so asking for more columns keeps the first ones: a plan
        with one more node sees the same startup draws for the nodes it shares.
        """
        return self._draw(bracket, rung, purpose, columns, uniform=False)

    def uniforms(self, bracket: int, rung: int, purpose: int, columns: int) -> Array:
        """``samples x columns`` uniforms on [0, 1), kept like :meth:`normals`."""
        return self._draw(bracket, rung, purpose, columns, uniform=True)

    def _draw(self, bracket: int, rung: int, purpose: int, columns: int, uniform: bool) -> Array:
        key = (bracket, rung, purpose)
        draws = self._draws.get(key)
        if draws is None or draws.shape[1] < columns:
            rng = np.random.default_rng([self.seed, bracket, rung, purpose])
            size = max(columns, 2 * (0 if draws is None else draws.shape[1]))
            shape = (size, self.samples)
            draws = rng.random(shape) if uniform else rng.standard_normal(shape)
            draws = self._draws[key] = draws.T
        return draws[:, :columns]

    def job(self, mean: float, sd: float, shift: Array | None = None) -> Array:
        """The job's own overhead per sample (S): one draw for every chain of the job; a
        calibration error ``shift`` (per sample) moves the mean before the cut at 0."""
        overhead = mean + sd * self.scale * self.normals(0, 0, JOB, 1)[:, 0]
        return np.maximum(overhead if shift is None else overhead + shift, 0.0)

    def speed(self, cv: float) -> Array:
        """The run's time factor per sample (S x 1): one draw for every segment of every chain."""
        return np.maximum(1.0 + cv * self.scale[:, None] * self.normals(0, 0, RUN, 1), 0.1)

    def fit(self, cov: Sequence[Sequence[float]]) -> Array:
        """Errors with covariance ``cov`` per sample (S x len(cov)): one draw for the run."""
        values, vectors = np.linalg.eigh(np.asarray(cov, dtype=float))
        root = vectors * np.sqrt(np.clip(values, 0.0, None))  # root @ root.T == cov
        return (self.normals(0, 0, FIT, len(values)) @ root.T) * self.scale[:, None]

    def delays(
        self, instance: InstanceType, stage: StagePlan, purposes: tuple[int, int], columns: int
    ) -> Array:
        """Queueing plus startup of ``columns`` new instances (S x columns)."""
        z_queue = self.normals(stage.bracket, stage.rung, purposes[0], columns)
        z_start = self.normals(stage.bracket, stage.rung, purposes[1], columns)
        return instance.queueing.sample(z_queue) + instance.startup.sample(z_start)

    def lifetimes(self, stage: StagePlan, purpose: int, columns: int, rate: float) -> Array:
        """Running time of ``columns`` spot instances until interrupted: exponential."""
        return -np.log1p(-self.uniforms(stage.bracket, stage.rung, purpose, columns)) / rate
