"""Baselines that the benchmarks compare elastune's schedulers against; not part of the
product: ``Repeat`` (a finite scheduler started again whenever workers idle),
``PrunerScheduler`` (any Optuna pruner as a stopping-type scheduler), ``StoppingAsha``
(ASHA as Ray Tune and Syne Tune run it) and ``OneEpoch`` (train every configuration one
epoch, keep the best few).

Example:
    >>> asha = StoppingAsha(1, 9, eta=3)
    >>> asha.levels
    [1, 3, 9]
"""

from benchmarks.baselines.one_epoch import OneEpoch
from benchmarks.baselines.optuna_pruner import PrunerScheduler
from benchmarks.baselines.repeat import Repeat
from benchmarks.baselines.stopping_asha import StoppingAsha

__all__ = ["OneEpoch", "PrunerScheduler", "Repeat", "StoppingAsha"]
