"""Draw and perturb values of Optuna distributions with a seeded numpy generator.

PBT explores by resampling or nudging a donor's configuration (docs/algorithms.md §7.3), and
the simulator's fast path draws configurations without an Optuna study; both work on the
job's own distributions (:func:`elastune.planners.spec.space.distributions`), so bounds, log scales,
steps and choices are honoured in one place.

Example:
    >>> import numpy as np
    >>> from optuna.distributions import CategoricalDistribution, IntDistribution
    >>> rng = np.random.default_rng(0)
    >>> width = IntDistribution(8, 128, log=True)
    >>> 8 <= draw(width, rng) <= 128
    True
    >>> perturb(CategoricalDistribution(["sgd", "adam", "lamb"]), "adam", rng) in ("sgd", "lamb")
    True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

# Ray Tune's PBT multiplies a continuous value by one of these (§7.3).
FACTORS = (1.2, 0.8)


def draw(distribution: BaseDistribution, rng: np.random.Generator) -> Any:
    """One value drawn uniformly (log-uniformly for ``log=True``) from ``distribution``."""
    if isinstance(distribution, CategoricalDistribution):
        return distribution.choices[int(rng.integers(len(distribution.choices)))]
    if isinstance(distribution, IntDistribution):
        if distribution.log:
            # Widen by half a unit each side so the end points are as likely as the rest.
            low, high = math.log(distribution.low - 0.5), math.log(distribution.high + 0.5)
            return _clip(distribution, round(math.exp(rng.uniform(low, high))))
        count = (distribution.high - distribution.low) // distribution.step + 1
        return distribution.low + distribution.step * int(rng.integers(count))
    if isinstance(distribution, FloatDistribution):
        if distribution.log:
            low, high = math.log(distribution.low), math.log(distribution.high)
            return _clip(distribution, math.exp(rng.uniform(low, high)))
        if distribution.step is not None:
            count = round((distribution.high - distribution.low) / distribution.step) + 1
            return _clip(distribution, distribution.low + distribution.step * rng.integers(count))
        return float(rng.uniform(distribution.low, distribution.high))
    raise TypeError(f"cannot draw from {type(distribution).__name__}")


def perturb(distribution: BaseDistribution, value: Any, rng: np.random.Generator) -> Any:
    """Nudge ``value``: a number is scaled by 1.2 or 0.8, a choice moves to a neighbour."""
    if isinstance(distribution, CategoricalDistribution):
        choices = distribution.choices
        if len(choices) == 1:
            return value
        index = choices.index(value) + int(rng.choice((-1, 1)))
        # Reflect at the ends so a perturbation always changes the value.
        if not 0 <= index < len(choices):
            index = choices.index(value) - (index - choices.index(value))
        return choices[index]
    factor = float(rng.choice(FACTORS))
    if isinstance(distribution, IntDistribution):
        scaled = round(value * factor)
        if scaled == value:  # 1 * 1.2 rounds back to 1: move one step instead
            scaled = value + (distribution.step if factor > 1 else -distribution.step)
        return _clip(distribution, scaled)
    if isinstance(distribution, FloatDistribution):
        return _clip(distribution, value * factor)
    raise TypeError(f"cannot perturb {type(distribution).__name__}")


def explore(
    config: Mapping[str, Any],
    distributions: Mapping[str, BaseDistribution],
    rng: np.random.Generator,
    resample_probability: float,
) -> dict[str, Any]:
    """PBT's explore step: resample each parameter with ``resample_probability``, else perturb."""
    return {
        name: draw(dist, rng)
        if rng.random() < resample_probability
        else perturb(dist, config[name], rng)
        for name, dist in distributions.items()
    }


def _clip(distribution: IntDistribution | FloatDistribution, value: float) -> Any:
    """Clamp into the bounds and snap to the step grid, keeping ints as ints."""
    low, high, step = distribution.low, distribution.high, distribution.step
    if step is not None:
        value = low + round((value - low) / step) * step
    value = min(max(value, low), high)
    return int(value) if isinstance(distribution, IntDistribution) else float(value)
