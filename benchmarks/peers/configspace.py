"""The job's search space, as the ConfigSpace that DEHB and SMAC3 search (both use the
``ConfigSpace`` package), built from the job's Optuna distributions.

Example:
    >>> from optuna.distributions import FloatDistribution, IntDistribution
    >>> space = configuration_space(
    ...     {"lr": FloatDistribution(1e-4, 0.1, log=True), "layers": IntDistribution(1, 5)}, seed=0)
    >>> sorted(space.keys())
    ['layers', 'lr']
    >>> plain(space.sample_configuration())["layers"] in range(1, 6)
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ConfigSpace import Categorical, Configuration, ConfigurationSpace, Float, Integer
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)


def configuration_space(space: Mapping[str, BaseDistribution], seed: int) -> ConfigurationSpace:
    """A ConfigurationSpace with one hyperparameter per distribution, same bounds and scale."""
    result = ConfigurationSpace(seed=seed)
    for name, d in space.items():
        if isinstance(d, FloatDistribution):
            result.add(Float(name, (d.low, d.high), log=d.log))
        elif isinstance(d, IntDistribution):
            result.add(Integer(name, (d.low, d.high), log=d.log))
        elif isinstance(d, CategoricalDistribution):
            result.add(Categorical(name, list(d.choices)))
        else:
            raise ValueError(f"space.{name}: no ConfigSpace counterpart for {d!r}")
    return result


def plain(config: Configuration | Mapping[str, Any]) -> dict[str, Any]:
    """A configuration's values as plain Python numbers (ConfigSpace hands numpy ones)."""
    return {k: v.item() if hasattr(v, "item") else v for k, v in dict(config).items()}
