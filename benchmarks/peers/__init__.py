"""The peers ``benchmarks/tuners.py`` runs against elastune's default, each through its own
library, as elastune schedulers on the simulated clock (:mod:`benchmarks.peers.adapters`).

A peer's library is imported only when the peer is built, so the harness runs whichever
peers are installed (``pip install -e '.[bench]'`` installs them all); :func:`missing` says
why one cannot run. ``UNAVAILABLE`` lists the peers that cannot run here at all, and why.

Example:
    >>> PEERS["DEHB"].library, PEERS["one epoch, top 3"].library
    ('dehb', None)
    >>> missing(PEERS["one epoch, top 3"]) is None
    True
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from optuna.distributions import BaseDistribution

from benchmarks.baselines.one_epoch import OneEpoch
from benchmarks.peers.adapters import Continuing, Restarting
from elastune.planners.search import Scheduler

Error = Callable[[float], float]
Built = tuple[Scheduler, Callable[[], None]]  # the scheduler, and what releases its files


@dataclass(frozen=True)
class Peer:
    """A tuner to run against the default: ``build(space, max_epochs, seed, error)``."""

    library: str | None  # its package's import name; None: a baseline of ours
    build: Callable[[Mapping[str, BaseDistribution], int, int, Error], Built]


def _dehb(space: Mapping[str, BaseDistribution], epochs: int, seed: int, error: Error) -> Built:
    from benchmarks.peers.dehb_peer import DehbPeer

    peer = DehbPeer(space, epochs, seed)
    return Restarting(peer, epochs, error), peer.close


def _smac(space: Mapping[str, BaseDistribution], epochs: int, seed: int, error: Error) -> Built:
    from benchmarks.peers.smac_peer import SmacPeer

    peer = SmacPeer(space, epochs, seed)
    return Restarting(peer, epochs, error), peer.close


def _syne_tune(name: str) -> Callable[[Mapping[str, BaseDistribution], int, int, Error], Built]:
    def build(space: Mapping[str, BaseDistribution], epochs: int, seed: int, error: Error) -> Built:
        from benchmarks.peers.syne_tune_peer import LEVELS, SyneTunePeer

        peer = SyneTunePeer(name, space, epochs, seed)
        return Continuing(peer, [*LEVELS, epochs], error), peer.close

    return build


def _optuna(space: Mapping[str, BaseDistribution], epochs: int, seed: int, error: Error) -> Built:
    from benchmarks.peers.optuna_peer import LEVELS, OptunaPeer

    peer = OptunaPeer(space, epochs, seed)
    return Continuing(peer, [*LEVELS, epochs], error), peer.close


def _one_epoch(
    space: Mapping[str, BaseDistribution], epochs: int, seed: int, error: Error
) -> Built:
    return OneEpoch(epochs, screen=100, keep=3), lambda: None


PEERS: dict[str, Peer] = {
    "Optuna TPE + HyperbandPruner": Peer("optuna", _optuna),
    "SMAC3 MF facade (Hyperband)": Peer("smac", _smac),
    "DEHB": Peer("dehb", _dehb),
    "Syne Tune BOHB": Peer("syne_tune", _syne_tune("BOHB")),
    "Syne Tune ASHA": Peer("syne_tune", _syne_tune("ASHA")),
    "one epoch, top 3": Peer(None, _one_epoch),
}

UNAVAILABLE = {
    "ifBO (FT-PFN), neural-pipeline-search": (
        "its model's weights are downloaded at run time (the ifbo package fetches them from "
        "figshare), which this machine cannot reach; and neural-pipeline-search 0.17 needs "
        "pandas < 3, while elastune's tested set has pandas 3.1 (MLflow's)"
    ),
    "DyHPO, DPL": (
        "neural-pipeline-search 0.17 no longer ships them; Syne Tune's DyHPO was in 0.14 "
        "and earlier, which need numpy < 1.27 (elastune needs numpy >= 2.4)"
    ),
}


def missing(peer: Peer) -> str | None:
    """Why ``peer`` cannot run here (its library is not installed), or None."""
    if peer.library is None or importlib.util.find_spec(peer.library) is not None:
        return None
    return f"its library ({peer.library}) is not installed: pip install -e '.[bench]'"
