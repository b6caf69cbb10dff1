"""DEHB (N. Awad, N. Mallik, F. Hutter, "DEHB: Evolutionary Hyperband for Scalable, Robust
and Efficient Hyperparameter Optimization", IJCAI 2021), through its own ``dehb`` package:
``DEHB.ask()`` gives a configuration and a fidelity, ``DEHB.tell(job_info, {"fitness",
"cost"})`` its result. DEHB evaluates each fidelity from scratch (no checkpoints), so a
promoted configuration is trained again from epoch 0. Fidelities are Hyperband's
(``max / eta**k``, ``eta = 3``), rounded to whole epochs for training.

One process drives it (``n_workers=1``: no Dask cluster); asking again before the results
are back is what DEHB's asynchronous ask/tell is for. Its log and state files go to a
temporary folder, removed by :meth:`DehbPeer.close`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from typing import Any

from optuna.distributions import BaseDistribution

from benchmarks.peers.adapters import Ask
from benchmarks.peers.configspace import configuration_space, plain


class DehbPeer:
    """DEHB with its defaults, for a space of Optuna distributions, fidelity in epochs."""

    def __init__(self, space: Mapping[str, BaseDistribution], max_epochs: int, seed: int):
        from dehb import DEHB
        from loguru import logger

        self._folder = tempfile.TemporaryDirectory(prefix="dehb-")
        cs = configuration_space(space, seed)
        self.dehb = DEHB(
            cs=cs,
            dimensions=len(cs),
            min_fidelity=1,
            max_fidelity=max_epochs,
            eta=3,
            n_workers=1,
            seed=seed,
            output_path=self._folder.name,
            save_freq="end",  # its state is written by run(), which we do not call
        )
        logger.remove()  # DEHB's sinks (a file per instance, and stderr) add up in a loop

    def ask(self) -> Ask:
        job = self.dehb.ask()
        return Ask(plain(job["config"]), round(job["fidelity"]), job)

    def tell(self, token: Any, error: float, seconds: float) -> None:
        self.dehb.tell(token, {"fitness": error, "cost": seconds})

    def close(self) -> None:
        self._folder.cleanup()
