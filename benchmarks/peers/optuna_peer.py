"""Optuna's TPE sampler with its Hyperband pruner (T. Akiba, S. Sano, T. Yanase, T. Ohta,
M. Koyama, "Optuna: A Next-generation Hyperparameter Optimization Framework", KDD 2019;
L. Li et al., "Hyperband", JMLR 2018), as a user writes it: one study with
``TPESampler(seed=...)`` and ``HyperbandPruner()`` (their defaults: ``min_resource=1``,
``reduction_factor=3``), ``study.ask()`` for a new trial, ``trial.report(error, epoch)`` for
every epoch and ``trial.should_prune()`` at the rungs, ``study.tell`` at the end. Pruning is
stopping-type: a trial trains on until it is pruned, so nothing is trained twice. The
pruner's rungs for 52 epochs lie at 1, 3, 9 and 27 in each of its brackets, so asking at
those epochs is asking at every one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import TrialState

LEVELS = (1, 3, 9, 27)


class OptunaPeer:
    """A study with TPE and Hyperband pruning, minimising the error per epoch."""

    def __init__(self, space: Mapping[str, BaseDistribution], max_epochs: int, seed: int):
        self.space = dict(space)
        self.study = optuna.create_study(
            study_name=f"tpe-hyperband-{seed}",  # the pruner hashes it to pick brackets
            sampler=optuna.samplers.TPESampler(seed=seed),
            pruner=optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max_epochs),
        )

    def start(self) -> tuple[Mapping[str, Any], Any]:
        trial = self.study.ask(self.space)
        return dict(trial.params), trial

    def report(self, token: Any, epoch: int, error: float) -> bool:
        token.report(error, epoch)
        if epoch not in LEVELS or not token.should_prune():
            return True
        self.study.tell(token, state=TrialState.PRUNED)
        return False

    def complete(self, token: Any, epoch: int, error: float) -> None:
        token.report(error, epoch)
        self.study.tell(token, error)

    def close(self) -> None:
        """Nothing to release: the study is in memory."""
