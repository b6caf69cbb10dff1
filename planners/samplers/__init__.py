"""Optuna samplers of elastune's own; the job file names them next to Optuna's
(:mod:`elastune.planners.spec.space`). ``mftpe``: multi-fidelity TPE, which learns from every rung.

Example:
    >>> import optuna
    >>> from optuna.distributions import FloatDistribution
    >>> optuna.logging.set_verbosity(optuna.logging.WARNING)
    >>> study = optuna.create_study(sampler=MultiFidelityTpeSampler(seed=0))
    >>> 0 <= study.ask({"x": FloatDistribution(0, 1)}).params["x"] <= 1
    True
"""

from elastune.planners.samplers.mftpe import MultiFidelityTpeSampler

__all__ = ["MultiFidelityTpeSampler"]
