"""Syne Tune's multi-fidelity schedulers (D. Salinas, M. Seeger, A. Klein, V. Perrone,
M. Wistuba, C. Archambeau, "Syne Tune: A Library for Large Scale Hyperparameter Tuning and
Reproducible Research", AutoML Conf 2022), through its own ``syne_tune`` package: ``ASHA``
(random configurations) and ``BOHB`` (ASHA with its kernel-density searcher), the
multi-fidelity baselines Syne Tune 0.16 ships. They are driven as Syne Tune's own Tuner
drives them: ``suggest()`` then ``on_trial_add(trial)`` for a new trial, one
``on_trial_result`` per epoch (``CONTINUE`` or ``STOP``), ``on_trial_complete`` at the
top fidelity. Its ASHA is stopping-type: a trial trains on without pausing, so nothing is
trained twice. Rungs at 1, 3, 9 and 27 epochs (``grace_period=1``, ``reduction_factor=3``).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

METRIC, TIME = "error", "epoch"
LEVELS = (1, 3, 9, 27)  # the rungs; the adapter adds the top fidelity


def syne_tune_space(space: Mapping[str, BaseDistribution]) -> dict[str, Any]:
    """The space as Syne Tune's ``config_space`` domains."""
    from syne_tune import config_space as st

    result: dict[str, Any] = {}
    for name, d in space.items():
        if isinstance(d, FloatDistribution):
            result[name] = (st.loguniform if d.log else st.uniform)(d.low, d.high)
        elif isinstance(d, IntDistribution):
            result[name] = (st.lograndint if d.log else st.randint)(d.low, d.high)
        elif isinstance(d, CategoricalDistribution):
            result[name] = st.choice(list(d.choices))
        else:
            raise ValueError(f"space.{name}: no Syne Tune counterpart for {d!r}")
    return result


class SyneTunePeer:
    """One of Syne Tune's baselines (``ASHA`` or ``BOHB``), minimising the error per epoch."""

    def __init__(
        self, name: str, space: Mapping[str, BaseDistribution], max_epochs: int, seed: int
    ):
        from syne_tune.optimizer import baselines

        self._trial_class = _trial_class()
        self._continue = "CONTINUE"
        self.scheduler = getattr(baselines, name)(
            syne_tune_space(space),
            metric=METRIC,
            time_attr=TIME,
            max_t=max_epochs,
            do_minimize=True,
            random_seed=seed,
            grace_period=1,
            reduction_factor=3,
        )
        self._next_id = 0

    def start(self) -> tuple[Mapping[str, Any], Any]:
        suggestion = self.scheduler.suggest()
        trial = self._trial_class(self._next_id, suggestion.config, datetime.datetime.now())
        self._next_id += 1
        self.scheduler.on_trial_add(trial)
        return dict(suggestion.config), trial

    def report(self, token: Any, epoch: int, error: float) -> bool:
        decision = self.scheduler.on_trial_result(token, {METRIC: error, TIME: epoch})
        return decision == self._continue

    def complete(self, token: Any, epoch: int, error: float) -> None:
        result = {METRIC: error, TIME: epoch}
        self.scheduler.on_trial_result(token, result)
        self.scheduler.on_trial_complete(token, result)

    def close(self) -> None:
        """Nothing to release: Syne Tune's schedulers keep everything in memory."""


def _trial_class() -> type:
    from syne_tune.backend.trial_status import Trial

    return Trial
