"""Asynchronous successive halving with promotion (docs/algorithms.md §3), and asynchronous
Hyperband when it runs several brackets (§3.4).

Promotion-type, as in the paper: a trial trains to its rung and waits there (PAUSE). When a
worker is free, :meth:`Asha.next_segment` promotes the best trial that sits in the top
``1/eta`` of its rung and has not been promoted yet, preferring higher rungs; the promoted
trial resumes from its checkpoint with ``Segment(start=r_k, stop=r_(k+1))``. Only when
nothing is promotable does a new trial start at rung 0.

Each rung keeps its results in two heaps (its current top ``floor(n/eta)`` and the rest)
plus a heap of top members not yet promoted, so a promotion costs ``O(log n)`` however many
trials the rung holds: 100,000 trials stay cheap.

Example (the worked trace of §3.3, one worker):
    >>> asha = Asha(1, 9, 3)
    >>> loss = dict(enumerate([.50, .40, .60, .30, .55, .45, .35, .70, .20]))
    >>> order = []
    >>> for _ in range(15):
    ...     job = asha.next_segment()
    ...     order.append(f"c{job.trial + 1}@{job.stop}")
    ...     _ = asha.on_result(Result(job.trial, job.stop, loss[job.trial] - .02 * job.rung))
    >>> " ".join(order)
    'c1@1 c2@1 c3@1 c2@3 c4@1 c4@3 c5@1 c6@1 c7@1 c7@3 c4@9 c8@1 c9@1 c9@3 c9@9'
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from elastune.planners.search.schedulers.base import (
    Action,
    Decision,
    Result,
    Scheduler,
    Segment,
    TrialCounter,
    check_max_trials,
    rank_key,
)
from elastune.planners.spec.geometry import hyperband_trials, ladder_depth, rung_levels

# (not finite, loss, arrival): NaN and inf rank last, ties go to the earlier arrival (§3.6.5).
ArrivalKey = tuple[bool, float, int]


def _key(loss: float, arrival: int) -> ArrivalKey:
    return (*rank_key(loss), arrival)


def _flip(key: ArrivalKey) -> ArrivalKey:
    """Reverse the order (and back again): heapq is a min-heap, the top set needs its worst
    member first."""
    return (not key[0], -key[1], -key[2])


@dataclass
class RungResults:
    """Results at one rung, split into the current top ``floor(n/eta)`` and the rest."""

    eta: int
    n: int = 0
    top: list[tuple[ArrivalKey, int]] = field(default_factory=list)  # worst first
    rest: list[tuple[ArrivalKey, int]] = field(default_factory=list)  # best first
    in_top: set[int] = field(default_factory=set)
    candidates: list[tuple[ArrivalKey, int]] = field(
        default_factory=list
    )  # unpromoted, maybe stale
    promoted: set[int] = field(default_factory=set)
    keys: dict[int, ArrivalKey] = field(default_factory=dict)

    def add(self, trial: int, loss: float) -> None:
        key = _key(loss, self.n)
        self.n += 1
        self.keys[trial] = key
        if self.top and key < _flip(self.top[0][0]):
            self._push_top(key, trial)
        else:
            heapq.heappush(self.rest, (key, trial))
        quota = self.n // self.eta
        while len(self.top) > quota:
            negated, moved = heapq.heappop(self.top)
            self.in_top.discard(moved)
            heapq.heappush(self.rest, (_flip(negated), moved))
        while len(self.top) < quota and self.rest:
            self._push_top(*heapq.heappop(self.rest))

    def _push_top(self, key: ArrivalKey, trial: int) -> None:
        heapq.heappush(self.top, (_flip(key), trial))
        self.in_top.add(trial)
        if trial not in self.promoted:
            heapq.heappush(self.candidates, (key, trial))

    def candidate(self) -> int | None:
        """The best trial in the top set that has not been promoted, if any."""
        while self.candidates:
            trial = self.candidates[0][1]
            if trial in self.in_top and trial not in self.promoted:
                return trial
            heapq.heappop(self.candidates)  # left the top set, or already promoted
        return None


class AsyncBracket:
    """One ASHA bracket with early-stopping rate ``s``: its rungs and who waits where."""

    def __init__(self, s: int, levels: list[float], eta: int, bootstrap_count: int):
        self.s = s
        self.levels = levels
        self.rungs = [RungResults(eta) for _ in levels[:-1]]  # the top rung promotes no one
        self.bootstrap_count = bootstrap_count

    def promotion(self) -> tuple[int, int] | None:
        """``(trial, k)`` of the best promotable trial, highest rung first (§3.1)."""
        for k in range(len(self.rungs) - 1, -1, -1):
            rung = self.rungs[k]
            if rung.n < self.bootstrap_count:
                continue
            trial = rung.candidate()
            if trial is not None:
                return trial, k
        return None


def draw_bracket(
    brackets: list[AsyncBracket], weights: list[int], rng: random.Random
) -> AsyncBracket:
    """The bracket a new trial joins: drawn with Hyperband's weights (the only one, if one)."""
    if len(brackets) == 1:
        return brackets[0]
    return rng.choices(brackets, weights=weights)[0]


