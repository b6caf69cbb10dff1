"""SMAC3's multi-fidelity facade with its Hyperband intensifier (M. Lindauer et al.,
"SMAC3: A Versatile Bayesian Optimization Package for Hyperparameter Optimization", JMLR
2022), through its own ``smac`` package: ``smac.ask()`` gives a ``TrialInfo`` (a
configuration and a budget), ``smac.tell(info, TrialValue(cost=...))`` its result. As in
DEHB, every budget is evaluated from scratch, so a configuration the intensifier promotes is
trained again from epoch 0. Budgets are Hyperband's (``max / eta**k``, ``eta = 3``, from a
minimum of one epoch), rounded to whole epochs for training.

Everything is SMAC's default for the facade (random forest on log costs, expected
improvement, its random initial design) but one runtime setting: the forest's trees are fit
and queried in this process (joblib's sequential backend), since joblib's default threads
spent half of SMAC's time waiting on this 2-core machine. Its files go to a temporary
folder, removed by :meth:`SmacPeer.close`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from typing import Any

from optuna.distributions import BaseDistribution

from benchmarks.peers.adapters import Ask
from benchmarks.peers.configspace import configuration_space, plain


class SmacPeer:
    """SMAC3's ``MultiFidelityFacade`` with ``Hyperband``, fidelity in epochs."""

    def __init__(self, space: Mapping[str, BaseDistribution], max_epochs: int, seed: int):
        from smac import MultiFidelityFacade, Scenario
        from smac.runhistory.dataclasses import TrialValue

        self._value = TrialValue
        self._folder = tempfile.TemporaryDirectory(prefix="smac-")
        scenario = Scenario(
            configuration_space(space, seed),
            deterministic=True,
            n_trials=10**9,  # the simulated deadline ends the run, not SMAC
            min_budget=1,
            max_budget=max_epochs,
            seed=seed,
            output_directory=self._folder.name,
        )
        intensifier = MultiFidelityFacade.get_intensifier(scenario, eta=3)
        self.smac = MultiFidelityFacade(
            scenario,
            _never_called,
            intensifier=intensifier,
            overwrite=True,
            logging_level=40,
        )

    def ask(self) -> Ask:
        with _sequential():
            info = self.smac.ask()
        return Ask(plain(info.config), round(info.budget), info)

    def tell(self, token: Any, error: float, seconds: float) -> None:
        with _sequential():
            self.smac.tell(token, self._value(cost=error, time=seconds))

    def close(self) -> None:
        self._folder.cleanup()


def _sequential() -> Any:
    """A fresh context each time: joblib's applies its setting when it is made."""
    import joblib

    return joblib.parallel_config(backend="sequential")


def _never_called(config: Any, seed: int = 0, budget: float = 0) -> float:
    """SMAC's facade wants a target function; ask/tell never calls it."""
    raise AssertionError("SMAC is driven by ask/tell here")
