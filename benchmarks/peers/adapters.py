"""Two adapters that run a peer tuner's own ask/tell interface inside elastune's simulated
clock, as an elastune :class:`~elastune.planners.search.Scheduler`: the simulator hands out
their segments to its workers and delivers the results in simulated-time order, exactly as
it does for elastune's own schedulers.

- :class:`Restarting`: a peer that evaluates (configuration, fidelity) pairs (DEHB, SMAC3's
  Hyperband). Each ask is a new trial trained from scratch to its fidelity: a configuration
  the peer promotes to a higher fidelity is trained again from epoch 0, and pays for it.
- :class:`Continuing`: a peer that decides, trial by trial, whether a running trial goes on
  (Optuna's pruners, Syne Tune's ASHA and BOHB). A trial trains from one of ``levels`` to
  the next; every epoch's value is reported to the peer in order, and the trial continues
  from where it stopped while the peer says so.

Peers minimise the validation error; the adapters hand them ``error(loss)`` of each
result (elastune's loss is the negated metric).

Example (a peer that asks for configuration ``x`` at 1, then 3 epochs, from scratch):
    >>> class Peer:
    ...     def __init__(self): self.asked, self.told = 0, []
    ...     def ask(self):
    ...         self.asked += 1
    ...         return Ask({"x": 0.5}, 1 if self.asked == 1 else 3, self.asked)
    ...     def tell(self, token, error, seconds): self.told.append((token, error))
    >>> peer = Peer()
    >>> restarting = Restarting(peer, max_resource=3, error=lambda loss: -loss)
    >>> first, second = restarting.next_segment(), restarting.next_segment()
    >>> (first.trial, first.start, first.stop), (second.trial, second.start, second.stop)
    ((0, 0, 1), (1, 0, 3))
    >>> [d.action.value for d in restarting.on_result(Result(1, 3, -0.9))], peer.told
    (['complete'], [(2, 0.9)])
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from elastune.planners.search.schedulers.base import (
    Action,
    Decision,
    Result,
    Scheduler,
    Segment,
    TrialCounter,
)


@dataclass(frozen=True)
class Ask:
    """What a restarting peer asked for: a configuration, its epochs, and the peer's own
    handle to tell the result back with."""

    config: Mapping[str, Any]
    epochs: int
    token: Any


class RestartingPeer(Protocol):
    def ask(self) -> Ask: ...

    def tell(self, token: Any, error: float, seconds: float) -> None: ...


class ContinuingPeer(Protocol):
    def start(self) -> tuple[Mapping[str, Any], Any]:
        """A new trial's configuration and the peer's handle on it."""

    def report(self, token: Any, epoch: int, error: float) -> bool:
        """One epoch's validation error; False stops the trial for good."""

    def complete(self, token: Any, epoch: int, error: float) -> None:
        """The trial reached the top fidelity."""


class Restarting(Scheduler):
    """A peer that trains each (configuration, fidelity) it asks for from scratch."""

    def __init__(self, peer: RestartingPeer, max_resource: int, error: Callable[[float], float]):
        self.peer, self.max_resource, self.error = peer, max_resource, error
        self._counter = TrialCounter()
        self._tokens: dict[int, Any] = {}

    def next_segment(self) -> Segment | None:
        ask = self.peer.ask()
        epochs = min(max(1, ask.epochs), self.max_resource)
        trial = self._counter.new()
        self._tokens[trial] = ask.token
        return Segment(trial, 0, epochs, 0, config=ask.config)

    def on_result(self, result: Result) -> list[Decision]:
        token = self._tokens.pop(result.trial)
        error = self.error(result.loss) if math.isfinite(result.loss) else math.inf
        self.peer.tell(token, error, result.seconds)
        if result.failed:
            return [Decision(result.trial, Action.FAIL, 0)]
        done = Action.COMPLETE if result.resource >= self.max_resource else Action.STOP
        return [Decision(result.trial, done, 0)]


class Continuing(Scheduler):
    """A peer that trains each trial on until it stops it; segments end at ``levels``."""

    def __init__(
        self, peer: ContinuingPeer, levels: Sequence[int], error: Callable[[float], float]
    ):
        self.peer, self.levels, self.error = peer, sorted(set(levels)), error
        self._counter = TrialCounter()
        self._tokens: dict[int, Any] = {}
        self._level: dict[int, int] = {}
        self._continuing: deque[int] = deque()

    def next_segment(self) -> Segment | None:
        if self._continuing:
            trial = self._continuing.popleft()
            k = self._level[trial] = self._level[trial] + 1
            return Segment(trial, self.levels[k - 1], self.levels[k], k)
        config, token = self.peer.start()
        trial = self._counter.new()
        self._tokens[trial], self._level[trial] = token, 0
        return Segment(trial, 0, self.levels[0], 0, config=config)

    def on_result(self, result: Result) -> list[Decision]:
        trial, k = result.trial, self._level[result.trial]
        if result.failed:
            return [Decision(trial, Action.FAIL, k)]
        token = self._tokens[trial]
        *inside, (epoch, loss) = (*result.history, (result.resource, result.loss))
        for step, value in inside:
            if not self.peer.report(token, round(step), self.error(value)):
                return [Decision(trial, Action.STOP, k)]  # a peer that cuts between levels
        if round(epoch) >= self.levels[-1]:
            self.peer.complete(token, round(epoch), self.error(loss))
            return [Decision(trial, Action.COMPLETE, k)]
        if not self.peer.report(token, round(epoch), self.error(loss)):
            return [Decision(trial, Action.STOP, k)]
        self._continuing.append(trial)
        return [Decision(trial, Action.PROMOTE, k)]