class Asha(Scheduler):
    """Promotion-type ASHA over ``brackets`` brackets (``brackets=1``: pure ``s=0``).

    Args:
        min_resource: Least resource at which trials are compared (rung 0 of ``s=0``).
        max_resource: Resource of the top rung; a trial that reaches it is complete.
        eta: Reduction factor, at least 2: each rung promotes its top ``1/eta``.
        max_trials: How many configurations to start in all; None starts new ones until
            the executor's deadline or budget ends the job.
        brackets: How many brackets, the most aggressive first (``s = 0..brackets-1``).
            A new trial picks its bracket at random with Optuna's ``HyperbandPruner``
            weights (the size of that Hyperband bracket), from a generator seeded by
            ``seed``, so equal seeds give equal runs (§3.4).
        bootstrap_count: No promotion out of a rung until it holds this many results; it
            curbs mis-promotions in small jobs (§3.6.1).
        seed: Seed of the bracket draw.
    """

    def __init__(
        self,
        min_resource: float,
        max_resource: float,
        eta: int,
        max_trials: int | None = None,
        brackets: int = 1,
        bootstrap_count: int = 0,
        seed: int = 0,
    ):
        s_max = ladder_depth(min_resource, max_resource, eta)
        if not 1 <= brackets <= s_max + 1:
            raise ValueError(
                f"brackets must lie in 1..{s_max + 1} (one per rung of the ladder), got {brackets}"
            )
        check_max_trials(max_trials)
        if bootstrap_count < 0:
            raise ValueError(f"bootstrap_count must be >= 0, got {bootstrap_count}")
        self.max_trials = max_trials
        self.brackets = [
            AsyncBracket(s, rung_levels(min_resource, max_resource, eta, s), eta, bootstrap_count)
            for s in range(brackets)
        ]
        self._weights = [hyperband_trials(s, s_max, eta) for s in range(brackets)]
        self._rng = random.Random(seed)
        self._counter = TrialCounter()
        self._where: dict[int, tuple[AsyncBracket, int]] = {}  # trial -> (bracket, rung trained to)
        self._paused: set[int] = set()

    @property
    def started(self) -> int:
        return self._counter.next_id

    def next_segment(self) -> Segment | None:
        best: tuple[float, int, int, AsyncBracket] | None = None
        for bracket in self.brackets:
            found = bracket.promotion()
            if found is not None:
                trial, k = found
                target = bracket.levels[k + 1]
                # Across brackets too, the promotion to the highest resource goes first.
                if best is None or target > best[0]:
                    best = (target, trial, k, bracket)
        if best is not None:
            _, trial, k, bracket = best
            bracket.rungs[k].promoted.add(trial)
            self._paused.discard(trial)
            self._where[trial] = (bracket, k + 1)
            return Segment(trial, bracket.levels[k], bracket.levels[k + 1], k + 1, bracket.s)
        if self.max_trials is not None and self.started >= self.max_trials:
            return None
        bracket = self._draw_bracket()
        trial = self._counter.new()
        self._where[trial] = (bracket, 0)
        return Segment(trial, 0, bracket.levels[0], 0, bracket.s)

    def _draw_bracket(self) -> AsyncBracket:
        return draw_bracket(self.brackets, self._weights, self._rng)

    def on_result(self, result: Result) -> list[Decision]:
        bracket, k = self._where[result.trial]
        if result.failed:
            return [Decision(result.trial, Action.FAIL, k)]  # never enters a rung
        if k == len(bracket.levels) - 1:
            return [Decision(result.trial, Action.COMPLETE, k)]
        bracket.rungs[k].add(result.trial, result.loss)
        self._paused.add(result.trial)
        return [Decision(result.trial, Action.PAUSE, k)]

    def finish(self) -> list[Decision]:
        """Trials still waiting at a rung are stopped for good."""
        decisions = [
            Decision(trial, Action.STOP, self._where[trial][1]) for trial in sorted(self._paused)
        ]
        self._paused.clear()
        return decisions
