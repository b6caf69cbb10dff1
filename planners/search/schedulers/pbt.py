"""Population-based training (docs/algorithms.md §7.3), asynchronous like Ray Tune's default.

A fixed population trains in segments of ``perturbation_interval``. When a member finishes
a segment, the live members that have reported are ranked by their latest loss. A member in
the bottom ``quantile_fraction`` *exploits* a random member of the top one: its next segment
copies the donor's checkpoint (``clone_from``) and resumes from the donor's resource with the
donor's configuration, *explored*: each parameter is resampled with
``resample_probability``, otherwise scaled by 1.2 or 0.8 (a choice moves to a neighbour).
Everyone else simply continues. A member that reaches ``max_resource`` is complete.

PBT draws its initial population itself (uniformly over the job's distributions, seeded)
and sets ``Segment.config`` on every segment that changes a configuration, because it must
know each member's configuration to perturb it. It needs checkpoints: exploiting is copying
one.

Example:
    >>> from optuna.distributions import FloatDistribution
    >>> pbt = Pbt({"lr": FloatDistribution(1e-3, 1.0, log=True)}, max_resource=6,
    ...           perturbation_interval=2, population_size=4, seed=0)
    >>> jobs = [pbt.next_segment() for _ in range(4)]
    >>> [(j.trial, j.start, j.stop) for j in jobs]
    [(0, 0, 2), (1, 0, 2), (2, 0, 2), (3, 0, 2)]
    >>> for trial, loss in [(3, 0.9), (2, 0.6), (1, 0.5), (0, 0.1)]:
    ...     _ = pbt.on_result(Result(trial, 2, loss))      # trial 3 was alone: it continues
    >>> [(j.trial, j.start, j.clone_from) for j in [pbt.next_segment() for _ in range(4)]]
    [(3, 2, None), (2, 2, None), (1, 2, None), (0, 2, None)]
    >>> _ = pbt.on_result(Result(3, 4, 0.8))               # still the worst: exploit trial 0
    >>> job = pbt.next_segment()
    >>> (job.trial, job.start, job.stop, job.clone_from), job.config != jobs[0].config
    ((3, 2, 4, 0), True)
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution

from elastune.planners.search.explore import draw, explore
from elastune.planners.search.schedulers.base import (
    Action,
    Decision,
    Result,
    Scheduler,
    Segment,
    ranked,
)


class Pbt(Scheduler):
    """Asynchronous PBT over a population of ``population_size`` trials.

    Args:
        distributions: The job's search space (:func:`elastune.planners.spec.space.distributions`).
        max_resource: Resource every member is trained to.
        perturbation_interval: Resource per segment; exploit/explore is considered after each.
        population_size: Members, at least 2.
        quantile_fraction: Share of the ranked population that is "bottom" and "top",
            in (0, 0.5].
        resample_probability: Chance, per parameter, to resample instead of perturbing.
        seed: Seed of the initial population, the donor choice and the perturbations.
    """

    def __init__(
        self,
        distributions: Mapping[str, BaseDistribution],
        max_resource: float,
        perturbation_interval: float,
        population_size: int = 8,
        quantile_fraction: float = 0.25,
        resample_probability: float = 0.25,
        seed: int = 0,
    ):
        if not distributions:
            raise ValueError("distributions must name at least one parameter to explore")
        if not 0 < perturbation_interval <= max_resource:
            raise ValueError(
                f"perturbation_interval must lie in (0, max_resource={max_resource}], "
                f"got {perturbation_interval}"
            )
        if population_size < 2:
            raise ValueError(f"population_size must be >= 2, got {population_size}")
        if not 0 < quantile_fraction <= 0.5:
            raise ValueError(f"quantile_fraction must lie in (0, 0.5], got {quantile_fraction}")
        if not 0 <= resample_probability <= 1:
            raise ValueError(f"resample_probability must lie in [0, 1], got {resample_probability}")
        self.distributions = dict(distributions)
        self.max_resource = max_resource
        self.interval = perturbation_interval
        self.quantile_fraction = quantile_fraction
        self.resample_probability = resample_probability
        self._rng = np.random.default_rng(seed)
        self.configs: dict[int, dict[str, Any]] = {
            trial: {name: draw(d, self._rng) for name, d in self.distributions.items()}
            for trial in range(population_size)
        }
        self._latest: dict[int, tuple[float, float]] = {}  # live member -> (resource, loss)
        self._ready: deque[Segment] = deque(
            Segment(trial, 0, self._stop(0), 0, config=config)
            for trial, config in self.configs.items()
        )
        self._segments: dict[int, int] = dict.fromkeys(self.configs, 0)

    def _stop(self, start: float) -> float:
        return min(self.max_resource, start + self.interval)

    def next_segment(self) -> Segment | None:
        return self._ready.popleft() if self._ready else None

    def on_result(self, result: Result) -> list[Decision]:
        trial = result.trial
        count = self._segments[trial]
        self._segments[trial] = count + 1
        if result.failed:
            self._latest.pop(trial, None)  # a failed member is no donor
            return [Decision(trial, Action.FAIL, count)]
        if result.resource >= self.max_resource - 1e-9:
            self._latest.pop(trial, None)  # its checkpoint has nothing left to train
            return [Decision(trial, Action.COMPLETE, count)]
        self._latest[trial] = (result.resource, result.loss)
        self._ready.append(self._next_segment(trial, result.resource, count + 1))
        return [Decision(trial, Action.PROMOTE, count)]

    def _next_segment(self, trial: int, resource: float, rung: int) -> Segment:
        order = ranked({t: loss for t, (_, loss) in self._latest.items()})
        # Ray's quantile size: ceil(n * q), at most half so the top and bottom never overlap.
        size = min(math.ceil(len(order) * self.quantile_fraction), len(order) // 2)
        if size and trial in order[len(order) - size :]:
            donor = order[int(self._rng.integers(size))]
            start = self._latest[donor][0]
            config = explore(
                self.configs[donor], self.distributions, self._rng, self.resample_probability
            )
            self.configs[trial] = config
            return Segment(trial, start, self._stop(start), rung, config=config, clone_from=donor)
        return Segment(trial, resource, self._stop(resource), rung)
