"""The search space as Optuna distributions, and Optuna samplers by name.

Example:
    >>> from elastune.planners.spec import parse_job
    >>> spec = parse_job({"name": "d", "trainable": "m:f", "metric": "acc",
    ...                   "space": {"width": {"type": "int", "low": 8, "high": 128, "log": True}}})
    >>> distributions(spec)["width"]
    IntDistribution(high=128, log=True, low=8, step=1)
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import numpy as np
import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from elastune.planners.samplers import MultiFidelityTpeSampler
from elastune.planners.spec.model import CategoricalParam, FloatParam, JobSpec, SpecError

_SAMPLERS: dict[str, type[optuna.samplers.BaseSampler]] = {
    "mf-tpe": MultiFidelityTpeSampler,
    "tpe": optuna.samplers.TPESampler,
    "random": optuna.samplers.RandomSampler,
    "cmaes": optuna.samplers.CmaEsSampler,
    "gp": optuna.samplers.GPSampler,
    "qmc": optuna.samplers.QMCSampler,
    "grid": optuna.samplers.GridSampler,
}


def distributions(spec: JobSpec) -> dict[str, BaseDistribution]:
    out: dict[str, BaseDistribution] = {}
    for name, param in spec.space.items():
        if isinstance(param, FloatParam):
            out[name] = FloatDistribution(param.low, param.high, log=param.log, step=param.step)
        elif isinstance(param, CategoricalParam):
            out[name] = CategoricalDistribution(param.choices)
        else:
            out[name] = IntDistribution(param.low, param.high, log=param.log, step=param.step)
    return out


def contains(spec: JobSpec, config: dict[str, Any]) -> bool:
    """Is ``config`` a point of the job's space (same names, values within bounds)?

    Warm starts enqueue last night's best configurations; a space that changed since may
    no longer hold them.
    """
    if set(config) != set(spec.space):
        return False
    for name, param in spec.space.items():
        value = config[name]
        if isinstance(param, CategoricalParam):
            if value not in param.choices:
                return False
        elif not param.low <= value <= param.high:
            return False
    return True


def grid(spec: JobSpec) -> dict[str, list[Any]]:
    """Every value of every parameter; floats need a ``step`` to have a finite grid."""
    values: dict[str, list[Any]] = {}
    for name, param in spec.space.items():
        if isinstance(param, CategoricalParam):
            values[name] = list(param.choices)
        elif isinstance(param, FloatParam):
            if param.step is None:
                raise SpecError(f"space.{name}: sampler grid needs a step for float parameters")
            count = round((param.high - param.low) / param.step) + 1
            top = param.low + (count - 1) * param.step
            values[name] = [float(v) for v in np.linspace(param.low, top, count)]
        else:
            values[name] = list(range(param.low, param.high + 1, param.step))
    return values


def check_sampler(spec: JobSpec) -> None:
    """Reject sampler options the named Optuna sampler does not take, or whose values it
    refuses: the sampler is built once here (milliseconds), before any store exists."""
    cls = _SAMPLERS[spec.sampler.name]
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "seed", "search_space"}
    for option in spec.sampler.options:
        if option not in accepted:
            raise SpecError(
                f"sampler.{option}: not an option of {cls.__name__} "
                f"(accepted: {', '.join(sorted(accepted))})"
            )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # experimental samplers say so at every build
            make_sampler(spec)
    except SpecError:
        raise  # grid's own, naming the parameter
    except (TypeError, ValueError) as exc:
        names = ", ".join(f"sampler.{o}" for o in spec.sampler.options) or "sampler"
        raise SpecError(f"{names}: refused by {cls.__name__}: {exc}") from None


def make_sampler(spec: JobSpec, seed: int | None = None) -> optuna.samplers.BaseSampler:
    """The job's sampler; ``seed`` overrides ``sampler.seed`` (simulations draw one per run)."""
    cls = _SAMPLERS[spec.sampler.name]
    kwargs = dict(spec.sampler.options)
    kwargs["seed"] = spec.sampler.seed if seed is None else seed
    if spec.sampler.name == "grid":
        return cls(grid(spec), **kwargs)
    if spec.sampler.name == "cmaes" and any(
        isinstance(p, CategoricalParam) for p in spec.space.values()
    ):
        # CMA-ES models only numbers; categoricals fall back to random sampling quietly.
        kwargs.setdefault("warn_independent_sampling", False)
    return cls(**kwargs)
